"""`phalanx`: schedule, simulate, benchmark, run in Kubernetes."""

from __future__ import annotations

import typer

from phalanx.cli.bench import bench_app
from phalanx.cli.cache import cache
from phalanx.cli.capture import capture
from phalanx.cli.kube import dashboard, demo, scheduler, status
from phalanx.cli.node import node_app
from phalanx.cli.schedule import schedule
from phalanx.cli.simulate import simulate
from phalanx.cli.webhook import webhook

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Phalanx: a scheduler for AI workloads on Kubernetes."
)
app.command("schedule")(schedule)
app.command("simulate")(simulate)
app.add_typer(bench_app, name="bench")
app.command("scheduler")(scheduler)
app.command("status")(status)
app.command("demo")(demo)
app.command("dashboard")(dashboard)
app.add_typer(node_app, name="node")
app.command("webhook")(webhook)
app.command("cache")(cache)
app.command("capture")(capture)


@app.callback()
def _root() -> None:
    """Phalanx: a scheduler for AI workloads on Kubernetes."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
