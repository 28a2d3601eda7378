"""`phalanx simulate`: replay a trace through the scheduling core and compare profiles."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources, util
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phalanx.cli import options as opt
from phalanx.cli.errors import user_errors
from phalanx.cli.tables import name_column, print_table
from phalanx.core.errors import SpecError
from phalanx.core.model import Node
from phalanx.profiles import load_profile
from phalanx.sim.bench import parse_seeds, read_table, workload_name
from phalanx.sim.clusters import tiresias_16xv100
from phalanx.sim.experiment import FgdExperiment, ReplayExperiment
from phalanx.sim.inputs import cluster_arg, default_cluster, detect_format, load_jobs
from phalanx.sim.jobs import never_fit
from phalanx.sim.replay import NodeOutage
from phalanx.sim.runtime import RuntimeModel, load_runtime
from phalanx.sim.sweep import at_load
from phalanx.sim.traces import openb, tiresias
from phalanx.sim.traces.rows import read_rows

DEFAULT_FGD_PROFILES = "phalanx,fgd,bestfit,random"
DEFAULT_REPLAY_PROFILES = "phalanx,fifo,k8s-default"
DEFAULT_QUEUE_PROFILES = "phalanx-queues,phalanx,fifo,k8s-default"


embedded_replay_cluster = tiresias_16xv100  # the Tiresias replay's cluster when no --cluster is given


def _data(name: str) -> Path:
    return Path(str(resources.files("phalanx.data") / name))


def _outages(path: Path | None, nodes: list[Node]) -> list[NodeOutage]:
    """The outage CSV, checked against the cluster up front: an unknown node is named with its
    file:line here, not as a lookup failure somewhere in the middle of the replay."""
    if path is None:
        return []
    names = {n.name for n in nodes}
    out = []
    for row in read_rows(path, ("node", "start", "end")):
        start, end = row.float("start"), row.float("end")
        if end <= start:
            raise SpecError(row.where, f"outage end {end} must be after start {start}")
        node = row.text("node")
        if node not in names:
            some = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
            raise SpecError(row.where, f"unknown node {node!r} (the cluster's {len(names)} nodes: {some})")
        out.append(NodeOutage(node, start, end))
    return out


def simulate(
    trace: opt.Trace = None,
    cluster: opt.Cluster = None,
    profiles: opt.Profiles = None,
    seed: opt.Seeds = "",
    out: opt.OutDir = Path("out"),
    fmt: opt.TraceFormat = None,
    mapping: opt.ColumnMap = None,
    tune: opt.Tune = 1.3,
    load: opt.Load = 1.0,
    runtime: opt.RuntimeYaml = None,
    no_spread: opt.NoSpread = False,
    no_cache: opt.NoCache = False,
    no_sharing: opt.NoSharing = False,
    cycle_interval: opt.CycleInterval = 0.0,
    outages: opt.Outages = None,
    checkpoint_interval: opt.CheckpointInterval = 300.0,
    half_life: opt.HalfLife = 0.0,
    throughputs: opt.Throughputs = None,
    durations: opt.Durations = None,
    eta_every: opt.EtaEvery = -1,
    fgd_results: opt.FgdResults = None,
    data_cache: opt.DataCacheMode = "off",
    capture: opt.CaptureFile = None,
    scheduler_name: opt.CapturedSchedulerName = "default-scheduler",
    default_runtime: opt.DefaultRuntime = 3600.0,
) -> None:
    """Replay a trace and compare profiles: metrics.csv, decisions.jsonl, plots and index.html in --out."""
    console = Console(stderr=True)
    with user_errors():
        seeds = parse_seeds(seed or ("42-51" if trace is None else "42"), "--seed")
        _check_numbers(load, tune, eta_every, checkpoint_interval, half_life, cycle_interval)
        modes = _cache_modes(data_cache)
        check_out(out)
        if util.find_spec("matplotlib") is None:  # the report's plots
            raise SpecError("matplotlib", "not installed; the report needs it: pip install 'phalanx[report]'")
        rt = RuntimeModel(
            load_runtime(runtime, {"spread": no_spread, "cache": no_cache, "sharing": no_sharing})
        )
        k = _Knobs(
            profiles,
            seeds,
            tune,
            load,
            rt,
            cycle_interval,
            outages,
            checkpoint_interval,
            half_life,
            eta_every,
        )
        fgd_exps: list[FgdExperiment] = []
        rep_exps: list[ReplayExperiment] = []
        if trace is None:  # the embedded example or --capture: no trace for these to go with
            _only_with_kind(None, throughputs, durations, fgd_results)
        if capture is not None:
            if trace is not None or cluster is not None:
                raise SpecError("--capture", "replays a captured cluster: drop --trace and --cluster")
            exp, notes = _capture_experiment(capture, scheduler_name, default_runtime, profiles, rt, seeds[0])
            rep_exps.append(exp)
        elif trace is None:
            if cluster is not None:
                raise SpecError(
                    "--cluster",
                    "needs --trace: the embedded example brings its own (openb-slice, tiresias-16xV100)",
                )
            notes = _embedded(k, fgd_exps, rep_exps)
        else:
            source = _TraceSource(trace, cluster, fmt, mapping, throughputs, durations, fgd_results)
            notes = _from_trace(source, k, modes, fgd_exps, rep_exps)
        _run(out, fgd_exps, rep_exps, console)
        if capture is not None:
            from phalanx.cli.whatif import fragmentation

            frag = ", ".join(f"{p} {v:.1f} %" for p, v in fragmentation(rep_exps[0]).items())
            notes.append(f"Idle GPU fragmented (FGD's definition), mean over the replay's time: {frag}.")
        from phalanx.report.render import render  # matplotlib: loaded only by the commands that plot

        index = render(out, fgd_exps, rep_exps, "Phalanx simulation", notes)
    _print(fgd_exps, rep_exps)
    if capture is not None:
        typer.echo(notes[-1])
    typer.echo(f"report: {index}")


@dataclass(frozen=True)
class _Knobs:
    """The options every experiment of one `simulate` call shares, checked."""

    profiles: str | None
    seeds: list[int]
    tune: float
    load: float
    runtime: RuntimeModel
    cycle_interval: float
    outages: Path | None
    checkpoint_interval: float
    half_life: float
    eta_every: int


@dataclass(frozen=True)
class _TraceSource:
    """--trace and the options that say how to read it and which cluster it runs on."""

    trace: Path
    cluster: Path | None
    fmt: str | None
    mapping: str | None
    throughputs: Path | None
    durations: Path | None
    fgd_results: Path | None


def _embedded(k: _Knobs, fgd_exps: list[FgdExperiment], rep_exps: list[ReplayExperiment]) -> list[str]:
    """No --trace: the FGD protocol on the openb slice and the Tiresias 60-job replay; the notes."""
    notes = [
        "Embedded default: every 8th node and pod of the openb (Alibaba 2023, FGD) default lists, "
        "and the Tiresias 60-job trace on 16 V100 GPUs; the FGD protocol over seeds 42-51. "
        "See src/phalanx/data/README.md."
    ]
    nodes = openb.load_nodes(_data("openb-slice-nodes.csv"))
    pods = openb.load_pods(_data("openb-slice-pods.csv"))
    fgd_exps.append(
        FgdExperiment(
            name="openb-slice",
            nodes=nodes,
            pods=pods,
            profiles=_profiles(k.profiles, DEFAULT_FGD_PROFILES),
            seeds=k.seeds,
            tune=k.tune,
        )
    )
    rnodes, levels = embedded_replay_cluster()
    jobs = tiresias.load_jobs(_data("tiresias-60job.csv"))
    rep_exps.append(
        ReplayExperiment(
            name="tiresias-60job",
            nodes=rnodes,
            jobs=at_load(jobs, k.load),
            profiles=_profiles(k.profiles, DEFAULT_REPLAY_PROFILES),
            topology_levels=levels,
            datasets={},
            runtime=k.runtime,
            seed=k.seeds[0],
            cycle_interval=k.cycle_interval,
            outages=_outages(k.outages, rnodes),
            queues=None,
            checkpoint_interval=k.checkpoint_interval,
            half_life=k.half_life,
            eta_every=k.eta_every,
        )
    )
    return notes


def _from_trace(
    src: _TraceSource,
    k: _Knobs,
    modes: list[str],
    fgd_exps: list[FgdExperiment],
    rep_exps: list[ReplayExperiment],
) -> list[str]:
    """--trace: the FGD protocol for an openb pod list, else a time replay per --data-cache mode;
    the notes."""
    trace, cluster = src.trace, src.cluster
    kind = src.fmt or ("csv" if src.mapping else detect_format(trace))
    cl = cluster_arg(cluster) if cluster else default_cluster(kind, trace)
    _only_with_kind(kind, src.throughputs, src.durations, src.fgd_results)
    notes = [f"Trace {trace} ({kind}); cluster {cl.source}."]
    if kind == "openb":
        pods = openb.load_pods(trace)
        full = cluster is None or cluster.name == "openb_node_list_gpu_node.csv"
        if src.fgd_results is not None:
            _check_fgd_results(src.fgd_results, workload_name(trace), full)
        ref = src.fgd_results or _authors_results(trace)
        fgd_exps.append(
            FgdExperiment(
                name=workload_name(trace),
                nodes=cl.nodes,
                pods=pods,
                profiles=_profiles(k.profiles, DEFAULT_FGD_PROFILES),
                seeds=k.seeds,
                tune=k.tune,
                reference=ref if full else None,
            )
        )
        return notes
    jobs = load_jobs(trace, kind, src.mapping, src.throughputs, src.durations)
    default = DEFAULT_REPLAY_PROFILES if cl.queues is None else DEFAULT_QUEUE_PROFILES
    for mode in modes:
        rep_exps.append(
            ReplayExperiment(
                name=trace.stem + (f" (data cache: {mode})" if mode else ""),
                nodes=cl.nodes,
                jobs=at_load(jobs, k.load),
                profiles=_profiles(k.profiles, default),
                topology_levels=cl.levels,
                datasets=cl.datasets,
                runtime=k.runtime,
                seed=k.seeds[0],
                cycle_interval=k.cycle_interval,
                outages=_outages(k.outages, cl.nodes),
                queues=cl.queues,
                checkpoint_interval=k.checkpoint_interval,
                half_life=k.half_life,
                eta_every=k.eta_every,
                data_cache=mode,
            )
        )
    return notes


def _capture_experiment(
    capture: Path,
    scheduler_name: str,
    default_runtime: float,
    profiles: str | None,
    rt: RuntimeModel,
    seed: int,
) -> tuple[ReplayExperiment, list[str]]:
    """--capture: the captured cluster as a what-if replay (`phalanx.cli.whatif`), and its notes."""
    if not default_runtime > 0:
        raise SpecError("--default-runtime", f"must be > 0 seconds, got {default_runtime}")
    from phalanx.cli.whatif import experiment
    from phalanx.k8s.config import AdapterConfig
    from phalanx.k8s.trial.capture import load as load_capture
    from phalanx.k8s.trial.collector import collector_paused

    with collector_paused():  # two worlds of the captured cluster built: bounded work
        c = load_capture(capture)
        cfg = AdapterConfig(scheduler_name=scheduler_name)
        probe, _ = experiment(c, cfg, [], default_runtime, rt, seed)
        default = DEFAULT_REPLAY_PROFILES if probe.queues is None else DEFAULT_QUEUE_PROFILES
        exp, more = experiment(c, cfg, _profiles(profiles, default), default_runtime, rt, seed)
    if not exp.jobs:
        raise SpecError("--capture", f"no workload of {scheduler_name!r} in {capture} (--scheduler-name?)")
    return exp, more


def _run(
    out: Path, fgd_exps: list[FgdExperiment], rep_exps: list[ReplayExperiment], console: Console
) -> None:
    """Run every experiment into --out/decisions.jsonl, progress on stderr."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SpecError("--out", f"cannot create folder {out}: {err.strerror or err}") from None
    with (out / "decisions.jsonl").open("w") as log:
        for e in fgd_exps:
            e.run(log, lambda m: console.print(f"[dim]{m}[/]"))
        said: set[str] = set()
        for r in rep_exps:
            _warn_never_fit(console, r, said)
            r.run(log, lambda m: console.print(f"[dim]{m}[/]"))


def _only_with_kind(
    kind: str | None, throughputs: Path | None, durations: Path | None, fgd_results: Path | None
) -> None:
    """Refuse a file option the trace's format does not read, rather than ignore it silently
    (kind None: no --trace, the embedded example or --capture)."""
    given = {
        "--throughputs": (throughputs, "gavel", "a Gavel trace (*.trace, or a folder of them)"),
        "--durations": (durations, "synergy", "a Synergy trace"),
        "--fgd-results": (fgd_results, "openb", "an openb pod list (--trace openb_pod_list_*.csv)"),
    }
    for flag, (path, wants, what) in given.items():
        if path is not None and kind != wants:
            got = f"this trace is {kind}" if kind else "no --trace given"
            raise SpecError(flag, f"only means something with {what}; {got}")


def _check_fgd_results(path: Path, workload: str, full: bool) -> None:
    """--fgd-results: readable, in the artifact's schema, with rows for this workload, and the
    full openb node list (the authors' curves are for it)."""
    if not full:
        raise SpecError(
            "--fgd-results",
            "the authors' curves are for the full openb node list (openb_node_list_gpu_node.csv); "
            "drop --cluster or --fgd-results",
        )
    table = read_table(path)
    if not any(w == workload for w, _ in table):
        some = ", ".join(sorted({w for w, _ in table})[:5]) or "none"
        raise SpecError(str(path), f"no rows for workload {workload!r} (its workloads: {some})")


def _check_numbers(
    load: float, tune: float, eta_every: int, checkpoint: float, half_life: float, cycle: float = 0.0
) -> None:
    """Refuse values the replay would only trip over later (a zero --tune: numpy warnings, no result)."""
    if not cycle >= 0:
        raise SpecError("--cycle-interval", f"must be >= 0 seconds (0: off), got {cycle}")
    if not load > 0:
        raise SpecError("--load", f"must be > 0, got {load}")
    if not 0 < tune <= 10:
        raise SpecError("--tune", f"must be in (0, 10] (x GPU capacity submitted), got {tune}")
    if eta_every < -1:
        raise SpecError("--eta-every", f"must be -1 (about 500 forecasts), 0 (off) or more, got {eta_every}")
    if not checkpoint >= 0 or not half_life >= 0:
        raise SpecError("--checkpoint-interval/--half-life", "must be >= 0 seconds")


DATA_CACHE_MODES = {
    "off": [""],
    "none": ["none"],
    "first-use": ["first-use"],
    "ahead": ["ahead"],
    "warm": ["warm"],
    "distributed": ["distributed"],
    "all": ["none", "first-use", "ahead"],
    "copies-vs-distributed": ["first-use", "distributed"],
}


def _cache_modes(data_cache: str) -> list[str]:
    """The replays one --data-cache value asks for ("" in the list: no dynamic I/O model)."""
    if data_cache not in DATA_CACHE_MODES:
        known = ", ".join(DATA_CACHE_MODES)
        raise SpecError("--data-cache", f"must be one of {known}; got {data_cache!r}")
    return DATA_CACHE_MODES[data_cache]


def check_out(out: Path) -> None:
    """--out is a folder; say so before the replay runs rather than fail writing its results."""
    if out.exists() and not out.is_dir():
        raise SpecError("--out", f"{out} is a file; give a folder (it is created if missing)")


def _warn_never_fit(console: Console, exp: ReplayExperiment, said: set[str]) -> None:
    """Once per trace and cluster (the --data-cache modes share them), before the replay."""
    line = never_fit(exp.jobs, exp.nodes)
    if line and line not in said:
        said.add(line)
        console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)


def _profiles(arg: str | None, default: str) -> list[str]:
    names = [p.strip() for p in (arg or default).split(",") if p.strip()]
    for n in names:
        load_profile(n)
    return names


def _authors_results(trace: Path) -> Path | None:
    cand = (
        trace.resolve().parent.parent.parent / "fgd-simulator-expected-results" / "analysis_allo_discrete.csv"
    )
    return cand if cand.is_file() else None


FGD_SHOW = {
    "alloc_x90": "alloc@90",
    "alloc_x100": "alloc@100",
    "spread_x100": "min-max@100",
    "alloc_x130": "alloc@130",
    "frag_rate_x90": "frag%@90",
    "failed_pods": "failed",
}
REPLAY_SHOW = {
    # completed of the trace's, which the average JCT counts; two lines, so the 80 columns still fit
    "jobs_completed": "jobs\ndone",
    "avg_jct_s": "avg JCT s",
    "p95_jct_s": "p95 JCT s",
    "avg_wait_s": "avg wait s",
    "makespan_s": "makespan s",
    "gpu_alloc_pct": "GPU alloc %",
}
# a second table, so that each fits an 80-column terminal
REPLAY_HEALTH = {
    "deadlocked": "deadlock",
    "starved": "starved",
    "max_wait_large_s": "max wait 8+ GPU s",
    "evictions": "evictions",
    "lost_gpu_h_preempt": "GPU-h lost",
    "jain_index": "Jain",
}
REPLAY_ETA = {
    "eta_forecasts": "forecasts",
    "eta_no_time": "no time",
    "eta_median_abs_s": "median |error| s",
    "eta_mae_s": "mean |error| s",
    "eta_bias_s": "bias s",
}
REPLAY_IO = {
    "io_wait_gpu_h": "GPU-h lost to input waits",
    "io_wait_avg_s": "avg input wait s",
    "io_warm_start_pct": "warm starts %",
    "io_staged_tb": "copied to caches TB",
    "io_egress_tb": "from the source TB",
    "io_egress_later_epochs_tb": "... in epochs 2+ TB",
}


def _print(fgd: list[FgdExperiment], reps: list[ReplayExperiment]) -> None:
    from phalanx.report.headline import Spread, fgd_headline, per_seed, replay_headline, split_sentence

    console = Console()
    lines: list[str] = []
    for e in fgd:
        seeds = per_seed(e)
        rows = e.summary_rows()
        for r in rows:
            sp = Spread.of(seeds.get(str(r["profile"]), []))
            r["spread_x100"] = f"{sp.lo:.1f}-{sp.hi:.1f}" if sp.n else "-"
        _table(console, f"FGD protocol: {e.name} (GPU allocation %, mean over seeds)", rows, FGD_SHOW)
        lines.append(fgd_headline(e.name, seeds))
    for rep in reps:
        rows = rep.summary_rows()
        lines += [replay_headline(rep.name, rows), split_sentence(rows, rep.results)]
        for r in rows:
            r["jobs_completed"] = _done(r)
        _table(console, f"Time replay: {rep.name}", rows, REPLAY_SHOW)
        _table(console, f"Time replay: {rep.name}, gangs and queues", rows, REPLAY_HEALTH)
        if any(r.get("eta_forecasts") for r in rows):
            _table(
                console,
                f"Time replay: {rep.name}, start forecast at arrival vs actual start",
                rows,
                REPLAY_ETA,
            )
        if rep.data_cache:
            _table(console, f"Time replay: {rep.name}, input I/O", rows, REPLAY_IO)
    for line in lines:
        if line:
            console.print(line, highlight=False)


def _table(console: Console, title: str, rows: list[dict[str, object]], show: dict[str, str]) -> None:
    t = Table(title=title)
    name_column(t, "profile")
    for label in show.values():
        t.add_column(label, justify="right")
    for r in rows:
        t.add_row(str(r["profile"]), *[_cell(r.get(k, "")) for k in show])
    print_table(t, console)


def _cell(v: object) -> str:
    if not isinstance(v, float):
        return str(v)
    if v != v:  # NaN: e.g. Jain's index when fewer than two queues ever wanted GPUs
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3f}" if abs(v) < 1 else f"{v:,.1f}"


def _done(row: dict[str, object]) -> str:
    """'2/3': jobs completed of the trace's (the average JCT counts only the completed ones)."""
    c, n = row.get("completed"), row.get("jobs")
    return f"{c:,}/{n:,}" if isinstance(c, int) and isinstance(n, int) else "-"
