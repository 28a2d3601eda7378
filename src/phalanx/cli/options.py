"""The commands' options as `Annotated` aliases: one declaration (flags, type, help) per option.

An option that several commands take (a kubeconfig, the scheduler name, the node's name) is
declared once here, so its help reads the same everywhere; the long option lists of `simulate`
and `scheduler` live here too, so that each command's body reads as what it does. Defaults stay
in each command's signature (`kubeconfig: opt.Kubeconfig = None`): they are part of the command.
typer copies an option's declaration for each command that uses it, so sharing one is safe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from phalanx.k8s.config import DEFAULT_LEVELS
from phalanx.sim.clusters import builtin_names

# ------------------------------------------------------------------ shared by several commands

Kubeconfig = Annotated[Path | None, typer.Option(help="Path of a kubeconfig file.")]
InCluster = Annotated[bool, typer.Option("--in-cluster", help="Use the pod's service account.")]
SchedulerName = Annotated[str, typer.Option(help="Pods with this spec.schedulerName are ours.")]
LEVELS_HELP = (
    "Topology levels, outermost first: level=node-label,... (default: "
    + ",".join(f"{a}={b}" for a, b in DEFAULT_LEVELS)
    + ")"
)
TopologyLevels = Annotated[str | None, typer.Option(help=LEVELS_HELP)]
NodeName = Annotated[str, typer.Option(help="This node's name (default: $NODE_NAME, else the host name).")]
SysRoot = Annotated[Path, typer.Option(help="Where sysfs is mounted.")]
NvmlModule = Annotated[str, typer.Option(help="NVML binding to import.")]

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
        "job arrives), distributed (striped over a cache group, fetched once for it: io.distributed), "
        "all (none, first-use and ahead, side by side), copies-vs-distributed (first-use and "
        "distributed), or off (the static cache factor of runtime.yaml only)."
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

# ------------------------------------------------------------------ phalanx scheduler

SchedulerProfile = Annotated[
    str,
    typer.Option(
        help="Built-in profile name or profile YAML (default: the shard's profile in --shards, "
        "else phalanx-queues)."
    ),
]
LeaseNamespace = Annotated[
    str,
    typer.Option(
        "--lease-namespace",
        "--namespace",
        help="Namespace of the leader-election Lease (created if missing and RBAC allows).",
    ),
]
LeaderElect = Annotated[
    bool,
    typer.Option(help="Elect a leader through a Lease; --no-leader-elect for a single replica."),
]
LeaseDuration = Annotated[
    int, typer.Option(help="Seconds without a renewal after which another replica takes over.")
]
CycleSeconds = Annotated[float, typer.Option(help="Seconds between cycles (sooner on changes).")]
MetricsPort = Annotated[int, typer.Option(help="Port of /metrics, /healthz and /readyz (0: any free port).")]
Identity = Annotated[str | None, typer.Option(help="Leader-election identity (default: host name).")]
BindWorkers = Annotated[int, typer.Option(help="Gangs bound at the same time.")]
GpuShares = Annotated[
    str,
    typer.Option(
        help="How GPU shares reach containers: 'off' (annotations only) or 'reservation' "
        "(reservation pods on the stock NVIDIA device plugin; needs `phalanx webhook`)."
    ),
]
ReservationNamespace = Annotated[str, typer.Option(help="Namespace of the GPU reservation pods.")]
ReservationImage = Annotated[
    str, typer.Option(help="Image of the reservation pods (runs `phalanx node reserve`).")
]
ReservationPod = Annotated[
    Path | None,
    typer.Option(
        help="YAML file of what to add to the reservation pods: runtimeClassName (e.g. nvidia, "
        "where the NVIDIA runtime is not the default), env, volumes, volumeMounts."
    ),
]
Kueue = Annotated[
    str,
    typer.Option(
        help="Kueue users: 'auto' (coexist when a Kueue controller runs), 'coexist' (Kueue admits, "
        "Phalanx places), 'migrate' (Phalanx enforces the ClusterQueues) or 'off'."
    ),
]
ShareLimitEnv = Annotated[
    bool,
    typer.Option(
        "--share-limit-env",
        help="Also give shares HAMi-core's CUDA_DEVICE_MEMORY_LIMIT and CUDA_DEVICE_SM_LIMIT.",
    ),
]
MpsPipeDirectory = Annotated[
    str,
    typer.Option(
        help="The nodes' MPS pipe directory (the MPS control daemon's CUDA_MPS_PIPE_DIRECTORY), given "
        "to MPS shares and mounted into them by the webhook.",
    ),
]
InsecureMetrics = Annotated[
    bool,
    typer.Option(
        "--insecure-metrics",
        help="Serve /metrics and the dashboard over plain HTTP to anyone (a trusted network only). "
        "Default: HTTPS, and only to callers the API server authenticates and authorizes.",
    ),
]
TlsCertFile = Annotated[
    Path | None,
    typer.Option(help="Serving certificate (PEM) of the HTTPS port (default: a self-made one)."),
]
TlsPrivateKeyFile = Annotated[Path | None, typer.Option(help="Private key (PEM) of --tls-cert-file.")]
BindAddress = Annotated[str, typer.Option(help="Address the HTTP(S) port listens on.")]
Shadow = Annotated[
    bool,
    typer.Option(
        "--shadow",
        help="Shadow mode: decide for the pods of --shadow-scheduler-name, bind and evict nothing, "
        "count where Phalanx agrees with that scheduler (phalanx_shadow_decisions_total). "
        "Reads only: no Lease, no Events, no status.",
    ),
]
ShadowSchedulerName = Annotated[
    str, typer.Option(help="With --shadow: the scheduler watched (its pods' spec.schedulerName).")
]
ShardsFile = Annotated[
    Path | None,
    typer.Option(
        "--shards",
        help="A scheduling shards file (every shard's name and node pools; docs/kubernetes.md, "
        "'Scheduling shards'); with --shard, this process schedules only that shard's pools.",
    ),
]
ShardName = Annotated[str, typer.Option(help="With --shards: the shard this process is.")]
StatusShards = Annotated[
    Path | None,
    typer.Option(
        "--shards",
        help="A scheduling shards file: show every shard (a table of them, then each one's tables) as "
        "its scheduler reads the cluster.",
    ),
]
