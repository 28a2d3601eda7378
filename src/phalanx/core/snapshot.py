"""Everything one cycle sees, built from plain lists; no I/O behind it.

A driver (the simulator or the Kubernetes adapter) keeps one Snapshot as its cache
and updates it between cycles with `add_workload`, `apply`, `release` and friends.
`run_cycle` leaves it exactly as it found it.
"""

from __future__ import annotations

import bisect
import collections
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from phalanx.core.affinity import affinity_matches
from phalanx.core.allocator import DraState, SelectorCache
from phalanx.core.cluster import KIND_SHARED, BoolArray, ClusterState, DeviceAssignment, IntArray, MigSlice
from phalanx.core.decisions import Bind, CycleResult, Evict, Pending
from phalanx.core.dra import ClaimAllocation, CounterSet, DraDevice
from phalanx.core.errors import SpecError
from phalanx.core.mig import GEOMETRIES, resolve_geometry
from phalanx.core.model import (
    MILLI,
    GpuKind,
    Node,
    Task,
    TaskRequest,
    Toleration,
    Workload,
    validate_mig_layout,
)
from phalanx.core.queues import QueueTree, Vector
from phalanx.core.queues import fair_shares as queue_fair_shares

if TYPE_CHECKING:
    from phalanx.core.wake import RankWakes


WINDOW_S = 3600.0  # the eviction budgets' window: evictions an hour
Recent = tuple[float, str, str, float]  # an eviction the budgets count: when, workload, queue, GPU-s lost


@dataclass(frozen=True, slots=True)
class Allocation:
    """A task running on a node with its devices."""

    task: Task
    node: int
    devices: DeviceAssignment
    cpu_milli: int
    memory_mib: int
    since: float = 0.0
    claims: tuple[ClaimAllocation, ...] = ()  # DRA claims it holds (shared ones counted once)


@dataclass(slots=True)
class WorkloadEntry:
    """A workload and which of its tasks are bound."""

    workload: Workload
    tasks: list[Task]
    bound: dict[str, Allocation] = field(default_factory=dict)
    # set by `Snapshot.apply` when a cycle found the workload unschedulable (kube-scheduler's
    # unschedulable queue): it is not retried until capacity is released
    parked_epoch: int = -1
    last_pending: Pending | None = None
    # derived facts about the (immutable) workload, memoised by actions
    cache: dict[object, object] = field(default_factory=dict)
    # kept by the driver: GPU-seconds received and seconds run while ready, counted so far (the
    # simulator's `Snapshot.advance` adds to them); a run going on since `run_since` on `run_clock`
    # (the adapter's, `RunClock`) is added when read, so a driver need not visit every running
    # workload each cycle to move its clock
    attained_base: float = 0.0
    executed_base: float = 0.0
    gpu_milli: int = 0  # GPU held by its bound tasks (milli-GPU; MIG slices by compute share)
    run_since: float | None = None
    run_clock: RunClock | None = None

    @property
    def executed(self) -> float:
        """Seconds run while ready: those counted, and the run going on (if its clock is kept)."""
        since, clock = self.run_since, self.run_clock
        if since is None or clock is None:
            return self.executed_base
        return self.executed_base + clock.ran(since)

    @executed.setter
    def executed(self, value: float) -> None:
        self.settle_run()
        self.executed_base = value

    @property
    def attained(self) -> float:
        """GPU-seconds received: those counted, and the run going on at the GPUs it holds now."""
        since, clock = self.run_since, self.run_clock
        if since is None or clock is None:
            return self.attained_base
        return self.attained_base + gpu_seconds(self.gpu_milli, clock.ran(since))

    @attained.setter
    def attained(self, value: float) -> None:
        self.settle_run()
        self.attained_base = value

    def settle_run(self) -> None:
        """Count the run going on as of its clock now, and stop reading it from the clock: done
        before the GPUs it holds change (a bind or an eviction), so what it had received stays."""
        since, clock = self.run_since, self.run_clock
        if since is not None and clock is not None:
            ran = clock.ran(since)
            self.attained_base += gpu_seconds(self.gpu_milli, ran)
            self.executed_base += ran
        self.run_since = None

    @property
    def demand_key(self) -> tuple[object, ...]:
        """Workloads with equal demand keys fit or not alike (same requests, counts, gang size, topology)."""
        key = self.cache.get("demand")
        if key is None:
            w = self.workload
            key = HashedKey(
                (
                    tuple((ps.request.shape_key, ps.count) for ps in w.podsets),
                    w.gang_size,
                    w.topology,
                    w.subgroups,
                )
            )
            self.cache["demand"] = key
        return key  # type: ignore[return-value]

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def unbound(self) -> list[Task]:
        return [t for t in self.tasks if t.name not in self.bound]

    @property
    def is_ready(self) -> bool:
        """All `min_available` tasks are running, so the gang can make progress."""
        return len(self.bound) >= self.workload.gang_size

    @property
    def is_complete(self) -> bool:
        return len(self.bound) == len(self.tasks)


class HashedKey(tuple):  # type: ignore[type-arg]
    """A tuple that works out its hash once: a demand key is a deep tuple of frozen dataclasses
    (each hashed in Python), looked up at every bind and unbind. Equal, and hashed, as the plain
    tuple; pickled as one (a hash is only good in the process that made it)."""

    _hash: int

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            self._hash = h = tuple.__hash__(self)
            return h

    def __reduce__(self) -> tuple[type[HashedKey], tuple[tuple[object, ...]]]:
        return (HashedKey, (tuple(self),))


@dataclass(slots=True)
class RunClock:
    """A driver's clock for runs read from it (`WorkloadEntry.run_since`): moved once a cycle."""

    now: float = 0.0

    def ran(self, since: float) -> float:
        """Seconds run since `since`, never below zero."""
        now = self.now
        return now - since if now > since else 0.0


def natural_key(entry: WorkloadEntry) -> tuple[int, float, str]:
    """Higher priority first, then older, then by name."""
    w = entry.workload
    return (-w.priority, w.creation_time, w.name)


@dataclass(frozen=True, slots=True)
class ForeignUsage:
    """Capacity used on a node by something Phalanx does not schedule (other schedulers' pods)."""

    node: str
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: tuple[int, ...] = ()
    gpu_milli: int = 1000
    owner: str = ""  # who holds it (a pod), for explanations
    ends: float | None = None  # going away (a pod terminating): gone by then at the latest
    mig: MigSlice | None = None  # a MIG instance on gpus[0] (a reservation pod holding it), not milli


@dataclass(frozen=True, slots=True)
class Leaving:
    """Foreign usage that is going away (an evicted pod still terminating): what it holds, and until when."""

    owner: str
    node: int
    cpu_milli: int
    memory_mib: int
    devices: DeviceAssignment
    ends: float


@dataclass(frozen=True, slots=True)
class TaskType:
    """One kind of task and how common it is; FGD measures fragmentation against these."""

    request: TaskRequest
    weight: float


def alloc_milli(a: Allocation) -> int:
    """Milli-GPU a task holds (a MIG slice counts by its share of the GPU's compute)."""
    d = a.devices
    return len(d.gpus) * d.milli if d.mig is None else d.mig_compute * 1000 // 7


def gpu_seconds(gpu_milli: int, seconds: float) -> float:
    """Attained service: GPU-seconds for `gpu_milli` held `seconds` (what LAS orders by). One
    formula for the simulator's running total and the adapter's reading of a run from its pods."""
    return gpu_milli * seconds / MILLI


def decay_history(
    history: dict[str, Vector], usage: Mapping[str, Vector], dt: float, half_life: float
) -> None:
    """Move each queue's usage history towards its usage now, by the share of `half_life` that
    `dt` seconds are (a queue new to `history` starts at its usage): the fair-share history
    (`fairshare`'s `history_weight`) as the simulator's snapshot and the adapter's attained-service
    store both keep it."""
    keep = 0.5 ** (dt / half_life)
    for q, use in usage.items():
        old = history.get(q, use)
        history[q] = old * keep + use * (1 - keep)


class Snapshot:
    """Cluster state plus the workloads to schedule."""

    def __init__(
        self,
        nodes: Sequence[Node],
        workloads: Iterable[Workload] = (),
        *,
        topology_levels: Sequence[str] = (),
        datasets: Mapping[str, int] | None = None,
        task_types: Sequence[TaskType] | None = None,
        queues: QueueTree | None = None,
        dra_shared: Sequence[DraDevice] = (),
        dra_counter_sets: Sequence[CounterSet] = (),
    ) -> None:
        ordered = sorted(nodes, key=lambda x: x.name)
        names = [x.name for x in ordered]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SpecError(f"nodes.{dup}", "duplicate node name")
        for node in ordered:
            try:
                validate_mig_layout(node)
            except SpecError as e:
                raise e.located(f"nodes.{node.name}") from None
        self.cluster = ClusterState(ordered)
        # tie-break order of nodes (by name); a driver may set another fixed order
        self.node_rank = np.arange(len(ordered), dtype=np.int64)
        self.has_taints = any(t.effect in ("NoSchedule", "NoExecute") for n in ordered for t in n.taints)
        self.topology_levels: tuple[str, ...] = tuple(topology_levels)
        self.datasets: dict[str, int] = dict(datasets or {})
        self._cache_bytes: dict[str, np.ndarray] = {}
        self.task_types: tuple[TaskType, ...] | None = tuple(task_types) if task_types is not None else None
        self.workloads: dict[str, WorkloadEntry] = {}
        self.allocations: dict[str, Allocation] = {}
        self._tasks: dict[str, tuple[WorkloadEntry, Task]] = {}
        self._type_counts: dict[tuple[object, ...], tuple[TaskRequest, int]] = {}
        self.types_version = 0
        self.on_node: list[dict[str, Allocation]] = [{} for _ in ordered]
        self._pending: dict[str, WorkloadEntry] = {}
        self._ready: dict[str, WorkloadEntry] = {}
        # pending workloads grouped by demand, and those no cycle has looked at yet
        self.pending_groups: dict[tuple[object, ...], dict[str, WorkloadEntry]] = {}
        # each group's names in natural order (priority, then age, then name), and partly bound ones
        self.group_order: dict[tuple[object, ...], list[tuple[int, float, str]]] = {}
        self.partial: set[str] = set()
        self.fresh: set[str] = set()
        # each group's order by a profile's key, kept across cycles (`core.kept_order`)
        self.kept_orders: dict[tuple[object, ...], object] = {}
        # a gang's queue request by its tasks' identities, kept across cycles (`Session.request_of`)
        self.kept_requests: dict[tuple[int, ...], tuple[object, ...]] = {}
        # the last fair shares worked out, with the tree and inputs they came from (`fair_shares`)
        self._fair_kept: tuple[QueueTree, tuple[object, ...], dict[str, Vector]] | None = None
        self.pending_per_queue: dict[str, int] = {}  # how many workloads wait in each queue
        self.queue_gpu_milli: dict[str, int] = {}
        # queue accounting: (weighted milli-GPU, milli-CPU, MiB) used and still requested, per leaf queue
        self.queues = queues
        self.queue_usage: dict[str, Vector] = {}
        # usage of each queue and everything below it (leaves included), and of all queues together
        self.subtree_usage: dict[str, Vector] = {}
        self.usage_total: Vector = np.zeros(3)
        self.usage_version = 0  # bumped on every change of queue usage
        self.queue_pending: dict[str, Vector] = {}
        self.queue_history: dict[str, Vector] = {}
        self.history_time: float | None = None
        self._capacity: Vector | None = None
        self._median_mem: int | None = None
        # queue vectors of requests and allocations, each worked out once: every bind and unbind
        # (and every eviction tried and undone) asks for them; read-only, as callers share them
        self._req_vecs: dict[int, tuple[TaskRequest, Vector]] = {}
        self._alloc_vecs: dict[tuple[int, int, int, int, int], Vector] = {}
        # bumped whenever capacity is released (task ends or is evicted, node comes back)
        self.release_epoch = 0
        # foreign usage: milli-GPU held by what Phalanx does not schedule, and the part of it going away
        self.foreign_gpu_milli = 0
        self.leaving: list[Leaving] = []
        # what each node's foreign usage charged, so a driver can clear a node and record it anew
        self.foreign_on: list[list[tuple[DeviceAssignment, Leaving | None, ForeignUsage]]] = [
            [] for _ in ordered
        ]
        # nodes whose state changed (binds, evictions, foreign usage, readiness, what-ifs and their
        # undoing): a driver that keeps the snapshot looks again at these and at what its API changed,
        # not at every node; it empties the set when it has
        self.touched: set[int] = set()
        # workloads whose bound tasks changed, and those a cycle left with a standing (`settle`), and
        # those a driver gave earlier runs' service: what a driver that keeps the snapshot resets
        # between cycles, instead of every workload (it empties the sets when it has)
        self.rebound: set[str] = set()
        self.settled: set[str] = set()
        self.serviced: set[str] = set()
        # the clock of runs read from it (a driver that does not `advance` moves it once a cycle),
        # and the workloads whose run may have begun, ended or changed since the driver last
        # accounted them (it empties the set when it has)
        self.run_clock = RunClock()
        self.runs_changed: set[str] = set()
        # for the core's wake-up (`phalanx.core.wake`): the workloads whose run or service changed
        # since it last looked (a driver that writes a run's service adds it), and a count moved
        # when every running workload's did (`advance`); the rank changes it keeps
        self.ranks_moved: set[str] = set()
        self.service_epoch = 0
        self.rank_wakes: RankWakes | None = None
        # workload -> preemptor demand key -> when it was last evicted for one of that shape: kept
        # across cycles by the driver (the repeat guard of preempt and reclaim reads it)
        self.evicted_for: dict[str, dict[tuple[object, ...], float]] = {}
        # (time, workload, queue, GPU-seconds lost) of the evictions of the last WINDOW_S, oldest
        # first: what the eviction budgets count (`phalanx.actions.budget`); each workload once a cycle
        self._recent: collections.deque[Recent] = collections.deque()
        # MIG GPUs being cut anew (actions.repartition): (node, GPU position) -> when they are ready,
        # and when each GPU was last cut (a GPU is not cut again within the action's interval)
        self.recuts: dict[tuple[int, int], float] = {}
        self.recut_at: dict[tuple[int, int], float] = {}
        for i, node in enumerate(ordered):  # as a driver read them: done when the node says so
            for j, gpu in enumerate(node.gpus):
                if gpu.index in node.mig_recut_at:
                    self.recut_at[(i, j)] = node.mig_recut_at[gpu.index]
                if gpu.index in node.mig_recutting and gpu.mig_enabled:
                    self.recuts[(i, j)] = math.inf
        self._seeded = False
        self._static_masks: dict[tuple[object, ...], BoolArray] = {}
        # `feasibility.capacity_of`'s kept capacities, brought up to date from the cluster's change log
        self.capacity_memo: dict[object, object] = {}
        self._domains: dict[str, IntArray] = {}
        self._init_dra(dra_shared, dra_counter_sets)
        for w in workloads:
            self.add_workload(w)

    def _init_dra(self, shared: Sequence[DraDevice], counter_sets: Sequence[CounterSet]) -> None:
        """Devices published by DRA drivers: by id, and the list each node can reach, in order."""
        self.dra = DraState()
        self.dra.set_nodes([n.name for n in self.nodes])
        self.selector_cache = SelectorCache()
        # claims' shape -> which nodes can take them, and as of which node versions (core.drafit)
        self.dra_fit: dict[str, object] = {}
        self.dra_devices: dict[tuple[str, str, str], DraDevice] = {}
        self.dra_counter_sets: dict[tuple[str, str, str], CounterSet] = {cs.key: cs for cs in counter_sets}
        for n in self.nodes:
            for d in n.dra:
                self.dra_devices[d.id] = d
            for cs in n.counter_sets:
                self.dra_counter_sets[cs.key] = cs
        for d in shared:
            self.dra_devices[d.id] = d
        self.node_dra: list[tuple[DraDevice, ...]] = [
            tuple(n.dra)
            + tuple(d for d in shared if d.all_nodes or affinity_matches(n.name, n.labels, d.node_selector))
            for n in self.nodes
        ]
        self.has_dra = any(self.node_dra)
        # nodes whose GPUs a DRA driver publishes: only claims get them (no device-plugin requests)
        self.dra_gpu_nodes = np.array(
            [any(d.role in ("gpu", "mig") for d in devs) for devs in self.node_dra], dtype=np.bool_
        )

    # ----------------------------------------------------------------- queries
    @property
    def nodes(self) -> list[Node]:
        return self.cluster.nodes

    def node_index(self, name: str) -> int:
        try:
            return self.cluster.index[name]
        except KeyError:
            raise SpecError(f"node {name!r}", "no such node in the cluster") from None

    def pending_workloads(self) -> list[WorkloadEntry]:
        """Workloads with unbound tasks, in the order they were added (kept incrementally)."""
        return list(self._pending.values())

    def static_mask(self, request: TaskRequest) -> BoolArray:
        """Nodes whose labels and taints admit the request (labels and taints never change in a snapshot)."""
        key = (tuple(sorted(request.node_selector.items())), request.node_affinity, request.tolerations)
        mask = self._static_masks.get(key)
        if mask is None:
            mask = np.array(
                [_selector_matches(n, request) and _tolerated(n, request.tolerations) for n in self.nodes],
                dtype=np.bool_,
            )
            self._static_masks[key] = mask
        return mask

    def selector_mask(self, request: TaskRequest) -> BoolArray:
        key = ("selector", tuple(sorted(request.node_selector.items())), request.node_affinity)
        mask = self._static_masks.get(key)
        if mask is None:
            mask = np.array([_selector_matches(n, request) for n in self.nodes], dtype=np.bool_)
            self._static_masks[key] = mask
        return mask

    def domains(self, level: str) -> IntArray:
        """Domain id of every node at a topology level; nodes without the level get their own domain."""
        arr = self._domains.get(level)
        if arr is None:
            ids: dict[str, int] = {}
            out = np.empty(len(self.nodes), dtype=np.int64)
            for i, node in enumerate(self.nodes):
                value = node.name if level in ("node", "hostname") else node.topology.get(level)
                key = value if value is not None else f"\0{node.name}"
                out[i] = ids.setdefault(key, len(ids))
            arr = out
            self._domains[level] = arr
        return arr

    def set_cached(self, dataset: str, node: int, nbytes: int) -> None:
        """A node's cache now holds `nbytes` of `dataset` (the replay's dynamic data cache)."""
        arr = self._cache_bytes.get(dataset)
        if arr is None:
            arr = np.array([n.datasets.get(dataset, 0) for n in self.nodes], dtype=np.float64)
            self._cache_bytes[dataset] = arr
        arr[node] = nbytes
        self._static_masks.pop(("dataset", dataset), None)

    def dataset_fraction(self, dataset: str) -> np.ndarray:
        """Fraction of `dataset` cached on each node (0 when unknown)."""
        key = ("dataset", dataset)
        cached = self._static_masks.get(key)
        if cached is not None:
            return cached
        size: float = self.datasets.get(dataset, 0)
        # `namespace/name` as Kubernetes keys a Dataset; a bare name (a hand-written annotation,
        # a trace) stands for that name in any namespace
        bare = dataset.split("/", 1)[1] if "/" in dataset else dataset
        dyn = self._cache_bytes.get(dataset)
        values: list[float] = (
            [float(v) for v in dyn]
            if dyn is not None
            else [float(n.datasets.get(dataset, n.datasets.get(bare, 0))) for n in self.nodes]
        )
        if size <= 0:
            size = max(values, default=0)
        frac = np.array([min(1.0, v / size) if size > 0 else 0.0 for v in values], dtype=np.float64)
        self._static_masks[key] = frac  # type: ignore[assignment]
        return frac

    def observed_task_types(self) -> list[TaskType]:
        """Task types of all known workloads (pending and running), weighted by count."""
        return [TaskType(req, float(n)) for req, n in self._type_counts.values() if n > 0]

    def _count_types(self, tasks: Sequence[Task], sign: int) -> None:
        for t in tasks:
            r = t.request
            key = (r.cpu_milli, r.gpu.kind, r.gpu.devices, r.gpu.milli, r.gpu.memory_mib, r.gpu_models)
            req, n = self._type_counts.get(key, (r, 0))
            self._type_counts[key] = (req, n + sign)
        self.types_version += 1

    # ----------------------------------------------------------------- driver-side updates
    def add_workload(self, workload: Workload) -> WorkloadEntry:
        if workload.name in self.workloads:
            raise SpecError(f"workload {workload.name!r}", "a workload with this name already exists")
        topo = workload.topology
        if topo is not None and topo.level not in ("node", "hostname", *self.topology_levels):
            levels = ", ".join(("node", *self.topology_levels))
            raise SpecError(
                f"workload {workload.name!r}.topology.level",
                f"unknown topology level {topo.level!r} (this cluster has: {levels})",
            )
        if self.queues is not None and not self.queues.is_leaf(workload.queue):
            known = sorted(n for n in self.queues.queues if self.queues.is_leaf(n))
            what = "is not a leaf queue" if workload.queue in self.queues.queues else "is not a known queue"
            raise SpecError(
                f"workload {workload.name!r}.queue",
                f"{workload.queue!r} {what} (leaf queues: {', '.join(known) or 'none'})",
            )
        tasks = workload.tasks()
        for t in tasks:
            if t.name in self._tasks:
                raise SpecError(f"workload {workload.name!r}", f"task name {t.name!r} is already in use")
            self._check_request(t)
        entry = WorkloadEntry(workload, tasks)
        self.workloads[workload.name] = entry
        self._set_pending(entry, True)
        self.fresh.add(workload.name)
        for t in tasks:
            self._tasks[t.name] = (entry, t)
        self._count_types(tasks, +1)
        if self.queues is not None:
            self._add_vec(
                self.queue_pending,
                workload.queue,
                sum((self.request_vector(t.request) for t in tasks), np.zeros(3)),
            )
        return entry

    def remove_workload(self, name: str) -> None:
        """Forget a workload, releasing whatever it still holds."""
        entry = self.workloads.get(name)
        if entry is None:
            return
        for alloc in list(entry.bound.values()):
            self._unbind(alloc, entry)
        if self.queues is not None:
            self._add_vec(
                self.queue_pending,
                entry.workload.queue,
                -sum((self.request_vector(t.request) for t in entry.tasks), np.zeros(3)),
            )
        del self.workloads[name]
        self.evicted_for.pop(name, None)
        self._set_pending(entry, False)
        self.fresh.discard(name)
        for t in entry.tasks:
            self._tasks.pop(t.name, None)
        self._count_types(entry.tasks, -1)

    def release(self, task_name: str) -> None:
        """A task finished or was evicted by the driver: free its resources."""
        alloc = self.allocations.get(task_name)
        if alloc is None:
            return
        self._unbind(alloc, self.workloads[alloc.task.workload])

    def bind_existing(
        self,
        task_name: str,
        node: str,
        devices: DeviceAssignment,
        since: float = 0.0,
        claims: tuple[ClaimAllocation, ...] = (),
    ) -> None:
        """Record a task that already runs (e.g. rebuilt from pod annotations at start-up)."""
        entry, task = self._find_task(task_name)
        i = self.node_index(node)
        devices = self.cluster.pinned(i, task.request.exclusive_cpu, devices)
        self._bind(
            Allocation(task, i, devices, task.request.cpu_milli, task.request.memory_mib, since, claims),
            entry,
        )

    def hold_devices(self, node: int, devices: DeviceAssignment) -> None:
        """Devices in use by something this snapshot schedules no task for (another scheduler's claim)."""
        self.cluster.take(node, 0, 0, devices)
        self.touched.add(node)

    def reserve_claim(self, alloc: ClaimAllocation) -> None:
        """A claim allocated (by us or another scheduler) whose pods are not all running here yet."""
        self.dra.take(alloc, self.dra_devices)

    def add_foreign(self, usage: ForeignUsage) -> None:
        """Count capacity used by pods of other schedulers."""
        i = self.node_index(usage.node)
        c = self.cluster
        if usage.mig is not None:
            devices = self.assignment_of(Bind(usage.owner, "", usage.node, usage.gpus[:1], mig=usage.mig))
        else:
            positions = tuple(j for j, g in enumerate(self.nodes[i].gpus) if g.index in usage.gpus)
            mems = tuple(int(c.gpu_mem_cap[i, j] * usage.gpu_milli // 1000) for j in positions)
            devices = DeviceAssignment(gpus=positions, milli=usage.gpu_milli, gpu_memory_mib=mems)
        c.take(i, usage.cpu_milli, usage.memory_mib, devices)
        self.touched.add(i)
        self.foreign_gpu_milli += devices.milli * len(devices.gpus)
        lv = None
        if usage.ends is not None:
            lv = Leaving(usage.owner, i, usage.cpu_milli, usage.memory_mib, devices, usage.ends)
            self.leaving.append(lv)
        self.foreign_on[i].append((devices, lv, usage))

    def clear_node(self, i: int) -> None:
        """Release everything recorded on node `i` (our tasks and foreign usage): a driver that keeps
        its snapshot between cycles records a changed node anew instead of rebuilding every node."""
        for alloc in list(self.on_node[i].values()):
            self._unbind(alloc)
        c = self.cluster
        for devices, lv, usage in self.foreign_on[i]:
            if lv is not None:
                if lv not in self.leaving:  # let go of by a what-if that is not undone: already given
                    continue
                self.leaving.remove(lv)
            c.give(i, usage.cpu_milli, usage.memory_mib, devices)
            self.foreign_gpu_milli -= devices.milli * len(devices.gpus)
        if self.foreign_on[i]:
            self.release_epoch += 1
        self.foreign_on[i] = []
        self.touched.add(i)

    def let_go(self, lv: Leaving, gone: bool = True) -> None:
        """A leaving usage is gone (what-ifs and forecasts), or back with `gone=False` (to undo that,
        newest first)."""
        self.touched.add(lv.node)
        if gone:
            self.leaving.remove(lv)
            self.cluster.give(lv.node, lv.cpu_milli, lv.memory_mib, lv.devices)
            self.foreign_gpu_milli -= lv.devices.milli * len(lv.devices.gpus)
            self.release_epoch += 1
        else:
            self.leaving.append(lv)
            self.cluster.take(lv.node, lv.cpu_milli, lv.memory_mib, lv.devices)
            self.foreign_gpu_milli += lv.devices.milli * len(lv.devices.gpus)

    def set_node_ready(self, name: str, ready: bool) -> None:
        self.cluster.set_ready(self.node_index(name), ready)
        self.touched.add(self.node_index(name))
        if ready:
            self.release_epoch += 1

    def apply(self, result: CycleResult, now: float = 0.0) -> None:
        """Carry out a cycle's decisions on this cache (evictions first, then binds, then recuts)."""
        for ev in result.evictions:
            self.release(ev.task)
        for b in result.binds:
            self.bind_existing(b.task, b.node, self.assignment_of(b), since=now, claims=b.claims)
        self.begin_recuts(result, now)
        self.settle(result)
        self.note_evictions(result, now)

    def begin_recuts(self, result: CycleResult, now: float) -> None:
        """The cycle's repartitions: each GPU serves nothing until its new instances are ready."""
        for r in result.repartitions:
            i = self.node_index(r.node)
            j = next(k for k, g in enumerate(self.nodes[i].gpus) if g.index == r.gpu)
            layout = frozenset((p, int(st)) for p, _, st in (x.partition("@") for x in r.after))
            self.cluster.recut(i, j, layout)
            self.recuts[(i, j)] = r.until
            self.recut_at[(i, j)] = now
            self.touched.add(i)

    def finish_recuts(self, now: float) -> None:
        """Recuts whose time has come: their GPUs serve their new layouts."""
        for key, until in list(self.recuts.items()):
            if until <= now:
                del self.recuts[key]
                self.cluster.recut_done(*key)
                self.touched.add(key[0])
                self.release_epoch += 1  # new room: workloads parked for want of it are looked at again

    def note_evictions(self, result: CycleResult, now: float) -> None:
        """Remember, per evicted workload, the shape of the workload each eviction made room for,
        and when each workload was evicted (`recent_evictions`)."""
        cost: dict[str, float] = {}
        for ev in result.evictions:
            by = self.workloads.get(ev.by) if ev.by else None
            if by is not None and ev.by != ev.workload:
                self.evicted_for.setdefault(ev.workload, {})[by.demand_key] = now
            if ev.workload in self.workloads:
                cost[ev.workload] = cost.get(ev.workload, 0.0) + ev.cost
        for w, lost in cost.items():
            self._recent.append((now, w, self.workloads[w].workload.queue, lost))
        recent = self._recent  # pruned as it grows (a scheduler without budgets never reads it)
        while recent and now - recent[0][0] >= WINDOW_S:
            recent.popleft()

    def lend_recent(self, recent: collections.deque[Recent]) -> None:
        """The driver's own record of the hour's evictions, kept across snapshots built anew: a
        snapshot's record would start empty with each (nodes or queues changed, a new leader), and
        forget every eviction of a workload that has gone since (a Job's pod evicted and remade
        under another name), so the budgets let through several times what they say."""
        if recent is not self._recent:
            merged = sorted({*recent, *self._recent})
            recent.clear()
            recent.extend(merged)
            self._recent = recent

    def seed_recent(self, now: float) -> None:
        """Once per snapshot: the evictions of the last hour from `evicted_for` (a driver's memory
        lent to a snapshot built anew, e.g. after a restart), beside those already noted."""
        if self._seeded:
            return
        self._seeded = True
        have = {(r[0], r[1]) for r in self._recent}
        for w, shapes in self.evicted_for.items():
            entry = self.workloads.get(w)
            if entry is None:
                continue
            for t in set(shapes.values()):
                if now - t < WINDOW_S and (t, w) not in have:
                    self._recent.append((t, w, entry.workload.queue, 0.0))  # its cost was not kept
        merged = sorted(self._recent)  # in place: a record lent by the driver stays the driver's
        self._recent.clear()
        self._recent.extend(merged)

    def recent_evictions(self, now: float) -> list[Recent]:
        """(time, workload, queue, GPU-seconds lost) of each eviction in the last WINDOW_S before
        `now`, oldest first.
        Read, never pruned: a forecast reads it at later clocks on this very snapshot, and pruning
        there emptied the record the next cycle's budgets count (only `note_evictions` prunes,
        at the cycle's own clock)."""
        return [r for r in self._recent if now - r[0] < WINDOW_S]

    def look_again(self, workloads: Iterable[str]) -> None:
        """Workloads a driver could not bind as decided (deferred, undone): waiting again with no reason
        of their own, they are looked at anew, as after an eviction (else, behind alike ones that do
        not fit, no cycle would try them or say why they wait)."""
        self.fresh.update(w for w in workloads if w in self.workloads)

    def settle(self, result: CycleResult) -> None:
        """The bookkeeping after a cycle whose decisions are in place: who was looked at, who is parked."""
        for b in result.binds:
            self.fresh.discard(b.workload)
        for ev in result.evictions:  # waiting again, with no reason of its own: to be looked at anew
            entry = self.workloads.get(ev.workload)
            if entry is not None and not entry.bound:
                self.fresh.add(ev.workload)
        for p in result.pending:
            self.fresh.discard(p.workload)
            entry = self.workloads.get(p.workload)
            if entry is not None:
                entry.last_pending = p
                entry.parked_epoch = self.release_epoch if p.unschedulable else -1
                self.settled.add(entry.name)

    def assignment_of(self, b: Bind) -> DeviceAssignment:
        """Rebuild array positions from a Bind's device indices."""
        i = self.node_index(b.node)
        node = self.nodes[i]
        gpos = {g.index: j for j, g in enumerate(node.gpus)}
        npos = {x.index: j for j, x in enumerate(node.nics)}
        try:
            gpus = tuple(gpos[x] for x in b.gpus)
            nics = tuple(npos[x] for x in b.nics)
        except KeyError as e:
            raise SpecError(f"bind {b.task}", f"node {b.node} has no device {e.args[0]}") from None
        if b.mig is not None:
            gpu = node.gpus[gpus[0]]
            geo = resolve_geometry(gpu.model, gpu.memory_mib)
            if geo is None:
                raise SpecError(f"bind {b.task}", f"GPU {gpu.index} of {b.node} has no MIG geometry")
            prof = geo.profile(b.mig.profile)
            return DeviceAssignment(
                gpus=gpus,
                mig=MigSlice(prof.name, b.mig.start),
                mig_compute=prof.compute,
                mig_mask=prof.slot_mask(b.mig.start),
                nics=nics,
                backend=b.backend,
            )
        whole = b.gpu_milli >= 1000
        if whole:
            mems = tuple(int(self.cluster.gpu_mem_cap[i, j]) for j in gpus)
        else:
            mems = (b.gpu_memory_mib,) * len(gpus)
        return DeviceAssignment(
            gpus=gpus, milli=b.gpu_milli, gpu_memory_mib=mems, nics=nics, whole=whole, backend=b.backend
        )

    def bind_of(self, alloc: Allocation) -> Bind:
        c = self.cluster
        d = alloc.devices
        return Bind(
            task=alloc.task.name,
            workload=alloc.task.workload,
            node=self.nodes[alloc.node].name,
            gpus=tuple(c.gpu_index(alloc.node, j) for j in d.gpus),
            gpu_milli=d.milli,
            gpu_memory_mib=d.gpu_memory_mib[0] if d.gpu_memory_mib else 0,
            mig=d.mig,
            nics=tuple(c.nic_index(alloc.node, j) for j in d.nics),
            claims=alloc.claims,
            backend=d.backend,
        )

    def evict_of(self, alloc: Allocation, reason: str, by: str = "", cost: float = 0.0) -> Evict:
        return Evict(alloc.task.name, alloc.task.workload, self.nodes[alloc.node].name, reason, by, cost)

    # ----------------------------------------------------------------- primitives (journaled by Statement)
    def _bind(self, alloc: Allocation, entry: WorkloadEntry | None = None) -> None:
        entry = entry or self.workloads[alloc.task.workload]
        if entry.run_since is not None:
            entry.settle_run()  # its GPUs change: what it received so far stays counted
        if alloc.task.name in self.allocations:
            raise SpecError(f"task {alloc.task.name!r}", "is already bound")
        self.cluster.take(alloc.node, alloc.cpu_milli, alloc.memory_mib, alloc.devices)
        self.touched.add(alloc.node)
        self.rebound.add(entry.name)
        self.ranks_moved.add(entry.name)
        for c in alloc.claims:
            self.dra.take(c, self.dra_devices)
        entry.bound[alloc.task.name] = alloc
        entry.gpu_milli += alloc_milli(alloc)
        self.allocations[alloc.task.name] = alloc
        self.on_node[alloc.node][alloc.task.name] = alloc
        if len(entry.bound) == len(entry.tasks):
            self._set_pending(entry, False)
        else:
            self.partial.add(entry.name)
        if len(entry.bound) >= entry.workload.gang_size:
            self._ready[entry.name] = entry
        q = entry.workload.queue
        self.queue_gpu_milli[q] = self.queue_gpu_milli.get(q, 0) + alloc.devices.milli * len(
            alloc.devices.gpus
        )
        if self.queues is not None:
            self._use(q, self.alloc_vector(alloc))
            self._sub_vec(self.queue_pending, q, self.request_vector(alloc.task.request))

    def _unbind(self, alloc: Allocation, entry: WorkloadEntry | None = None) -> None:
        entry = entry or self.workloads[alloc.task.workload]
        if entry.run_since is not None:
            entry.settle_run()  # its GPUs change: what it received so far stays counted
        self.cluster.give(alloc.node, alloc.cpu_milli, alloc.memory_mib, alloc.devices)
        self.touched.add(alloc.node)
        self.rebound.add(entry.name)
        self.ranks_moved.add(entry.name)
        for c in alloc.claims:
            self.dra.give(c.claim, self.dra_devices)
        del entry.bound[alloc.task.name]
        entry.gpu_milli -= alloc_milli(alloc)
        del self.allocations[alloc.task.name]
        del self.on_node[alloc.node][alloc.task.name]
        self._set_pending(entry, True)
        if not entry.bound:
            self.partial.discard(entry.name)
        if len(entry.bound) < entry.workload.gang_size:
            self._ready.pop(entry.name, None)
        self.release_epoch += 1
        q = entry.workload.queue
        self.queue_gpu_milli[q] -= alloc.devices.milli * len(alloc.devices.gpus)
        if self.queues is not None:
            self._use(q, self.alloc_vector(alloc), minus=True)
            self._add_vec(self.queue_pending, q, self.request_vector(alloc.task.request))

    # ----------------------------------------------------------------- queue accounting
    def _use(self, queue: str, v: Vector, minus: bool = False) -> None:
        """Add `v` to the queue's usage (subtract it with `minus`: x - v is x + (-v) to the bit,
        without a negated copy of v at every unbind)."""
        tree = self.queues
        assert tree is not None
        step = self._sub_vec if minus else self._add_vec
        step(self.queue_usage, queue, v)
        self.usage_version += 1
        self.usage_total = self.usage_total - v if minus else self.usage_total + v
        subtree = self.subtree_usage
        for a in tree.ancestors(queue) if queue in tree.queues else (queue,):
            step(subtree, a, v)

    @staticmethod
    def _add_vec(table: dict[str, Vector], key: str, v: Vector) -> None:
        cur = table.get(key)
        table[key] = v.copy() if cur is None else cur + v

    @staticmethod
    def _sub_vec(table: dict[str, Vector], key: str, v: Vector) -> None:
        """`_add_vec(table, key, -v)`, the same to the bit."""
        cur = table.get(key)
        table[key] = -v if cur is None else cur - v

    def gpu_weight(self, node: int) -> float:
        return self.queues.gpu_weight(self.nodes[node].gpu_model) if self.queues is not None else 1.0

    def alloc_vector(self, alloc: Allocation) -> Vector:
        """What a running task counts against its queue: (weighted milli-GPU, milli-CPU, MiB); read-only."""
        d = alloc.devices
        mig = d.mig is not None
        key = (
            alloc.node,
            d.mig_compute if mig else d.milli,
            -1 if mig else len(d.gpus),
            alloc.cpu_milli,
            alloc.memory_mib,
        )
        v = self._alloc_vecs.get(key)
        if v is None:
            gpu = d.mig_compute * 1000 / 7 if mig else d.milli * len(d.gpus)
            v = np.array(
                [gpu * self.gpu_weight(alloc.node), alloc.cpu_milli, alloc.memory_mib], dtype=np.float64
            )
            v.flags.writeable = False
            if len(self._alloc_vecs) > 65536:  # bounded: shapes x nodes
                self._alloc_vecs.clear()
            self._alloc_vecs[key] = v
        return v

    def request_vector(self, req: TaskRequest) -> Vector:
        """What a pending task asks of its queue (GPU weighted by the cheapest model it accepts).

        Read-only: worked out once per request object and shared.
        """
        had = self._req_vecs.get(id(req))
        if had is not None and had[0] is req:
            return had[1]
        v = self._request_vector(req)
        v.flags.writeable = False
        if len(self._req_vecs) > 65536:  # bounded: requests of workloads long gone go
            self._req_vecs.clear()
        self._req_vecs[id(req)] = (req, v)
        return v

    def _request_vector(self, req: TaskRequest) -> Vector:
        gpu = self.gpu_milli_asked(req)
        w = 1.0
        if self.queues is not None and req.gpu_models:
            w = min(self.queues.gpu_weight(m) for m in req.gpu_models)
        return np.array([gpu * w, req.cpu_milli, req.memory_mib], dtype=np.float64)

    def gpu_milli_asked(self, req: TaskRequest) -> float:
        """The GPU a task asks, in milli-GPU of no model in particular (memory by the median GPU's,
        MIG by compute share): the queue's count before any GPU-model weight."""
        g = req.gpu
        gpu: float
        if g.kind is GpuKind.MEMORY:
            gpu = g.devices * min(1000, -(-g.memory_mib * 1000 // self.median_gpu_memory))
        elif g.kind is GpuKind.MIG:
            prof = next(
                (geo.profiles[g.mig_profile] for geo in GEOMETRIES.values() if g.mig_profile in geo.profiles),
                None,
            )
            gpu = prof.compute * 1000 / 7 if prof is not None else 0.0
        else:
            gpu = g.total_milli
        return gpu

    def capacity_vector(self) -> Vector:
        """All the cluster's (weighted milli-GPU, milli-CPU, MiB); nodes never change in a snapshot."""
        if self._capacity is None:
            c = self.cluster
            gpu = sum(
                int(c.gpu_count[i]) * 1000 * self.gpu_weight(i) for i in range(len(c)) if c.gpu_count[i]
            )
            self._capacity = np.array([gpu, float(c.cpu_cap.sum()), float(c.mem_cap.sum())], dtype=np.float64)
        return self._capacity.copy()

    def usage_of(self, queue: str) -> Vector:
        """Usage of a queue and everything below it."""
        table = self.queue_usage if self.queues is None else self.subtree_usage
        use = table.get(queue)
        return use if use is not None else np.zeros(3)

    def leaf_demand(self, tree: QueueTree) -> dict[str, Vector]:
        """Each leaf queue's demand, as fair shares are computed from it: what it uses plus what it
        waits for (never below zero)."""
        return {
            q: self.queue_usage.get(q, np.zeros(3)) + np.maximum(self.queue_pending.get(q, np.zeros(3)), 0)
            for q in tree.queues
            if tree.is_leaf(q)
        }

    def fair_shares(self, tree: QueueTree) -> dict[str, Vector]:
        """Every queue's fair share of the whole cluster now: what the cycle enforces (`Session`) and
        what the operator is shown (board, status, PodGroup and Queue status) alike.

        Kept while the tree, the capacity and every leaf's demand stay bit for bit (a cycle where
        nothing arrived, started or ended): the water-filling is then worked out for nothing.
        The shares are read-only.
        """
        cap = self.capacity_vector()
        demand = self.leaf_demand(tree)
        key = (cap.tobytes(), tuple((q, v.tobytes()) for q, v in demand.items()))
        kept = self._fair_kept
        if kept is not None and kept[0] is tree and kept[1] == key:
            return dict(kept[2])
        out = queue_fair_shares(tree, cap, demand)
        for v in out.values():
            v.flags.writeable = False
        self._fair_kept = (tree, key, out)
        return dict(out)

    def advance(self, now: float, half_life: float = 0.0) -> None:
        """Account the time since the last call (driver-side, between cycles).

        Running workloads gain attained service (GPU-seconds) and executed time; with a
        half-life, each queue's historical usage decays towards its current usage.
        """
        if self.history_time is None:
            self.history_time = now
            return
        dt = max(0.0, now - self.history_time)
        self.history_time = now
        if dt == 0:
            return
        if self.running:
            self.service_epoch += 1
        for entry in self.running.values():
            entry.attained_base += gpu_seconds(entry.gpu_milli, dt)
            entry.executed_base += dt
        if half_life > 0:
            decay_history(self.queue_history, self.queue_usage, dt, half_life)

    @property
    def running(self) -> dict[str, WorkloadEntry]:
        """Workloads whose gang is placed (they make progress), kept incrementally."""
        return self._ready

    @property
    def median_gpu_memory(self) -> int:
        if self._median_mem is None:
            mem = self.cluster.gpu_mem_cap[self.cluster.gpu_kind == KIND_SHARED]
            mem = mem[mem > 0]  # 0: the node does not say (no GPU Feature Discovery label)
            self._median_mem = int(np.median(mem)) if len(mem) else 16384
        return self._median_mem

    def _set_pending(self, entry: WorkloadEntry, pending: bool) -> None:
        key = entry.demand_key
        group = self.pending_groups.get(key)
        if pending:
            self._pending[entry.name] = entry
            if group is None:
                group = self.pending_groups[key] = {}
                self.group_order[key] = []
            if entry.name not in group:
                group[entry.name] = entry
                bisect.insort(self.group_order[key], natural_key(entry))
                q = entry.workload.queue
                self.pending_per_queue[q] = self.pending_per_queue.get(q, 0) + 1
            if entry.bound:
                self.partial.add(entry.name)
        else:
            self._pending.pop(entry.name, None)
            self.partial.discard(entry.name)
            if group is not None and entry.name in group:
                del group[entry.name]
                q = entry.workload.queue
                left = self.pending_per_queue[q] - 1
                if left:
                    self.pending_per_queue[q] = left
                else:
                    del self.pending_per_queue[q]
                order = self.group_order[key]
                del order[bisect.bisect_left(order, natural_key(entry))]
                if not group:
                    del self.pending_groups[key]
                    del self.group_order[key]

    def entry_of_task(self, task_name: str) -> WorkloadEntry:
        """The workload a task belongs to."""
        return self._find_task(task_name)[0]

    def _find_task(self, task_name: str) -> tuple[WorkloadEntry, Task]:
        found = self._tasks.get(task_name)
        if found is None:
            raise SpecError(f"task {task_name!r}", "belongs to no known workload")
        return found

    def _check_request(self, task: Task) -> None:
        models = task.request.gpu_models
        if models:
            known = set(self.cluster.models)
            unknown = sorted(m for m in models if m not in known)
            if unknown and not (models & known):
                raise SpecError(
                    f"task {task.name!r}.gpu_models",
                    f"unknown GPU model(s) {', '.join(unknown)}; "
                    f"the cluster has {', '.join(self.cluster.models) or 'none'}",
                )


def _selector_matches(node: Node, request: TaskRequest) -> bool:
    if not all(node.labels.get(k) == v for k, v in request.node_selector.items()):
        return False
    return affinity_matches(node.name, node.labels, request.node_affinity)


def _tolerated(node: Node, tolerations: Sequence[Toleration]) -> bool:
    for taint in node.taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return False
    return True
