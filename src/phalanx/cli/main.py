"""`phalanx`: schedule, simulate, benchmark, run in Kubernetes."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer
import typer.core

from phalanx.cli.bench import bench_app
from phalanx.cli.cache import cache
from phalanx.cli.capture import capture
from phalanx.cli.distcache import distcache
from phalanx.cli.kube import dashboard, demo, scheduler, status
from phalanx.cli.node import node_app
from phalanx.cli.scenario import scenario
from phalanx.cli.schedule import schedule
from phalanx.cli.simulate import simulate
from phalanx.cli.sweep import sweep
from phalanx.cli.webhook import webhook


def _flags_without_a_type() -> None:
    """typer 0.29 shows `<bool>` after every flag (`--json <bool>`, even `--help <bool>`), which
    reads as "give a value", and `--json true` is then refused: a flag takes no value, so its help
    shows none."""
    option = typer.core.TyperOption
    if not hasattr(option, "display_type_rich"):  # older typer: nothing to hide
        return
    shown = option.display_type_rich

    def display_type_rich(self: typer.core.TyperOption, ctx: Any) -> str | None:  # ctx: typer's own click
        return None if self.is_flag and not self.count else shown(self, ctx)

    option.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_without_a_type()

app = typer.Typer(no_args_is_help=True, help="Phalanx: a scheduler for AI workloads on Kubernetes.")
app.command("schedule")(schedule)
app.command("simulate")(simulate)
app.command("sweep")(sweep)
app.command("scenario")(scenario)
app.add_typer(bench_app, name="bench")
app.command("scheduler")(scheduler)
app.command("status")(status)
app.command("demo")(demo)
app.command("dashboard")(dashboard)
app.add_typer(node_app, name="node")
app.command("webhook")(webhook)
app.command("cache")(cache)
app.command("distcache")(distcache)
app.command("capture")(capture)


def _version() -> str:
    try:
        return version("phalanx")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _print_version(show: bool) -> None:
    if show:
        typer.echo(f"phalanx {_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Phalanx: a scheduler for AI workloads on Kubernetes."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
