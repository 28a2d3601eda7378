"""`phalanx scenario FILE`: run a scenario YAML (cluster, workloads, profile, steps with
expectations, as in tests/scenarios), print its decisions and check its expectations.

Exit 0 when every expectation holds, 1 when one fails, 2 on bad input: a scenario can then be
a check in a script or CI, the way the tests use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from phalanx.cli.errors import user_errors
from phalanx.cli.schedule import print_tables
from phalanx.core.decisions import Bind, CycleResult
from phalanx.spec.scenario import load_scenario, run_scenario


def scenario(
    file: Annotated[Path, typer.Argument(help="Scenario YAML (cluster, workloads, profile, steps).")],
) -> None:
    """Run a scenario file: print the placements and pending reasons, and check its expectations."""
    binds: list[Bind] = []
    cycles = 0

    def seen(result: CycleResult) -> None:
        nonlocal cycles
        cycles += 1
        binds.extend(result.binds)

    with user_errors():
        sc = load_scenario(file)
        failures = run_scenario(sc, seen)
    print_tables(sc.profile, cycles, binds, sc.last.pending)
    checked = sum(
        len(s.expect.bound) + len(s.expect.pending) + len(s.expect.nodes) for s in sc.steps if s.expect
    )
    for f in failures:
        typer.echo(f"FAILED: {file}: {f}")
    if failures:
        typer.echo(f"{len(failures)} of {checked} expectation(s) failed")
        raise typer.Exit(1)
    typer.echo(f"all {checked} expectation(s) hold")
