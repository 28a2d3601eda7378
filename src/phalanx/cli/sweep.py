"""`phalanx sweep`: one trace over profiles x loads x seeds x clusters, on every core or on Dask."""

from __future__ import annotations

from importlib import resources, util
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from phalanx.cli import options as opt
from phalanx.cli.errors import user_errors
from phalanx.cli.simulate import check_out
from phalanx.core.errors import SpecError
from phalanx.sim.bench import parse_seeds
from phalanx.sim.clusters import tiresias_16xv100
from phalanx.sim.inputs import cluster_arg, default_cluster, detect_format, load_jobs
from phalanx.sim.jobs import never_fit
from phalanx.sim.sweep import Knobs, Sweep, Variant
from phalanx.sim.traces import tiresias

DEFAULT_PROFILES = "phalanx,fifo,k8s-default"
DEFAULT_QUEUE_PROFILES = "phalanx-queues,phalanx,fifo"
DEFAULT_CACHE = Path.home() / ".cache" / "phalanx" / "sweep"


def sweep(
    trace: opt.Trace = None,
    cluster: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="<file|name>",
            help="A cluster to replay on (a file or a built-in name); give it again for more variants "
            "(default: the one the trace was published with).",
        ),
    ] = None,
    profiles: Annotated[
        str | None, typer.Option(help="Comma-separated profiles (default: phalanx,fifo,k8s-default).")
    ] = None,
    loads: Annotated[
        str,
        typer.Option(
            help="Comma-separated loads (arrival rate x the trace's; default 1,2, with --capture 1)."
        ),
    ] = "",
    seeds: Annotated[str, typer.Option(help="Seeds: 1-3 or 1,5,9 (the replays' random tie-breaks).")] = "1-3",
    first: Annotated[int, typer.Option(help="Only the first N jobs of the trace (0: all).")] = 0,
    fmt: opt.TraceFormat = None,
    mapping: opt.ColumnMap = None,
    throughputs: opt.Throughputs = None,
    durations: opt.Durations = None,
    workers: Annotated[
        int, typer.Option(help="Processes (or Dask workers with --dask local); 0: every core.")
    ] = 0,
    dask: Annotated[
        str,
        typer.Option(
            help="Run on Dask: 'local' starts a cluster here on loopback; an address "
            "(tcp://scheduler:8786) uses one you run."
        ),
    ] = "",
    cache: Annotated[
        Path,
        typer.Option(help="Where results are kept by input digest: a re-run computes only what changed."),
    ] = DEFAULT_CACHE,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Compute every point, keep nothing.")] = False,
    capture: Annotated[
        Path | None,
        typer.Option(
            help="A file from `phalanx capture`: sweep the what-if replay of that cluster (its running "
            "and waiting work) instead of a trace; a load does not apply (every workload is there at start)."
        ),
    ] = None,
    scheduler_name: opt.CapturedSchedulerName = "default-scheduler",
    default_runtime: opt.DefaultRuntime = 3600.0,
    cycle_interval: opt.CycleInterval = 0.0,
    checkpoint_interval: opt.CheckpointInterval = 300.0,
    half_life: opt.HalfLife = 0.0,
    restart_cost: Annotated[
        float,
        typer.Option(help="Seconds of its GPUs an evicted run costs to start again (counted, in GPU-h)."),
    ] = 60.0,
    out: opt.OutDir = Path("sweep-out"),
) -> None:
    """Replay one trace over a grid of profiles, loads, seeds and clusters; one report compares them
    (sweep.csv, summary.csv with the spread over seeds, plots with bands, index.html in --out)."""
    console = Console(stderr=True)
    with user_errors():
        if workers < 0:
            raise SpecError("--workers", f"must be >= 0, got {workers}")
        if first < 0:
            raise SpecError("--first", f"must be >= 0, got {first}")
        if not restart_cost >= 0:
            raise SpecError("--restart-cost", f"must be >= 0 seconds, got {restart_cost}")
        if dask and util.find_spec("distributed") is None:
            raise SpecError("--dask", "needs Dask's distributed scheduler: pip install 'phalanx[sweep]'")
        if util.find_spec("matplotlib") is None:  # the report's plots, said before the replays run
            raise SpecError("matplotlib", "not installed; the report needs it: pip install 'phalanx[report]'")
        check_out(out)
        if not no_cache and cache.exists() and not cache.is_dir():
            raise SpecError("--cache", f"{cache} is a file; give a folder (it is created if missing)")
        load_list = _loads(loads or ("1" if capture is not None else "1,2"))
        seed_list = parse_seeds(seeds, "--seeds")
        if capture is not None:
            if trace is not None or cluster:
                raise SpecError("--capture", "sweeps a captured cluster: drop --trace and --cluster")
            if load_list != [1.0]:
                raise SpecError("--loads", "a captured cluster's work is all there at start: no load applies")
            variants, notes, queued = _captured(capture, scheduler_name, default_runtime)
        else:
            variants, notes, queued = _variants(
                trace, cluster or [], fmt, mapping, throughputs, durations, first
            )
        names = [
            p.strip()
            for p in (profiles or (DEFAULT_QUEUE_PROFILES if queued else DEFAULT_PROFILES)).split(",")
        ]
        s = Sweep(
            variants,
            [n for n in names if n],
            load_list,
            seed_list,
            Knobs(cycle_interval, checkpoint_interval, half_life, restart_cost),
            cache=None if no_cache else cache,
            workers=workers,
            dask=dask,
        )
        for v in variants:  # a job no placement can ever hold waits to the end: said up front
            line = never_fit(v.jobs, v.nodes)
            if line:
                console.print(
                    f"[yellow]warning:[/] {escape(line)} ({v.name})", highlight=False, soft_wrap=True
                )
        total = len(s.points())
        where = f"Dask ({dask})" if dask else f"{workers or 'every'} local process(es)"
        console.print(f"{total} replays on {where}", highlight=False)
        with Progress(
            TextColumn("replays"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
        ) as bar:
            task = bar.add_task("sweep", total=total)
            rows = s.run(lambda done, _all, _cached: bar.update(task, completed=done))
        if s.cached:
            console.print(f"{s.cached} of {total} from the cache ({cache})", highlight=False)
        from phalanx.report.sweep import render  # matplotlib: loaded only by the commands that plot

        notes.append(
            f"Profiles {', '.join(s.profiles)}; loads {', '.join(f'{x:g}' for x in load_list)}; "
            f"seeds {', '.join(map(str, seed_list))}; run on {where}."
        )
        index = render(out, rows, "Phalanx sweep", notes)
    typer.echo(f"report: {index}")


def _loads(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise SpecError("--loads", f"{part.strip()!r} is not a number") from None
        if not v > 0:
            raise SpecError("--loads", f"a load must be > 0, got {part.strip()}")
        out.append(v)
    return out


def _captured(
    path: Path, scheduler_name: str, default_runtime: float
) -> tuple[list[Variant], list[str], bool]:
    """`--capture`: the captured cluster as `phalanx simulate --capture` replays it (`phalanx.cli.whatif`)."""
    if not default_runtime > 0:
        raise SpecError("--default-runtime", f"must be > 0 seconds, got {default_runtime}")
    from phalanx.cli.whatif import experiment
    from phalanx.k8s.config import AdapterConfig
    from phalanx.k8s.trial.capture import load as load_capture
    from phalanx.sim.runtime import RuntimeModel

    c = load_capture(path)
    exp, notes = experiment(
        c, AdapterConfig(scheduler_name=scheduler_name), [], default_runtime, RuntimeModel(), 0
    )
    if not exp.jobs:
        raise SpecError("--capture", f"no workload of {scheduler_name!r} in {path} (--scheduler-name?)")
    v = Variant("capture", exp.nodes, exp.jobs, exp.topology_levels, exp.datasets, exp.queues)
    return [v], notes, exp.queues is not None


def _variants(
    trace: Path | None,
    clusters: list[Path],
    fmt: str | None,
    mapping: str | None,
    throughputs: Path | None,
    durations: Path | None,
    first: int,
) -> tuple[list[Variant], list[str], bool]:
    """The trace's jobs on each cluster; the notes; whether a cluster brings queues."""
    if trace is None:
        if clusters:
            raise SpecError("--cluster", "needs --trace: the embedded trace brings its own cluster")
        path = Path(str(resources.files("phalanx.data") / "tiresias-60job.csv"))
        jobs = tiresias.load_jobs(path)[: first or None]
        nodes, levels = tiresias_16xv100()
        note = "Embedded default: the Tiresias 60-job trace on 16 V100 GPUs (src/phalanx/data/README.md)."
        return (
            [Variant("tiresias-16xV100", nodes, jobs, levels)],
            [note],
            False,
        )
    kind = fmt or ("csv" if mapping else detect_format(trace))
    if kind == "openb":
        raise SpecError("--trace", "an openb pod list is the FGD protocol's input: use phalanx simulate")
    jobs = load_jobs(trace, kind, mapping, throughputs, durations)
    jobs = sorted(jobs, key=lambda j: j.submit)[: first or None]
    out = []
    chosen: list[Path | None] = [*clusters] or [None]
    for c in chosen:
        cl = cluster_arg(c) if c is not None else default_cluster(kind, trace)
        name = cl.source if c is None or not c.is_file() else c.stem
        out.append(Variant(name, cl.nodes, jobs, cl.levels, cl.datasets, cl.queues))
    notes = [f"Trace {trace} ({kind}, {len(jobs)} jobs); clusters: {', '.join(v.name for v in out)}."]
    return out, notes, any(v.queues is not None for v in out)


__all__ = ["sweep"]
