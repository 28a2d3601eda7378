"""Turn bad input into one clear line and exit code 2, never a traceback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from phalanx.core.errors import SpecError

T = TypeVar("T")
err_console = Console(stderr=True)


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except SpecError as e:
        _say(str(e))
        raise typer.Exit(2) from None
    except UnicodeDecodeError:
        # a last resort: the readers name the file; one that does not still gets one line
        _say("a file given is not a text (UTF-8) file; give the trace, cluster or YAML file itself")
        raise typer.Exit(2) from None


def _say(message: str) -> None:
    # soft_wrap: a long path must stay on one line so that it can be copied and grepped
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)


def guarded(fn: Callable[[], T]) -> T:
    with user_errors():
        return fn()
