"""The cluster and workload model: plain, immutable, validated values.

Snapshots are built from these; the hot per-cycle state lives in numpy arrays
(`phalanx.core.cluster`), not here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from phalanx.core.affinity import NodeSelectorTerm
from phalanx.core.dra import Claim, CounterSet, DraDevice
from phalanx.core.errors import SpecError
from phalanx.core.mig import GEOMETRIES, TOTAL_COMPUTE, TOTAL_SLOTS, resolve_geometry

MILLI = 1000

# What may serve a fractional GPU request (`gpu-fraction`, `gpu-memory`): a free MIG instance
# (isolation), an MPS share of a whole GPU, or a time-slice share (`phalanx.core.backends`)
MIG_BACKEND = "mig"
MPS_BACKEND = "mps"
TIME_SLICE_BACKEND = "time-slice"
GPU_BACKENDS = (MIG_BACKEND, MPS_BACKEND, TIME_SLICE_BACKEND)


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG instance that already exists on a GPU (pre-partitioned)."""

    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU device of a node."""

    index: int
    model: str
    memory_mib: int
    numa: int = 0
    pcie_switch: int = 0
    nvlink_group: int = 0
    mig_enabled: bool = False

    def __post_init__(self) -> None:
        if self.index < 0:
            raise SpecError("index", f"GPU index must be >= 0, got {self.index}")
        if not self.model:
            raise SpecError("model", "GPU model must not be empty")
        if self.memory_mib < 0:
            raise SpecError("memory_mib", f"GPU memory must be >= 0 MiB (0: unknown), got {self.memory_mib}")
        if self.mig_enabled and not self.memory_mib:
            raise SpecError(
                "mig_enabled", "a MIG-enabled GPU needs its memory size (MIG geometry depends on it)"
            )
        if self.mig_enabled and resolve_geometry(self.model, self.memory_mib) is None:
            raise SpecError("mig_enabled", f"GPU model {self.model!r} has no known MIG geometry")


@dataclass(frozen=True, slots=True)
class Nic:
    """One RDMA (RoCE/InfiniBand) NIC of a node."""

    index: int
    numa: int = 0
    pcie_switch: int = 0
    bandwidth_gbps: float = 100.0

    def __post_init__(self) -> None:
        if self.index < 0:
            raise SpecError("index", f"NIC index must be >= 0, got {self.index}")
        if self.bandwidth_gbps <= 0:
            raise SpecError("bandwidth_gbps", f"NIC bandwidth must be > 0, got {self.bandwidth_gbps}")


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    """Kubernetes toleration semantics: Exists matches any value; empty key with Exists matches all."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def __post_init__(self) -> None:
        if self.operator not in ("Equal", "Exists"):
            raise SpecError("operator", f"toleration operator must be Equal or Exists, got {self.operator!r}")

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


# The largest CPU (milli) or memory (MiB) amount taken in: far beyond any machine, and well inside
# the int64 arrays the cycle keeps them in (a pod asking 2**63 millicores must not overflow a cycle).
MAX_AMOUNT = 2**53
# The most devices (GPUs, MIG instances, NICs) one node may have or one task may ask for: a node
# claiming 10**11 GPUs must be a problem line, not a tuple of 10**11 objects (out of memory).
MAX_DEVICES = 1024
# the kubelet's --topology-manager-policy values (phalanx.core.numa)
NUMA_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


@dataclass(frozen=True, slots=True)
class Node:
    """A machine: allocatable CPU/memory, labels, taints, topology path and devices."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    topology: Mapping[str, str] = field(default_factory=dict)
    datasets: Mapping[str, int] = field(default_factory=dict)
    mig_instances: Mapping[int, tuple[MigInstance, ...]] = field(default_factory=dict)
    # devices published by DRA drivers for this node (its GPUs and NICs among them, by role)
    dra: tuple[DraDevice, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()
    # the kubelet's Topology Manager policy (core.numa), and its allocatable CPUs per NUMA node
    numa_policy: str = "none"
    numa_cpu_milli: tuple[int, ...] = ()
    # MIG GPUs (by index) whose repartition a driver reads as under way: `mig_instances` holds the
    # layout they are being cut into, and they serve nothing until it is there; and when each GPU
    # was last asked to be cut (a GPU is not cut again within the repartition's interval)
    mig_recutting: frozenset[int] = frozenset()
    mig_recut_at: Mapping[int, float] = field(default_factory=dict)
    # the distributed dataset cache: whether the node can serve a distributed dataset (it runs the
    # cache's mount: a pod reading one can start only here), and the bytes of each distributed
    # dataset ("ns/name") its volume server holds (where a gang reading it is steered)
    distcache_mount: bool = False
    distcache_bytes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("name", "node name must not be empty")
        if self.numa_policy not in NUMA_POLICIES:
            known = ", ".join(NUMA_POLICIES)
            raise SpecError(
                "numa_policy", f"unknown topology manager policy {self.numa_policy!r} (known: {known})"
            )
        if any(not 0 <= m <= MAX_AMOUNT for m in self.numa_cpu_milli):
            raise SpecError("numa_cpu_milli", f"CPUs per NUMA node must be in [0, {MAX_AMOUNT}] milli")
        if not 0 <= self.cpu_milli <= MAX_AMOUNT:
            raise SpecError("cpu_milli", f"CPU must be in [0, {MAX_AMOUNT}], got {self.cpu_milli}")
        if not 0 <= self.memory_mib <= MAX_AMOUNT:
            raise SpecError("memory_mib", f"memory must be in [0, {MAX_AMOUNT}] MiB, got {self.memory_mib}")
        seen: set[int] = set()
        for i, g in enumerate(self.gpus):
            if g.index in seen:
                raise SpecError(f"gpus[{i}].index", f"duplicate GPU index {g.index}")
            seen.add(g.index)
        nic_seen: set[int] = set()
        for i, n in enumerate(self.nics):
            if n.index in nic_seen:
                raise SpecError(f"nics[{i}].index", f"duplicate NIC index {n.index}")
            nic_seen.add(n.index)
        for name, size in self.datasets.items():
            if size < 0:
                raise SpecError(f"datasets.{name}", f"cached bytes must be >= 0, got {size}")
        for name, size in self.distcache_bytes.items():
            if size < 0:
                raise SpecError(f"distcache_bytes.{name}", f"cached bytes must be >= 0, got {size}")

    @property
    def gpu_model(self) -> str:
        return self.gpus[0].model if self.gpus else ""


class GpuKind(Enum):
    NONE = "none"
    WHOLE = "whole"
    FRACTION = "fraction"
    MEMORY = "memory"
    MIG = "mig"


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What one task asks of GPUs.

    - WHOLE: `devices` whole GPUs.
    - FRACTION: `devices` distinct GPUs, each giving `milli` thousandths of its compute
      and the same share of its memory (KAI `gpu-fraction`).
    - MEMORY: `devices` distinct GPUs, each giving `memory_mib` of memory and the matching
      share of compute (KAI `gpu-memory`).
    - MIG: one instance of `mig_profile`.

    `backends` (FRACTION and MEMORY only): what may serve it, in order of preference; empty is
    today's time-slice share. A pod's override names one; the profile's policy fills the rest
    (`phalanx.core.backends`).
    """

    kind: GpuKind = GpuKind.NONE
    devices: int = 0
    milli: int = 0
    memory_mib: int = 0
    mig_profile: str = ""
    backends: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        k = self.kind
        if k is GpuKind.NONE:
            return
        if k is not GpuKind.MIG and self.devices < 1:
            raise SpecError("gpu.devices", f"GPU device count must be >= 1, got {self.devices}")
        if self.devices > MAX_DEVICES:
            raise SpecError("gpu.devices", f"GPU device count must be <= {MAX_DEVICES}, got {self.devices}")
        if not 0 <= self.memory_mib <= MAX_AMOUNT:
            raise SpecError(
                "gpu.memory", f"GPU memory must be in [0, {MAX_AMOUNT}] MiB, got {self.memory_mib}"
            )
        if k is GpuKind.FRACTION and not 0 < self.milli < MILLI:
            raise SpecError(
                "gpu.fraction",
                f"a GPU fraction must be in (0, 1); got {self.milli / MILLI:g} "
                "(use whole GPUs for 1 or more)",
            )
        if k is GpuKind.MEMORY and self.memory_mib <= 0:
            raise SpecError("gpu.memory_mib", f"GPU memory request must be > 0 MiB, got {self.memory_mib}")
        if self.backends:
            if k not in (GpuKind.FRACTION, GpuKind.MEMORY):
                raise SpecError("gpu.backends", "only a GPU fraction or a GPU memory request has a backend")
            bad = [b for b in self.backends if b not in GPU_BACKENDS]
            if bad or len(set(self.backends)) != len(self.backends):
                raise SpecError(
                    "gpu.backends",
                    f"backends must be distinct, of {', '.join(GPU_BACKENDS)}; "
                    f"got {', '.join(self.backends)}",
                )
            if self.backends == (MIG_BACKEND,) and self.devices != 1:
                raise SpecError("gpu.backends", f"a MIG instance is one device; this asks {self.devices}")
        if k is GpuKind.MIG:
            if not self.mig_profile:
                raise SpecError("gpu.mig_profile", "MIG request needs a profile name such as 1g.10gb")
            known = sorted({p for g in GEOMETRIES.values() for p in g.profiles})
            if self.mig_profile not in known:
                raise SpecError(
                    "gpu.mig_profile", f"unknown MIG profile {self.mig_profile!r} (known: {', '.join(known)})"
                )

    @staticmethod
    def none() -> GpuRequest:
        return GpuRequest()

    @staticmethod
    def whole(count: int) -> GpuRequest:
        return GpuRequest(GpuKind.WHOLE, devices=count, milli=MILLI)

    @staticmethod
    def fraction(share: float, devices: int = 1) -> GpuRequest:
        milli = round(share * MILLI)
        if share > 0 and milli == 0:
            raise SpecError("gpu.fraction", f"GPU fraction {share:g} is below 0.001")
        return GpuRequest(GpuKind.FRACTION, devices=devices, milli=milli)

    @staticmethod
    def of_milli(milli: int, devices: int = 1) -> GpuRequest:
        """Milli-GPU per device: 1000 or more means whole GPUs (`milli` must then be 1000)."""
        if milli == MILLI:
            return GpuRequest.whole(devices)
        return GpuRequest(GpuKind.FRACTION, devices=devices, milli=milli)

    @staticmethod
    def memory(mib: int, devices: int = 1) -> GpuRequest:
        return GpuRequest(GpuKind.MEMORY, devices=devices, memory_mib=mib)

    @staticmethod
    def mig(profile: str) -> GpuRequest:
        return GpuRequest(GpuKind.MIG, devices=1, mig_profile=profile)

    @property
    def total_milli(self) -> int:
        """GPU demand in milli-GPU, as accounted by the FGD artifact (memory requests: unknown, 0)."""
        if self.kind in (GpuKind.WHOLE, GpuKind.FRACTION):
            return self.devices * self.milli
        return 0

    def describe(self) -> str:
        k = self.kind
        if k is GpuKind.NONE:
            return "-"
        if k is GpuKind.WHOLE:
            return f"{self.devices} GPU"
        if k is GpuKind.FRACTION:
            return f"{self.devices}x{self.milli / MILLI:g} GPU"
        if k is GpuKind.MEMORY:
            return f"{self.devices}x{self.memory_mib}MiB GPU"
        return f"MIG {self.mig_profile}"


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """Resources and constraints of one task (pod)."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu: GpuRequest = field(default_factory=GpuRequest)
    gpu_models: frozenset[str] = frozenset()
    rdma_nics: int = 0
    nic_same_pcie: bool = False
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    dataset: str = ""
    node_affinity: tuple[NodeSelectorTerm, ...] = ()  # required terms, ORed (core.affinity)
    # DRA ResourceClaims of the pod: the allocator picks their devices; `gpu` and `rdma_nics`
    # then describe what they amount to (for scoring and quotas), not what is checked
    claims: tuple[Claim, ...] = ()
    # which of gpu / nic the claims provide; the others (device-plugin GPUs or RDMA NICs) are classic
    claimed: frozenset[str] = frozenset({"gpu", "nic"})
    # whole cores of a Guaranteed pod: the kubelet's static CPU manager pins them on a NUMA node
    exclusive_cpu: bool = False
    # `dataset` is read from the distributed cache's mount (not a per-node copy): only nodes that run
    # the mount can host the task (plugins.locality)
    dataset_distributed: bool = False
    # `shape_key`, worked out once (the hot paths ask for it millions of times in a long replay)
    _shape: tuple[object, ...] = field(init=False, repr=False, compare=False, hash=False, default=())
    _fit: tuple[object, ...] = field(init=False, repr=False, compare=False, hash=False, default=())

    def __post_init__(self) -> None:
        shape = self._make_shape()
        object.__setattr__(self, "_shape", shape)
        # the shape without the dataset (fields 8 and 13) and the claims (10, 11)
        object.__setattr__(self, "_fit", (*shape[:8], shape[9], shape[12]))
        if self.cpu_milli < 0:
            raise SpecError("cpu_milli", f"CPU request must be >= 0, got {self.cpu_milli}")
        if self.memory_mib < 0:
            raise SpecError("memory_mib", f"memory request must be >= 0, got {self.memory_mib}")
        if self.cpu_milli > MAX_AMOUNT or self.memory_mib > MAX_AMOUNT:
            raise SpecError("resources", f"CPU (milli) and memory (MiB) requests must be <= {MAX_AMOUNT}")
        if not 0 <= self.rdma_nics <= MAX_DEVICES:
            raise SpecError(
                "rdma_nics", f"RDMA NIC count must be in [0, {MAX_DEVICES}], got {self.rdma_nics}"
            )
        if self.gpu.kind is GpuKind.MIG and self.gpu.devices != 1:
            raise SpecError("gpu.devices", "a MIG request takes exactly one instance")

    @property
    def shape_key(self) -> tuple[object, ...]:
        """Identity of the request for caching and task-type statistics."""
        return self._shape

    @property
    def fit_key(self) -> tuple[object, ...]:
        """What the node checks of `feasibility.explain` read of a request without claims: its
        shape less the dataset, which only the profile's filters and scorers look at."""
        return self._fit

    def _make_shape(self) -> tuple[object, ...]:
        return (
            self.cpu_milli,
            self.memory_mib,
            self.gpu,
            self.gpu_models,
            self.rdma_nics,
            self.nic_same_pcie,
            tuple(sorted(self.node_selector.items())),
            self.tolerations,
            self.dataset,
            self.node_affinity,
            tuple(c.key for c in self.claims),  # pods with different claims are never alike
            claims_shape(self.claims),
            self.exclusive_cpu,
            self.dataset_distributed,
        )


def claims_shape(claims: tuple[Claim, ...]) -> str:
    """What the claims ask, without their names: equal for the claims a template stamps out."""
    if not claims:
        return ""
    return repr(tuple((c.requests, c.constraints, c.key if c.shared else "") for c in claims))


@dataclass(frozen=True, slots=True)
class PodSet:
    """A group of identical tasks inside a workload."""

    name: str
    count: int
    request: TaskRequest
    task_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("name", "pod set name must not be empty")
        if self.count < 1:
            raise SpecError("count", f"pod set count must be >= 1, got {self.count}")
        if self.task_names and len(self.task_names) != self.count:
            raise SpecError("task_names", f"{len(self.task_names)} task names for {self.count} tasks")


@dataclass(frozen=True, slots=True)
class TopologyConstraint:
    """Keep a gang inside one domain of `level` (required) or prefer it (preferred)."""

    level: str
    required: bool = False


@dataclass(frozen=True, slots=True)
class SubGroup:
    """One gang inside a multi-level workload (prefill or decode of a disaggregated server, one
    replica of a LeaderWorkerSet): its pod sets, its own minimum and its own topology constraint.
    The workload runs only when every subgroup has its minimum (all-or-nothing at the top)."""

    name: str
    podsets: tuple[str, ...]
    min_available: int
    topology: TopologyConstraint | None = None
    # not a subgroup the user wrote: the tasks no named subgroup takes (Volcano's pods outside its
    # subGroupPolicy). Reasons say what they are (`name`, in parentheses, is that phrase) and never
    # call a workload whose only subgroup is implicit anything but a gang
    implicit: bool = False


@dataclass(frozen=True, slots=True)
class Workload:
    """A gang: the unit of admission, preemption and fairness."""

    name: str
    podsets: tuple[PodSet, ...]
    min_available: int = 0
    queue: str = "default"
    priority: int = 0
    preemptible: bool = True
    creation_time: float = 0.0
    topology: TopologyConstraint | None = None
    # seconds between the workload's checkpoints (0: unknown, a restart loses all work since start)
    checkpoint_interval: float = 0.0
    # when it last reported a checkpoint (snapshot clock; None: never, or not reported): the phase
    # of its checkpoint clock, which otherwise counts from when its last task was bound
    last_checkpoint: float | None = None
    # seconds of its GPUs an eviction costs it to start again (rendezvous, image, data loader,
    # NCCL init); None: the evicting action's default (its `restart_s`)
    restart_s: float | None = None
    # expected run time, for backfilling onto reserved capacity and shortest-remaining-first
    estimated_runtime: float | None = None
    # admitted by another system that owns its quota (Kueue): quota admission does not apply
    quota_exempt: bool = False
    # multi-level gang: each subgroup needs its own minimum, the workload needs all of them
    subgroups: tuple[SubGroup, ...] = ()
    # preempted only whole, never shrunk to its minimum (Kubernetes' disruptionMode: PodGroup)
    preempt_whole: bool = False
    # may evict others to be placed (preempt, reclaim, consolidate); Kubernetes' preemptionPolicy
    # Never says no: it is placed only in free room, ahead of lower priority all the same
    preempts: bool = True
    # how its user names a task and writes its minimum, for reasons only ("pod", "minMember 4");
    # "" minimum: the core's own words. Never read by a decision
    task_noun: str = "task"
    minimum_said: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("name", "workload name must not be empty")
        if not self.podsets:
            raise SpecError("podsets", "a workload needs at least one pod set")
        names = [p.name for p in self.podsets]
        if len(set(names)) != len(names):
            raise SpecError("podsets", f"duplicate pod set names in {names}")
        total = self.total_tasks
        if self.min_available < 0:
            raise SpecError("min_available", f"min_available must be >= 0, got {self.min_available}")
        if self.min_available > total:
            raise SpecError(
                "min_available",
                f"min_available {self.min_available} is larger than the {total} tasks of the workload",
            )
        if math.isnan(self.creation_time):
            raise SpecError("creation_time", "creation time must be a number")
        if not self.checkpoint_interval >= 0:
            raise SpecError("checkpoint_interval", f"must be >= 0 seconds, got {self.checkpoint_interval}")
        if self.restart_s is not None and not (math.isfinite(self.restart_s) and self.restart_s >= 0):
            raise SpecError("restart_s", f"must be a finite number of seconds >= 0, got {self.restart_s}")
        if self.last_checkpoint is not None and not math.isfinite(self.last_checkpoint):
            raise SpecError("last_checkpoint", f"must be a time, got {self.last_checkpoint}")
        if self.estimated_runtime is not None and not self.estimated_runtime > 0:
            raise SpecError("estimated_runtime", f"must be > 0 seconds, got {self.estimated_runtime}")
        if self.subgroups:
            self._check_subgroups()

    def _check_subgroups(self) -> None:
        counts = {p.name: p.count for p in self.podsets}
        seen: dict[str, str] = {}
        for k, sg in enumerate(self.subgroups):
            where = f"subgroups[{k}]"
            if not sg.name or not sg.podsets:
                raise SpecError(where, "a subgroup needs a name and at least one pod set")
            for ps in sg.podsets:
                if ps not in counts:
                    raise SpecError(f"{where}.podsets", f"no pod set {ps!r} (have {sorted(counts)})")
                if ps in seen:
                    raise SpecError(f"{where}.podsets", f"pod set {ps!r} is already in subgroup {seen[ps]!r}")
                seen[ps] = sg.name
            size = sum(counts[ps] for ps in sg.podsets)
            if not 1 <= sg.min_available <= size:
                raise SpecError(
                    f"{where}.min_available",
                    f"must be 1..{size} (the subgroup's tasks), got {sg.min_available}",
                )
        if len({sg.name for sg in self.subgroups}) != len(self.subgroups):
            raise SpecError("subgroups", "duplicate subgroup names")
        if set(seen) != set(counts):
            raise SpecError("subgroups", f"pod sets in no subgroup: {sorted(set(counts) - set(seen))}")

    @property
    def total_tasks(self) -> int:
        return sum(p.count for p in self.podsets)

    @property
    def gang_size(self) -> int:
        """Tasks that must be placed together: `min_available`, or all tasks when unset; with
        subgroups, the sum of their minimums."""
        if self.subgroups:
            return sum(sg.min_available for sg in self.subgroups)
        return self.min_available or self.total_tasks

    def subgroup_of(self, podset: str) -> SubGroup | None:
        for sg in self.subgroups:
            if podset in sg.podsets:
                return sg
        return None

    def tasks(self) -> list[Task]:
        out: list[Task] = []
        for ps in self.podsets:
            for i in range(ps.count):
                name = ps.task_names[i] if ps.task_names else f"{self.name}/{ps.name}-{i}"
                out.append(Task(name=name, workload=self.name, podset=ps.name, ordinal=i, request=ps.request))
        return out

    @property
    def total_gpu_milli(self) -> int:
        return sum(p.count * p.request.gpu.total_milli for p in self.podsets)


@dataclass(frozen=True, slots=True)
class Task:
    """One pod to place."""

    name: str
    workload: str
    podset: str
    ordinal: int
    request: TaskRequest


def validate_mig_layout(node: Node) -> None:
    """Pre-existing MIG instances must sit on MIG GPUs, at valid starts, without overlap."""
    by_index = {g.index: g for g in node.gpus}
    for gi, instances in node.mig_instances.items():
        where = f"mig_instances[{gi}]"
        gpu = by_index.get(gi)
        if gpu is None or not gpu.mig_enabled:
            raise SpecError(where, f"GPU {gi} is not a MIG-enabled GPU of node {node.name}")
        geo = resolve_geometry(gpu.model, gpu.memory_mib)
        assert geo is not None
        used = 0
        compute = 0
        for inst in instances:
            prof = geo.profile(inst.profile)
            if inst.start not in prof.starts:
                raise SpecError(
                    where, f"{inst.profile} cannot start at slot {inst.start} (valid: {prof.starts})"
                )
            mask = prof.slot_mask(inst.start)
            if used & mask:
                raise SpecError(where, f"{inst.profile} at slot {inst.start} overlaps another instance")
            used |= mask
            compute += prof.compute
        if compute > TOTAL_COMPUTE or used >= (1 << TOTAL_SLOTS):
            raise SpecError(where, "MIG instances exceed the GPU's compute or memory slices")
