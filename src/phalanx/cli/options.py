"""The commands' options as `Annotated` aliases: one declaration (flags, type, help) per option.

The long option list of `simulate` lives here, so that the command's body reads as what it
does. Defaults stay in the command's signature (`trace: opt.Trace = None`): they are part of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from phalanx.sim.clusters import builtin_names

# ------------------------------------------------------------------ phalanx simulate

Trace = Annotated[
    Path | None,
    typer.Option(
        help="Trace file (openb pod list, Tiresias/Pollux/generic CSV, "
        "Gavel .trace or folder, Synergy trace). Default: embedded."
    ),
]
Cluster = Annotated[
    Path | None,
    typer.Option(
        metavar="<file|name>",
        help="Cluster: YAML, openb node CSV, Tiresias cluster_spec CSV, Synergy .ini, or a built-in "
        f"cluster's name ({builtin_names()}).",
    ),
]
Profiles = Annotated[str | None, typer.Option(help="Comma-separated profiles to compare.")]
Seeds = Annotated[
    str,
    typer.Option(
        help="Seed, or seeds (42-44) for the FGD protocol (default: 42; the embedded example runs "
        "42-51, ten seeds, as the FGD paper's comparison does)."
    ),
]
OutDir = Annotated[Path, typer.Option(help="Output directory.")]
TraceFormat = Annotated[str | None, typer.Option("--format", help="Trace format when it cannot be detected.")]
ColumnMap = Annotated[
    str | None, typer.Option("--map", help="Generic CSV columns: submit=..,duration=..,gpus=..")
]
Tune = Annotated[float, typer.Option(help="FGD protocol: submit until tune x GPU capacity.")]
Load = Annotated[float, typer.Option(help="Time replay: speed arrivals up by this factor.")]
RuntimeYaml = Annotated[Path | None, typer.Option(help="Runtime-model YAML (default: built-in).")]
NoSpread = Annotated[bool, typer.Option("--no-spread", help="Turn off the spread slowdown.")]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Turn off the data-cache factor.")]
NoSharing = Annotated[bool, typer.Option("--no-sharing", help="Turn off the GPU-sharing slowdown.")]
CycleInterval = Annotated[float, typer.Option(help="Also run a cycle every S seconds while work waits.")]
Outages = Annotated[Path | None, typer.Option(help="CSV node,start,end of node failures.")]
CheckpointInterval = Annotated[
    float, typer.Option(help="Time replay: seconds between checkpoints of jobs the trace gives none for.")
]
HalfLife = Annotated[
    float, typer.Option(help="Time replay: half-life (s) of queues' historical usage; 0: off.")
]
Throughputs = Annotated[Path | None, typer.Option(help="Gavel simulation_throughputs.json.")]
Durations = Annotated[Path | None, typer.Option(help="Synergy per-job run times CSV.")]
EtaEvery = Annotated[
    int,
    typer.Option(
        help="Time replay: forecast the start of every n-th job that waits when it arrives and report "
        "the forecast's error (-1: about 500 forecasts per replay; 0: off)."
    ),
]
FgdResults = Annotated[Path | None, typer.Option(help="The FGD authors' analysis_allo_discrete.csv.")]
DataCacheMode = Annotated[
    str,
    typer.Option(
        help="Time replay: input I/O model (runtime.yaml io:): none (read remote every epoch), "
        "first-use (node cache, filled when a job starts), ahead (also staged before the job, where "
        "the forecast places it), warm (a slow dataset copied to every node's free cache when its first "
        "job arrives), all (none, first-use and ahead, side by side), or off (the static cache "
        "factor of runtime.yaml only)."
    ),
]
CaptureFile = Annotated[
    Path | None,
    typer.Option(
        help="A file from `phalanx capture`: a what-if replay of that cluster (running work ends at "
        "its estimate, waiting work is placed by each profile) instead of a trace."
    ),
]
CapturedSchedulerName = Annotated[
    str, typer.Option(help="With --capture: the scheduler whose workloads are replayed.")
]
DefaultRuntime = Annotated[
    float, typer.Option(help="With --capture: seconds a workload without a run-time estimate runs.")
]
