"""Pods recorded into the snapshot node by node, and the snapshot carried from one cycle to the next.

A cycle used to build a fresh snapshot and record every bound pod into it, so its cost grew with
the cluster, not with what changed (issue 25). Now the scheduler keeps its last snapshot (`Carry`)
and records anew only the nodes whose pods changed; workloads whose pods did not change keep their
entry. There is still one source of truth, the snapshot itself: what a node holds is compared with
what was recorded there (allocation by allocation, so binds and evictions a cycle made, or a
what-if left behind, make the node record anew), and whenever the nodes, the queues or the datasets
change the snapshot is built from scratch; so is every full read while DRA objects exist (claims
hold devices across nodes; the world patched from the change feed is kept meanwhile). Nodes are
independent in the snapshot, so recording a node anew gives what a fresh snapshot would have
(tests/test_carry.py builds both after random event sequences and compares them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from phalanx.core.cluster import MigSlice
from phalanx.core.decisions import Bind
from phalanx.core.devices import default_assignment
from phalanx.core.errors import SpecError
from phalanx.core.feasibility import find_candidates
from phalanx.core.model import MILLI, GpuKind, Workload
from phalanx.core.snapshot import Allocation, ForeignUsage, Snapshot
from phalanx.k8s import keys
from phalanx.k8s.read.devices import decode
from phalanx.k8s.read.pods import PodInfo
from phalanx.plugins.order import LasOrder

if TYPE_CHECKING:  # world.py and patch.py build on this module
    from phalanx.k8s.read.patch import Index
    from phalanx.k8s.read.world import World

# one of our pods to record on a node, and another scheduler's pod there with the GPUs it should
# get first and when it ends (a pod being deleted)
Foreign = tuple[PodInfo, tuple[int, ...], float | None]


@dataclass
class NodeRecord:
    """What a node was recorded from, and what the snapshot held there right after."""

    sig: tuple[object, ...]
    allocs: tuple[Allocation, ...]
    foreign: int
    outcomes: tuple[Bind | None, ...]  # per pod of ours, in order: its Bind, or None if it did not fit


@dataclass
class Carry:
    """The snapshot a cycle leaves for the next, with what it was built from."""

    snap: Snapshot | None = None
    base: tuple[object, ...] | None = None
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    workloads: dict[str, tuple[tuple[object, ...], Workload]] = field(default_factory=dict)
    made: set[str] = field(default_factory=set)  # workloads given a new Workload object this cycle
    world: World | None = None  # the last world built
    index: Index | None = None  # what it was made of, by key, to patch it from the change feed
    at: int | None = None  # the watch cache's generation it was read at (None: not from a store)
    stamp: object = None  # what its inputs were a version of
    applied: bool = True  # the cycle after it changed the snapshot (binds, evictions): not reusable
    reused: int = 0  # cycles that reused the last world as it was
    rebuilt: int = 0  # cycles that built the snapshot from scratch
    patched: int = 0  # cycles that patched the last world from the change feed
    recorded: int = 0  # nodes recorded anew in the last cycle

    def start(self, base: tuple[object, ...] | None, make: Callable[[], Snapshot]) -> tuple[Snapshot, bool]:
        """The carried snapshot if `base` (nodes, queues, datasets) is what it was built from, else a new
        one (and whether it was kept). `base` None: a new one, never kept by the next `start` either."""
        self.made = set()
        if self.snap is not None and self.base is not None and base is not None and _same(self.base, base):
            return self.snap, True
        self.snap, self.base, self.nodes = make(), base, {}
        self.rebuilt += 1
        return self.snap, False

    def drop(self) -> None:
        """Forget the snapshot: the next cycle builds from scratch (a cycle failed, leadership moved)."""
        self.snap, self.base, self.nodes = None, None, {}
        self.world, self.stamp, self.applied = None, None, True
        self.index, self.at = None, None

    def keep(self, world: World, stamp: object) -> None:
        """The world just built, for a next cycle whose inputs carry the same stamp."""
        self.world, self.stamp, self.applied = world, stamp, False

    def unchanged(self, stamp: object) -> bool:
        """Whether last cycle's world stands as it is: same inputs, nothing applied since, no clock read."""
        ok = (
            self.world is not None
            and self.snap is not None
            and self.stamp is not None
            and not self.applied
            and not self.world.time_bound
            and _same(self.stamp, stamp)
        )
        if ok:
            self.reused += 1
            self.recorded = 0
        return ok

    def workload(self, name: str, key: tuple[object, ...], make: Callable[[], Workload]) -> Workload:
        """The same Workload object as last cycle while its inputs are equal, so its entry is kept."""
        hit = self.workloads.get(name)
        if hit is not None and _same(hit[0], key):
            return hit[1]
        wl = make()
        self.workloads[name] = (key, wl)
        self.made.add(name)
        return wl

    def forget_workloads_except(self, alive: Iterable[str]) -> None:
        for name in self.workloads.keys() - set(alive):
            del self.workloads[name]


def _same(a: object, b: object) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a value that does not compare (an array inside): treat as changed
        return False


def prune(snap: Snapshot, wanted: dict[str, Workload], made: set[str]) -> None:
    """Forget the workloads this cycle does not have, or has anew (`made`: a new Workload object this
    cycle); what they hold is released. Every other workload of a kept snapshot is the one the carry
    handed out, so only those two sets are looked at. The driver's memory of evictions (handed to the
    snapshot last cycle) is not the snapshot's to forget."""
    snap.evicted_for = {}
    for name in snap.workloads.keys() - wanted.keys():
        snap.remove_workload(name)
    for name in made:
        entry = snap.workloads.get(name)
        if entry is not None and entry.workload is not wanted.get(name):
            snap.remove_workload(name)


def reset_cycle_state(snap: Snapshot) -> None:
    """What a fresh snapshot starts each cycle with: every workload not looked at yet, none parked,
    no service but the run it is on (read from the snapshot's clock, `serve`), and no place in an
    order's queue (LAS `within: queue` keeps one in the simulator, whose snapshot lives the whole
    replay; the adapter's cycles have always started without it). Only workloads whose standing,
    tasks or service changed are visited (`Snapshot.settled`, `rebound`, `serviced`): the others
    are as a fresh one's."""
    workloads = snap.workloads
    reset = snap.settled | snap.rebound | snap.serviced
    snap.ranks_moved |= reset  # their service is counted again
    for name in reset:
        entry = workloads.get(name)
        if entry is not None:
            entry.parked_epoch = -1
            entry.last_pending = None
            entry.attained_base = 0.0  # the run going on, if any, is read from its clock
            entry.executed_base = 0.0
    snap.settled.clear()
    snap.serviced.clear()
    if LasOrder.keeps_places:
        for entry in workloads.values():
            LasOrder.forget(entry)
    snap.fresh = set(workloads)
    snap.evicted_for = {}  # the driver's memory of evictions, handed over each cycle


def record_nodes(
    snap: Snapshot,
    carry: Carry | None,
    ours: dict[str, list[PodInfo]],
    others: dict[str, list[Foreign]],
    reserved: dict[str, list[Foreign]],
    now: float,
    only: Iterable[str] | None = None,
) -> dict[str, Bind | None]:
    """Record each node's pods as a fresh snapshot would (ours first; then other schedulers' and
    blocked gangs' pods, ours that do not fit, and GPU reservation pods), keeping the nodes whose pods
    and snapshot state did not change. Returns each of our pods' outcome: its Bind, or None when it
    does not fit where it runs (then it counts as another scheduler's there). `only`: the nodes to look
    at (a world patched from the change feed), in the snapshot's order; None: every node."""
    out: dict[str, Bind | None] = {}
    records = carry.nodes if carry is not None else {}
    recorded = 0
    nodes = snap.cluster.nodes
    visit = range(len(nodes)) if only is None else sorted(snap.node_index(n) for n in only)
    for i in visit:
        name = nodes[i].name
        mine, theirs, held = ours.get(name, []), others.get(name, []), reserved.get(name, [])
        rec = records.get(name)
        # readiness too: a pod of ours with no devices noted is placed on its node by the predicates,
        # which a node that is not ready fails (it then counts as another scheduler's there)
        sig = (bool(snap.cluster.node_ready[i]), tuple(mine), tuple(theirs), tuple(held))
        if rec is not None and _unchanged(snap, i, rec, sig):
            out.update(zip((p.key for p in mine), rec.outcomes, strict=True))
            continue
        if rec is None and not (mine or theirs or held or snap.on_node[i] or snap.foreign_on[i]):
            continue
        recorded += 1
        snap.clear_node(i)
        outcomes = tuple(_rebuild(snap, p, name, now) for p in mine)
        failed = [(p, (), None) for p, b in zip(mine, outcomes, strict=True) if b is None and p.node]
        for p, prefer, ends in [*theirs, *failed, *held]:
            _foreign(snap, p, prefer, ends)
        out.update(zip((p.key for p in mine), outcomes, strict=True))
        if carry is not None:
            records[name] = NodeRecord(
                sig, tuple(snap.on_node[i].values()), len(snap.foreign_on[i]), outcomes
            )
    if carry is not None:
        carry.recorded = recorded
    return out


def _unchanged(snap: Snapshot, i: int, rec: NodeRecord, sig: tuple[object, ...]) -> bool:
    held = snap.on_node[i]
    if len(held) != len(rec.allocs) or len(snap.foreign_on[i]) != rec.foreign:
        return False
    if any(held.get(a.task.name) is not a for a in rec.allocs):
        return False
    return _same(rec.sig, sig)


def _rebuild(snap: Snapshot, p: PodInfo, node: str, now: float) -> Bind | None:
    """Record our pod on `node` with the devices its annotations name (or any that fit); None if it cannot."""
    entry = snap.entry_of_task(p.key)
    since = p.started or p.created or now
    try:
        b = decode(p.annotations, p.key, entry.name, node)
        if b.gpus or p.request.gpu.kind is GpuKind.NONE:
            snap.bind_existing(p.key, node, snap.assignment_of(b), since=since)
            return b
    except (SpecError, AssertionError, ValueError):
        pass
    if not p.node:
        return None  # a plan that no longer holds is dropped, never re-chosen behind the core's back
    i = snap.node_index(node)
    cand = find_candidates(snap, p.request, within=np.array([i], dtype=np.int64))
    if not len(cand):
        return None
    devices = default_assignment(snap.cluster, i, cand.usable(0), p.request)
    if devices is None:
        return None
    snap.bind_existing(p.key, node, devices, since=since)
    return snap.bind_of(snap.allocations[p.key])


def _foreign(snap: Snapshot, p: PodInfo, prefer: tuple[int, ...] = (), ends: float | None = None) -> None:
    """Another scheduler's pod: its CPU and memory, and its GPUs on the ones it names or the first free;
    a MIG instance where its annotations name one that is free (a reservation pod holding it). A pod
    we placed (a victim terminating, one that no longer fits) names its GPUs in its annotations: it
    holds those, not the first free ones, which a pod bound now might otherwise be given."""
    prefer = prefer or _annotated_gpus(p)
    i = snap.node_index(p.node)
    c = snap.cluster
    g = p.request.gpu
    mig = _named_slice(snap, p) if g.kind is GpuKind.MIG else None
    if mig is not None:
        cpu, mem = min(p.request.cpu_milli, int(c.cpu_free[i])), min(p.request.memory_mib, int(c.mem_free[i]))
        snap.add_foreign(ForeignUsage(p.node, cpu, mem, (mig[0],), 0, p.key, ends, mig=mig[1]))
        return
    want = g.devices if g.kind in (GpuKind.WHOLE, GpuKind.FRACTION, GpuKind.MEMORY) else 0
    milli = g.milli if g.kind in (GpuKind.WHOLE, GpuKind.FRACTION) else MILLI
    free = [j for j in range(int(c.gpu_count[i])) if c.gpu_milli_free[i, j] >= milli]
    named = [j for j in free if snap.nodes[i].gpus[j].index in prefer]
    free = named + [j for j in free if j not in named]
    gpus = tuple(snap.nodes[i].gpus[j].index for j in free[:want])
    cpu = min(p.request.cpu_milli, int(c.cpu_free[i]))
    mem = min(p.request.memory_mib, int(c.mem_free[i]))
    snap.add_foreign(ForeignUsage(p.node, cpu, mem, gpus, milli if gpus else MILLI, p.key, ends))


def _annotated_gpus(p: PodInfo) -> tuple[int, ...]:
    """The GPU indices a pod's `phalanx.io/gpu-devices` names (none when absent or unreadable)."""
    text = str(p.annotations.get(keys.GPU_DEVICES, ""))
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        return ()


def _named_slice(snap: Snapshot, p: PodInfo) -> tuple[int, MigSlice] | None:
    """The MIG instance a pod's `phalanx.io/mig-slice` and `phalanx.io/gpu-devices` name, of the
    profile it asks, if it is free on its node (one taken already is not counted twice)."""
    notes = p.annotations
    prof, _, start = str(notes.get(keys.MIG_SLICE, "")).partition("@")
    gpu = str(notes.get(keys.GPU_DEVICES, "")).strip()
    if prof != p.request.gpu.mig_profile or not start.isdigit() or not gpu.isdigit():
        return None
    mig = MigSlice(prof, int(start))
    try:
        a = snap.assignment_of(Bind(p.key, "", p.node, (int(gpu),), mig=mig))
    except SpecError:  # no such GPU, or none with that profile
        return None
    i = snap.node_index(p.node)
    if not snap.nodes[i].gpus[a.gpus[0]].mig_enabled or snap.cluster.mig_used[i, a.gpus[0]] & a.mig_mask:
        return None
    return int(gpu), mig
