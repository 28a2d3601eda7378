"""`phalanx bench fgd` and `phalanx bench diff`: the FGD benchmark, and our CSV against the authors'."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from phalanx.cli.errors import user_errors
from phalanx.cli.tables import name_column, print_table
from phalanx.core.errors import SpecError
from phalanx.profiles import builtin_names, load_profile
from phalanx.sim.bench import (
    BenchJob,
    BenchRow,
    DiffRow,
    check_result_path,
    diff,
    label,
    parse_seeds,
    run_bench,
    workload_name,
    write_results,
)
from phalanx.sim.traces import openb

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks against published results.")


@bench_app.command("fgd")
def bench_fgd(
    nodes: Annotated[Path, typer.Option(help="openb node list CSV (e.g. openb_node_list_gpu_node.csv).")],
    pods: Annotated[list[Path], typer.Option(help="openb pod list CSV; repeat for several lists.")],
    policy: Annotated[list[str], typer.Option(help="Policy (profile) name; repeat for several.")],
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-51.")] = "42-51",
    tune: Annotated[float, typer.Option(help="Submit until tune x cluster GPU capacity.")] = 1.3,
    out: Annotated[Path, typer.Option(help="Result CSV (companions: *_frag.csv, *_frag_ratio.csv).")] = Path(
        "results.csv"
    ),
    workers: Annotated[int, typer.Option(help="Worker processes (default: CPU count).")] = 0,
) -> None:
    """Run the FGD protocol and write rows in the schema of the authors' analysis_allo_discrete.csv."""
    with user_errors():
        for p in policy:
            load_profile(p)
        seed_list = parse_seeds(seeds)
        for f in [nodes, *pods]:
            if not f.is_file():
                raise SpecError(str(f), "no such file")
        # read once here, so that a bad file is one line before the progress bar, not beside it
        openb.load_nodes(nodes)
        for f in pods:
            openb.load_pods(f)
        if not 0 < tune <= 10:
            raise SpecError("--tune", f"must be in (0, 10], got {tune}")
        check_result_path(out, "--out")  # before the runs, not after them
    jobs = [BenchJob(str(nodes), str(p), pol, s, tune) for p in pods for pol in policy for s in seed_list]
    n_workers = workers or os.cpu_count() or 1
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]fgd bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        task = bar.add_task("runs", total=len(jobs))

        def done(row: BenchRow) -> None:
            bar.advance(task)

        with user_errors():
            rows = run_bench(jobs, n_workers, done)
    with user_errors():
        paths = write_results(rows, out, "--out")
    t = Table(title="GPU allocation (%), mean over seeds")
    for col in ("workload", "policy"):
        name_column(t, col)
    for col in ("x=100", "x=130", "failed pods"):
        t.add_column(col)
    groups: dict[tuple[str, str], list[BenchRow]] = {}
    for r in rows:
        groups.setdefault((workload_name(r.job.pods), label(r.job.policy)), []).append(r)
    for (w, p), rs in groups.items():
        t.add_row(w, p, _mean(rs, 100), _mean(rs, 130), f"{sum(r.failed for r in rs) / len(rs):.0f}")
    print_table(t)
    typer.echo("wrote " + ", ".join(str(p) for p in paths))


def _both(r: DiffRow, x: int) -> bool:
    return not math.isnan(r.ours[x]) and not math.isnan(r.theirs[x])


def _mean(rows: list[BenchRow], x: int) -> str:
    vals = [r.alloc[x] for r in rows if x in r.alloc]
    return f"{sum(vals) / len(vals):.2f}" if vals else "-"


@bench_app.command("diff")
def bench_diff(
    ours: Annotated[Path, typer.Argument(help="Our CSV (from `phalanx bench fgd`).")],
    theirs: Annotated[Path, typer.Argument(help="The authors' CSV in the same schema.")],
    at: Annotated[str, typer.Option(help="x values (arrived GPU, % of capacity).")] = "50,90,100,130",
    tolerance: Annotated[float, typer.Option(help="Flag differences larger than this (points).")] = 0.5,
) -> None:
    """Mean over seeds of ours vs theirs, point by point."""
    with user_errors():
        try:
            xs = [int(x) for x in at.split(",")]
        except ValueError:
            raise SpecError("--at", f"expected integers like 50,90,100,130; got {at!r}") from None
        rows = diff(ours, theirs, xs)
        if not any(_both(r, x) for r in rows for x in xs):
            raise SpecError(
                f"{ours} vs {theirs}",
                f"they share no points (no workload and policy of ours has a value at x={at} in theirs)",
            )
    # one row per point, ours, theirs and delta each in a column: an 80-column terminal never
    # stacks them (a cell 'ours / theirs / delta' per x did, over three lines)
    t = Table(title=f"{ours.name} vs {theirs.name} (mean over seeds, GPU allocation %)")
    name_column(t, "workload")
    name_column(t, "policy")
    for col in ("seeds", "x", "ours", "theirs", "delta"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        for k, x in enumerate(xs):
            a, b = r.ours[x], r.theirs[x]
            d = a - b
            mark = "[red]" if abs(d) > tolerance else ""
            t.add_row(
                r.workload,
                r.policy,
                str(r.seeds),
                str(x),
                _num(a),
                _num(b),
                "-" if math.isnan(d) else f"{mark}{d:+.2f}",
                end_section=k == len(xs) - 1,
            )
    print_table(t)


def _num(v: float) -> str:
    """A point missing on one side: '-', not 'nan'."""
    return "-" if math.isnan(v) else f"{v:.2f}"


__all__ = ["bench_app", "builtin_names"]
