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
        # soft_wrap: a long path must stay on one line so that it can be copied and grepped
        err_console.print(
            f"[bold red]error:[/] {escape(str(e))}", markup=True, highlight=False, soft_wrap=True
        )
        raise typer.Exit(2) from None


def guarded(fn: Callable[[], T]) -> T:
    with user_errors():
        return fn()
