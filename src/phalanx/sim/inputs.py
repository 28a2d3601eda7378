"""Recognise a trace or cluster file by its contents and load it with the right loader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from phalanx.core.errors import SpecError
from phalanx.core.model import Node
from phalanx.core.queues import QueueTree
from phalanx.sim.clusters import BUILTIN_CLUSTERS, builtin_cluster, builtin_names
from phalanx.sim.jobs import JobSpec
from phalanx.sim.traces import gavel, generic, openb, pollux, synergy, tiresias
from phalanx.spec.cluster import load_cluster as load_cluster_yaml

FORMATS = ("openb", "tiresias", "gavel", "pollux", "synergy", "csv")


@dataclass
class Cluster:
    nodes: list[Node]
    levels: list[str]
    datasets: dict[str, int]
    source: str
    queues: QueueTree | None = None


TRACE_KINDS = "an openb pod list, a Tiresias, Pollux, Synergy or generic CSV, or a Gavel .trace"
CLUSTER_KINDS = "a cluster YAML, an openb node CSV, a Tiresias cluster_spec CSV or a Synergy .ini"


def _header(path: Path, kinds: str) -> str:
    """The first line; a binary file (`--trace /bin/ls`) is named as such, not a UnicodeDecodeError."""
    try:
        with path.open() as fh:
            return fh.readline().strip()
    except OSError as e:
        raise SpecError(str(path), f"cannot read file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SpecError(str(path), f"not a text file; expected {kinds}") from None


def detect_format(path: Path) -> str:
    if path.is_dir():
        gavel_files(path)  # a folder is a Gavel trace: say so when it holds none
        return "gavel"
    if path.suffix == ".trace":
        return "gavel"
    head = _header(path, TRACE_KINDS)
    cols = {c.strip() for c in head.split(",")}
    if {"name", "cpu_milli", "num_gpu", "gpu_milli"} <= cols:
        return "openb"
    if {"job_id", "num_gpu", "submit_time", "duration"} <= cols:
        return "tiresias"
    if {"name", "time", "application", "num_replicas", "batch_size"} <= cols:
        return "pollux"
    if len(head.split(",")) == 5 and not any(ch.isalpha() for ch in head.split(",")[2]):
        return "synergy"
    raise SpecError(
        str(path),
        f"cannot tell the trace format: give --format, or --map for a generic CSV (header: {head[:120]!r})",
    )


def load_jobs(
    path: Path,
    fmt: str,
    mapping: str | None = None,
    throughputs: Path | None = None,
    durations: Path | None = None,
) -> list[JobSpec]:
    if fmt == "tiresias":
        return tiresias.load_jobs(path)
    if fmt == "pollux":
        return pollux.load_jobs(path)
    if fmt == "csv":
        if not mapping:
            raise SpecError(
                "--map", "a generic CSV needs a column mapping, e.g. submit=ts,duration=dur,gpus=gpus"
            )
        return generic.load_jobs(path, generic.parse_mapping(mapping))
    if fmt == "synergy":
        if durations is None:
            raise SpecError(
                "--durations", "a Synergy trace needs the per-job run times (*_fifo_fair_jobs.csv)"
            )
        return synergy.load_jobs(path, durations)
    if fmt == "gavel":
        files = gavel_files(path)  # before the throughputs: an empty folder is said as such
        tp_path = throughputs or _find_up(path, "simulation_throughputs.json")
        if tp_path is None:
            raise SpecError("--throughputs", "a Gavel trace needs simulation_throughputs.json")
        table = gavel.load_throughputs(tp_path)
        jobs: list[JobSpec] = []
        for f in files:
            jobs += gavel.load_trace(f, table)
        return jobs
    raise SpecError("--format", f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")


def gavel_files(path: Path) -> list[Path]:
    """A Gavel trace: the file itself, or the .trace files of a folder (which must hold some)."""
    if not path.is_dir():
        return [path]
    files = sorted(path.glob("*.trace"))
    if not files:
        raise SpecError(
            str(path),
            "the folder holds no .trace files; --trace takes a trace file or a folder of Gavel .trace files",
        )
    return files


def _find_up(path: Path, name: str) -> Path | None:
    for d in [path if path.is_dir() else path.parent, *path.resolve().parents]:
        if (d / name).is_file():
            return d / name
    return None


def load_cluster(path: Path) -> Cluster:
    """A cluster YAML, an openb node CSV, a Tiresias cluster_spec CSV or a Synergy .ini."""
    if path.suffix in (".yaml", ".yml"):
        cd = load_cluster_yaml(path)
        return Cluster(cd.nodes, cd.levels, cd.datasets, str(path), cd.queues)
    if path.suffix == ".ini":
        nodes, levels = synergy.load_cluster(path)
        return Cluster(nodes, levels, {}, str(path))
    head = _header(path, CLUSTER_KINDS)
    cols = {c.strip() for c in head.split(",")}
    if {"sn", "cpu_milli", "gpu", "model"} <= cols:
        return Cluster(openb.load_nodes(path), [], {}, str(path))
    if {"num_switch", "num_node_p_switch", "num_gpu_p_node"} <= cols:
        nodes, levels = tiresias.load_cluster(path)
        return Cluster(nodes, levels, {}, str(path))
    raise SpecError(str(path), f"not a cluster file: expected {CLUSTER_KINDS}")


def cluster_arg(arg: Path) -> Cluster:
    """--cluster: a file, or the name of a built-in cluster (`phalanx.sim.clusters`)."""
    if not arg.exists() and str(arg) in BUILTIN_CLUSTERS:
        nodes, levels, what = builtin_cluster(str(arg))
        return Cluster(nodes, levels, {}, what)
    if not arg.exists() and not arg.suffix and "/" not in str(arg):  # a name, not a path
        builtin_cluster(str(arg))  # raises: unknown, with the known names
    return load_cluster(arg)


def default_cluster(fmt: str, trace: Path) -> Cluster:
    """The cluster a trace was published with, when the trace alone does not say."""
    if fmt == "openb":
        sib = trace.parent / "openb_node_list_gpu_node.csv"
        if sib.is_file():
            return load_cluster(sib)
        raise SpecError("--cluster", "an openb pod list needs its node list (openb_node_list_gpu_node.csv)")
    if fmt == "tiresias":
        sib = trace.parent / "cluster_spec.csv"
        if sib.is_file():
            return load_cluster(sib)
    if fmt == "gavel":
        nodes, levels, what = builtin_cluster("gavel-philly-500xV100")
        return Cluster(nodes, levels, {}, what)
    if fmt == "pollux":
        nodes, levels, what = builtin_cluster("pollux-64xT4")
        return Cluster(nodes, levels, {}, what)
    if fmt == "synergy":
        for cand in (
            trace.parent / "configs" / "deployment.ini",
            trace.parent.parent / "configs" / "deployment.ini",
        ):
            if cand.is_file():
                return load_cluster(cand)
    raise SpecError(
        "--cluster", f"give a cluster for this {fmt} trace: a file, or a built-in ({builtin_names()})"
    )
