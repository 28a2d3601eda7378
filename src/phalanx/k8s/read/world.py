"""The cache's API objects -> one snapshot for a cycle, and what could not be taken in.

Pods of ours that are bound (or whose gang plan names a node, before a restart cut the
binds short) are rebuilt with the devices their annotations record. Pods of other
schedulers count as used capacity on their nodes. Objects that cannot be read are left out
with a message naming them (`Kind namespace/name: what is wrong`); the scheduler turns those
into Events and conditions, and the rest goes on. Containment is in one place (`Contain`):
whatever error a translation raises, for whatever kind, ends there and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from phalanx.core.decisions import Bind
from phalanx.core.model import MIG_BACKEND, GpuRequest, Node, Workload
from phalanx.core.queues import QueueTree
from phalanx.core.snapshot import Snapshot
from phalanx.k8s import keys
from phalanx.k8s.client.cache import object_key
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read import composite, native
from phalanx.k8s.read.carry import Carry, Foreign, prune, record_nodes, reset_cycle_state
from phalanx.k8s.read.claims import Claims, DraObjects, with_dra
from phalanx.k8s.read.contain import Contain, describe, label, mapping, mappings, outlined
from phalanx.k8s.read.datasets import Distributed, failed_reason, read_distributed
from phalanx.k8s.read.extended import ExtendedAsk
from phalanx.k8s.read.group_rules import apply_kueue, apply_plans, created, job_parallelism
from phalanx.k8s.read.groups import Group, ended_members, group_pods, workload_of
from phalanx.k8s.read.kueue import Kueue
from phalanx.k8s.read.nodes import dataset_sizes
from phalanx.k8s.read.pods import PodInfo, is_active
from phalanx.k8s.read.queues import build_tree
from phalanx.k8s.read.reservations import Slot, slot_of
from phalanx.k8s.read.shard import shard_queues
from phalanx.k8s.read.translations import Translations
from phalanx.spec.dra import Devices, parse_slices


@dataclass
class World:
    snapshot: Snapshot
    tree: QueueTree | None
    pods: dict[str, PodInfo] = field(default_factory=dict)  # ours, by task name (namespace/name)
    groups: dict[str, Group] = field(default_factory=dict)  # by workload name
    # the groups with Kubernetes-native objects (PodGroups, CompositePodGroups): those whose status
    # the scheduler writes, kept as groups are staged (most groups of a large cluster have none)
    native_groups: set[str] = field(default_factory=set)
    blocked: dict[str, list[str]] = field(default_factory=dict)  # workload -> why it cannot run
    # blocked workloads that only wait for pods not created yet: workload -> within the creation grace
    waiting_pods: dict[str, bool] = field(default_factory=dict)
    # PodGroup objects (any dialect) by group, and our ended pods of named groups by group and phase
    pod_groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    ended: dict[str, dict[str, int]] = field(default_factory=dict)
    pod_problems: dict[str, str] = field(default_factory=dict)  # our pods left out, by namespace/name
    node_problems: dict[str, str] = field(default_factory=dict)
    queue_problems: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # every object left out, by its label
    unfinished: list[Bind] = field(default_factory=list)  # planned before a restart, not bound yet
    reservations: dict[Slot, dict[str, Any]] = field(default_factory=dict)  # GPU reservation pods
    idle_reservations: list[Slot] = field(default_factory=list)  # no share left on their GPU
    orphan_shares: dict[str, Slot] = field(default_factory=dict)  # bound shares whose reservation is gone
    stale_intents: list[str] = field(default_factory=list)  # plans and intents to clear (node gone or no fit)
    group_claims: dict[str, dict[str, str]] = field(
        default_factory=dict
    )  # claim -> its PodGroup (reservedFor)
    # claims for pods' extended resources that DRA serves, not made yet: pending key -> what they ask
    extended_claims: dict[str, ExtendedAsk] = field(default_factory=dict)
    dra_served: frozenset[str] = frozenset()  # extended resource names DeviceClasses serve
    time_bound: bool = False  # read the clock (a grace, a deletion with no end): not reused as it is
    # for a world patched from the change feed (`phalanx.k8s.read.patch`): the GPU reservation pods
    # recorded on each node, and the groups whose state read the clock (looked at every cycle)
    reserved_at: dict[str, list[Foreign]] = field(default_factory=dict)
    clock_groups: set[str] = field(default_factory=set)


def node_ready(obj: dict[str, Any]) -> bool:
    if mapping(obj.get("spec")).get("unschedulable"):
        return False
    for c in mappings(mapping(obj.get("status")).get("conditions")):
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return True


@dataclass
class Build:
    """What every phase of one world's build shares: the flags, the cycle's time, the translations,
    the containment of bad objects, the kept snapshot (if any), and whether the clock was read."""

    cfg: AdapterConfig
    now: float
    memo: Translations
    contain: Contain = field(default_factory=Contain)
    carry: Carry | None = None
    time_bound: bool = False  # the world read the clock: not reused as it is (`World.time_bound`)
    # a scheduling shard's gangs some of whose pods name another shard's pool: gang -> what they name
    split: dict[str, list[str]] = field(default_factory=dict)
    # a scheduling shard's nodes: a pod bound to any other is not read at all (None: read every pod)
    nodes: set[str] | None = None
    # the distributed cache's Datasets: their bytes per node, and those that failed
    distributed: Distributed = field(default_factory=Distributed)

    def reads_clock(self) -> None:
        """A part of the world depends on `now` (a grace, a deletion with no end, a start not known)."""
        self.time_bound = True


@dataclass
class _Nodes:
    parsed: list[Node]  # by name
    ready: dict[str, bool]
    problems: dict[str, str]  # by node name
    devices: Devices  # what DRA drivers publish

    @property
    def known(self) -> set[str]:
        return {n.name for n in self.parsed}


@dataclass
class _Pods:
    ours: list[PodInfo] = field(default_factory=list)  # ours to schedule (not being deleted)
    foreign: list[PodInfo] = field(default_factory=list)  # on nodes: other schedulers', ours deleting
    reservations: dict[Slot, dict[str, Any]] = field(default_factory=dict)  # GPU reservation pods


Staged = list[tuple[Group, Workload | None]]  # each group, and its Workload if it may be scheduled


def build_world(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    pod_groups: list[dict[str, Any]],
    queues: list[dict[str, Any]],
    cfg: AdapterConfig,
    now: float,
    memo: Translations | None = None,
    *,
    dra: DraObjects | None = None,
    kueue: Kueue | None = None,
    jobs: dict[str, dict[str, Any]] | None = None,
    carry: Carry | None = None,
    stamp: object = None,
    split: dict[str, list[str]] | None = None,
    datasets: list[dict[str, Any]] | None = None,
) -> World:
    """The world of one cycle. With `carry`, the last cycle's snapshot is kept where the nodes, queues
    and datasets are what it was built from (and no DRA object exists): only nodes whose pods changed
    are recorded anew (`phalanx.k8s.read.carry`). `stamp`: what the inputs are a version of (the watch
    cache's generation and the scheduler's assumptions); the same stamp as last cycle, after a cycle
    that changed nothing and read no clock, gives last cycle's world again, its clock-bound parts
    brought up to `now`.

    In phases: nodes, queues, the snapshot (kept or fresh), pods, claims, groups -> workloads,
    then each node's pods recorded, and what is left to clean up."""
    if carry is not None and stamp is not None and carry.unchanged(stamp):
        assert carry.world is not None and carry.snap is not None
        reset_cycle_state(carry.snap)
        serve(carry.snap, now)
        return carry.world
    dra = dra or DraObjects()
    b = Build(cfg, now, memo or Translations(), carry=carry, split=split or {})
    nodes, pods = outlined("Node", nodes, b.contain), outlined("Pod", pods, b.contain)
    pod_groups = outlined("PodGroup", pod_groups, b.contain)
    if datasets:  # where a distributed Dataset's chunks are, and whether it failed
        b.distributed = read_distributed(outlined("Dataset", datasets, b.contain), nodes, pods)
        b.contain.problems.update(b.distributed.problems)
    if kueue is not None:
        b.contain.problems.update(kueue.problems)
    ns = _read_nodes(b, nodes, dra)
    migrated = kueue.queue_specs if kueue is not None and kueue.mode == "migrate" else []
    elsewhere: dict[str, str] = {}
    if cfg.shard is not None:  # its nodes' pods and its queues; a workload naming another's is told whose
        b.nodes = ns.known
        queues, elsewhere = shard_queues(queues, cfg.shard)
    tree, queue_problems = build_tree(queues, cfg.default_queue, migrated)
    queue_problems |= elsewhere
    # claims hold devices across nodes: a full read with DRA objects starts from a fresh snapshot,
    # never kept by the next full read (the world is patched while no DRA object and no pod with
    # claims changes: `phalanx.k8s.read.patch`)
    keep = not (dra.slices or dra.claims or dra.classes)
    snap, kept = _start_snapshot(b, ns, tree, dataset_sizes(nodes), keep)
    w = World(snap, tree, node_problems=ns.problems, queue_problems=queue_problems)
    ps = _read_pods(b, w, pods)
    w.ended = ended_members(pods, cfg.scheduler_name)
    _pod_group_objects(w, pod_groups)
    claims = Claims(dra, snap, b.contain, nodes)
    ps.ours = _claim(ps.ours, claims, dra, pods, pod_groups)
    w.group_claims = claims.group_reserved
    w.extended_claims, w.dra_served = claims.extended, frozenset(claims.served)
    staged = _stage(b, w, ps.ours, pod_groups, claims, kueue, jobs)
    _add_workloads(b, w, staged, kept, ns.known, ps.foreign)
    outcomes = _record(b, w, ps, ns.known)
    snap.touched.clear()  # every node recorded: a patch looks at those the core changes from here on
    _leftovers(w, outcomes)
    if kept:
        reset_cycle_state(snap)
    serve(snap, now)
    w.time_bound = b.time_bound
    w.problems = b.contain.problems | {f"Queue {q}": msg for q, msg in queue_problems.items()}
    if b.carry is not None:
        b.carry.keep(w, stamp)
    return w


def _read_nodes(b: Build, nodes: list[dict[str, Any]], dra: DraObjects) -> _Nodes:
    """Nodes by name, with the devices their DRA drivers publish; those that cannot be read left out."""
    devices = parse_slices(dra.slices, b.cfg.dra_nic_drivers) if dra.slices else Devices()
    b.contain.problems.update(devices.problems)
    out = _Nodes([], {}, {}, devices)
    for obj in sorted(nodes, key=lambda o: str((o.get("metadata") or {}).get("name", ""))):
        n = b.contain("Node", obj, partial(b.memo.node, obj, b.cfg))
        if n is None:
            out.problems[str((obj.get("metadata") or {}).get("name", ""))] = b.contain.problems[
                label("Node", obj)
            ]
            continue
        if n.name in devices.by_node:
            published = b.contain("Node", obj, partial(with_dra, n, devices))
            if published is None:  # its published devices do not make a node: left out, named
                out.problems[n.name] = b.contain.problems[label("Node", obj)]
                continue
            n = published
        held = b.distributed.by_node.get(n.name)
        if held:
            n = replace(n, distcache_bytes=held)
        out.parsed.append(n)
        out.ready[n.name] = node_ready(obj)
    return out


def _start_snapshot(
    b: Build, ns: _Nodes, tree: QueueTree | None, datasets: dict[str, int], keep: bool
) -> tuple[Snapshot, bool]:
    """Last cycle's snapshot where what it was built from is unchanged (True), else a fresh one;
    each node's readiness as the API says now. `keep`: False for a snapshot that must not be kept
    by the next full read either."""
    devices = ns.devices
    local_pools = {(d.driver, d.pool) for devs in devices.by_node.values() for d in devs}

    def fresh() -> Snapshot:
        return Snapshot(
            ns.parsed,
            topology_levels=[lv for lv, _ in b.cfg.levels],
            datasets=datasets,
            queues=tree,
            dra_shared=devices.shared,
            dra_counter_sets=[cs for cs in devices.counter_sets if (cs.driver, cs.pool) not in local_pools],
        )

    kept = False
    if b.carry is not None:
        base = (ns.parsed, datasets, _tree_key(tree), tuple(b.cfg.levels)) if keep else None
        snap, kept = b.carry.start(base, fresh)
    else:
        snap = fresh()
    for i, n in enumerate(snap.nodes):
        if bool(snap.cluster.node_ready[i]) != ns.ready[n.name]:
            snap.set_node_ready(n.name, ns.ready[n.name])
    return snap, kept


def _read_pods(b: Build, w: World, pods: list[dict[str, Any]]) -> _Pods:
    """Active pods: GPU reservation pods, ours to schedule, and those that hold capacity on a node
    (other schedulers', ours being deleted); ours that cannot be read are named."""
    out = _Pods()
    for obj in pods:
        seen = classify(b, obj)
        if seen.slot is not None:
            out.reservations[seen.slot] = obj
        elif seen.problem:
            w.pod_problems[object_key(obj, "default")] = seen.problem
        elif seen.ours is not None:
            out.ours.append(seen.ours)
        elif seen.held is not None:
            out.foreign.append(seen.held)
    return out


@dataclass(frozen=True)
class Seen:
    """What one pod object is to a cycle: a GPU reservation pod (its slot), ours to schedule, one that
    holds capacity on a node (another scheduler's, ours being deleted), ours unreadable (why), or none
    of these (ended, or another scheduler's waiting)."""

    slot: Slot | None = None
    ours: PodInfo | None = None
    held: PodInfo | None = None
    problem: str = ""


def classify(b: Build, obj: dict[str, Any]) -> Seen:
    """The pod object as `_read_pods` takes it in; an unreadable pod of ours is named in `b.contain`."""
    if not is_active(obj):
        return Seen()
    spec = mapping(obj.get("spec"))
    if spec.get("schedulingGates") and not spec.get("nodeName"):
        # held by a scheduling gate (e.g. the webhook's, until its Dataset is cached): not to place
        # yet, as kube-scheduler does; the API server would refuse its bind anyway
        return Seen()
    if b.nodes is not None:  # a shard: what runs on another shard's nodes is nothing to it
        at = mapping(obj.get("spec")).get("nodeName")
        if at and at not in b.nodes:
            return Seen()
    slot = slot_of(obj, b.cfg)
    if slot is not None:
        return Seen(slot=slot)
    p = b.contain("Pod", obj, partial(b.memo.pod, obj, b.cfg))
    if p is None:
        if mapping(obj.get("spec")).get("schedulerName") == b.cfg.scheduler_name:
            return Seen(problem=b.contain.problems[label("Pod", obj)])
        b.contain.problems.pop(label("Pod", obj), None)  # not ours: nobody to tell, it runs where it runs
        return Seen()
    if p.ours and not p.deleting:
        shard = b.cfg.shard
        if shard is None or shard.owns(p.labels):
            return Seen(ours=p)
        why = shard.unowned(p.labels) if not p.node else ""
        if why:  # the default shard says why nobody places it
            return Seen(problem=f"pod {p.key}: {why}")
        # another shard's: capacity held where it runs (on a node of this shard only if relabelled)
    return Seen(held=p) if p.node else Seen()


def _pod_group_objects(w: World, pod_groups: list[dict[str, Any]]) -> None:
    for pg in pod_groups:
        if composite.is_composite(pg):
            continue  # no pod joins one: it speaks through the gang of its tree
        gid = object_key(pg, "default")
        if gid not in w.pod_groups or keys.is_ours(pg):
            w.pod_groups[gid] = pg  # ours win a name clash, as in `group_pods`


def _claim(
    ours: list[PodInfo],
    claims: Claims,
    dra: DraObjects,
    pods: list[dict[str, Any]],
    pod_groups: list[dict[str, Any]],
) -> list[PodInfo]:
    """Allocated claims hold their devices; our pods get what their claims ask for."""
    natives = {object_key(pg): pg for pg in pod_groups if native.is_native(pg)}
    holders = {p.uid for p in ours if p.node}  # and the native PodGroups of our bound pods (their claims)
    holders |= {
        str((natives[gk].get("metadata") or {}).get("uid"))
        for p in ours
        if p.node and (gk := f"{p.namespace}/{p.scheduling_group}") in natives
    }
    claims.reserve(holders)
    if not (dra.claims or dra.classes):
        return ours
    pods_by_key = {object_key(o): o for o in pods}
    return [
        claims.attach(p, pods_by_key.get(p.key, {}), natives.get(f"{p.namespace}/{p.scheduling_group}"))
        for p in ours
    ]


def _stage(
    b: Build,
    w: World,
    ours: list[PodInfo],
    pod_groups: list[dict[str, Any]],
    claims: Claims,
    kueue: Kueue | None,
    jobs: dict[str, dict[str, Any]] | None,
) -> Staged:
    """Our pods into groups; each group's problems (queue, claims, Kueue), and its Workload if none."""
    return [
        stage_group(b, w, g, claims, kueue, jobs) for g in group_pods(ours, pod_groups, w.ended, b.cfg.levels)
    ]


def native_objects(g: Group) -> list[dict[str, Any]]:
    """The group's Kubernetes-native objects: its PodGroups (merged ones, or its own if native),
    then the CompositePodGroups above it."""
    objs = g.members or ([g.pod_group] if g.pod_group and native.is_native(g.pod_group) else [])
    return objs + g.composites


def stage_group(
    b: Build,
    w: World,
    g: Group,
    claims: Claims | None,
    kueue: Kueue | None,
    jobs: dict[str, dict[str, Any]] | None,
) -> tuple[Group, Workload | None]:
    """One group: its problems (queue, claims, Kueue), and its Workload if it has none."""
    cfg, tree = b.cfg, w.tree
    w.groups[g.name] = g
    if native_objects(g):
        w.native_groups.add(g.name)
    else:
        w.native_groups.discard(g.name)
    for member in g.members:  # a native PodGroup merged into a multi-level gang: the gang speaks
        w.pod_groups.pop(object_key(member), None)
    if job_parallelism(g, jobs, b.now - cfg.gang_creation_grace_s, cfg.levels):
        b.reads_clock()
        w.clock_groups.add(g.name)
    if kueue is not None:
        apply_kueue(g, kueue, jobs or {})
    if claims is not None:
        g.problems += [claims.waiting[p.key] for p in g.pods if p.key in claims.waiting]
    _dataset_failed(b, g)
    _one_shard(b, g)
    queue = g.queue or cfg.default_queue
    if tree is not None and not tree.is_leaf(queue):
        what = "does not exist" if queue not in tree.queues else "is not a leaf"
        why = w.queue_problems.get(queue) or f"queue {queue!r} {what}"
        g.problems.append(why)
    wl = None
    if not g.problems and not g.waiting:
        try:
            wl = _workload(g, queue, b.carry)
        except Exception as e:
            g.problems.append(describe("Workload", {"metadata": {"name": g.name}}, e))
    return g, wl


def _dataset_failed(b: Build, g: Group) -> None:
    """A gang reading a distributed Dataset whose caching failed waits, told the Dataset's reason
    (its mount would not serve it); it is placed once the Dataset recovers."""
    failed = b.distributed.failed
    if not failed:
        return
    for ds in sorted({p.request.dataset for p in g.pods if p.request.dataset_distributed}):
        if ds in failed:
            g.problems.append(failed_reason(ds, failed[ds]))


def _one_shard(b: Build, g: Group) -> None:
    """A gang is placed whole by one shard: one whose pods (or PodGroup) name another's pool waits."""
    shard = b.cfg.shard
    if shard is None:
        return
    where = list(b.split.get(g.name, ()))
    labels = (g.pod_group.get("metadata") or {}).get("labels") if g.pod_group is not None else None
    if shard.shards.pool_of(labels) and shard.elsewhere(labels):
        where.append(f"{shard.elsewhere(labels)} on its PodGroup")
    if where:
        g.problems.append(
            f"its pods are in shard {shard.me.said()} but it also names {' and '.join(where)}: a gang "
            "is placed whole by one shard; give its pods and PodGroup one pool"
        )


def _add_workloads(
    b: Build, w: World, staged: Staged, kept: bool, known: set[str], foreign: list[PodInfo]
) -> None:
    """Workloads into the snapshot (gone or changed ones out of a kept one first); blocked groups
    wait with their reasons and their placed pods count as used capacity; the rest's pods are ours."""
    snap, carry = w.snapshot, b.carry
    if kept and carry is not None:  # workloads gone or changed leave the kept snapshot first
        prune(snap, {g.name: wl for g, wl in staged if wl is not None}, carry.made)
    if carry is not None:
        carry.forget_workloads_except(g.name for g, wl in staged if wl is not None)
    for g, wl in staged:
        foreign += place_group(b, w, g, wl, known)


def place_group(b: Build, w: World, g: Group, wl: Workload | None, known: set[str]) -> list[PodInfo]:
    """The group's Workload into the snapshot, or the group blocked with its reasons; returns the pods
    of a blocked group that hold capacity on a node (they count as used there)."""
    snap = w.snapshot
    if wl is not None and g.name not in snap.workloads:
        try:
            snap.add_workload(wl)
        except Exception as e:
            g.problems.append(describe("Workload", {"metadata": {"name": g.name}}, e))
    if g.problems or g.waiting:
        w.blocked[g.name] = g.problems or [g.waiting]
        if not g.problems:  # only short of pods: within the grace, pods are still being created
            since = max([p.created for p in g.pods] + [created(g.pod_group)])
            w.waiting_pods[g.name] = b.now - since < b.cfg.gang_creation_grace_s
            b.reads_clock()
            w.clock_groups.add(g.name)
        return [p for p in g.pods if p.node and p.node in known]
    apply_plans(g, w.stale_intents, b.contain)
    for p in g.pods:
        w.pods[p.key] = p
    return []


def _record(b: Build, w: World, ps: _Pods, known: set[str]) -> dict[str, Bind | None]:
    """Each node's pods into the snapshot: ours where bound or planned, the others' and reservation
    pods as used capacity. Returns each of our pods' outcome (`record_nodes`)."""
    ours_at: dict[str, list[PodInfo]] = {}
    for p in w.pods.values():
        target = ours_target(b, w, p, known)
        if target:
            ours_at.setdefault(target, []).append(p)
    reserved: list[PodInfo] = []
    prefer = _reservations(w, ps.reservations, ps.foreign, reserved, b.cfg, b.contain, b.memo)
    w.reserved_at = by_node(b, reserved, known, prefer)
    theirs = by_node(b, ps.foreign, known, prefer)
    return record_nodes(w.snapshot, b.carry, ours_at, theirs, w.reserved_at, b.now)


def ours_target(b: Build, w: World, p: PodInfo, known: set[str]) -> str:
    """The node our pod is recorded on (bound or planned), or "" (a plan naming a node gone is stale)."""
    target = p.node or p.intent
    if not target:
        return ""
    if target not in known:
        if not p.node:
            w.stale_intents.append(p.plan_holder or p.key)
        return ""
    if not (p.started or p.created):
        b.reads_clock()  # recorded as running since now
    return target


def by_node(
    b: Build, pods: list[PodInfo], known: set[str], prefer: dict[str, tuple[int, ...]] | None = None
) -> dict[str, list[Foreign]]:
    """Pods that hold capacity, by node, each node's in the order of their keys (not the order the
    watch delivered them: a node recorded anew gives the same GPUs to the same pods)."""
    out: dict[str, list[Foreign]] = {}
    for p in sorted(pods, key=lambda q: q.key):
        if p.node in known:
            # a pod being deleted (a victim terminating, say) is gone by its grace period at the latest
            ends = (p.deletion or b.now) if p.deleting else None
            if p.deleting and not p.deletion:
                b.reads_clock()
            out.setdefault(p.node, []).append((p, (prefer or {}).get(p.key, ()), ends))
    return out


def _leftovers(w: World, outcomes: dict[str, Bind | None]) -> None:
    """Binds an earlier run planned but did not make (to finish), and plans that no longer hold (to
    clear; none of a stale plan's pods is finished from it)."""
    for p in w.pods.values():
        if p.key not in outcomes:
            continue
        placed = outcomes[p.key]
        if placed is None and not p.node:
            w.stale_intents.append(p.plan_holder or p.key)
        elif placed is not None and not p.node:
            w.unfinished.append(placed)
    settle_leftovers(w)


def settle_leftovers(w: World) -> None:
    """Stale plans sorted and once each; binds to finish in task order, none from a stale plan."""
    w.stale_intents = sorted(set(w.stale_intents))
    stale = set(w.stale_intents)
    w.unfinished = sorted(
        (b for b in w.unfinished if (w.pods[b.task].plan_holder or b.task) not in stale), key=lambda b: b.task
    )


def serve(snap: Snapshot, now: float) -> None:
    """Each running workload's run so far, read from the snapshot's clock: time since its pods
    started, and GPUs x that time. The clock moves to `now`; a run's start is worked out again only
    for workloads whose tasks changed since (`Snapshot.rebound`, emptied here and handed on to the
    service keeper in `Snapshot.runs_changed`): the others' runs go on as they were."""
    snap.run_clock.now = now
    workloads, running = snap.workloads, snap.running
    for name in snap.rebound:
        entry = workloads.get(name)
        if entry is None:
            continue
        entry.run_since = None
        if name in running:
            entry.run_since = min(a.since for a in entry.bound.values())
            entry.run_clock = snap.run_clock
    snap.runs_changed |= snap.rebound
    snap.ranks_moved |= snap.rebound
    snap.rebound.clear()


def _share_slots(p: PodInfo) -> list[Slot]:
    """The slots a share of ours is bound or planned to: (node, GPU index) pairs, or its MIG
    instance (node, GPU index, "profile@start") for a fraction a MIG instance serves."""
    target = p.node or p.intent
    notes = p.annotations
    if not target:
        return []
    gpus = [int(x) for x in notes.get(keys.GPU_DEVICES, "").split(",") if x.strip().isdigit()]
    if notes.get(keys.GPU_BACKEND_CHOSEN) == MIG_BACKEND and notes.get(keys.MIG_SLICE):
        return [(target, gpus[0], notes[keys.MIG_SLICE])] if len(gpus) == 1 else []
    if keys.GPU_FRACTION not in notes:
        return []
    return [(target, g) for g in gpus]


def _reservations(
    w: World,
    reservations: dict[Slot, dict[str, Any]],
    foreign: list[PodInfo],
    reserved: list[PodInfo],
    cfg: AdapterConfig,
    contain: Contain,
    memo: Translations,
) -> dict[str, tuple[int, ...]]:
    """GPU reservation pods: their GPU counts as the shares' (never twice) while a share of ours
    is bound or planned there, and as a whole GPU held when none is. They go to `reserved`; returns,
    for those, which GPU they hold."""
    users: dict[Slot, list[PodInfo]] = {}
    for p in [*w.pods.values(), *(q for q in foreign if q.ours)]:
        for slot in _share_slots(p):
            users.setdefault(slot, []).append(p)
    w.reservations = reservations
    prefer: dict[str, tuple[int, ...]] = {}
    for slot, obj in sorted(reservations.items()):
        r = contain("Pod", obj, partial(memo.pod, obj, cfg))
        if r is None:
            continue
        if slot in users:
            reserved.append(replace(r, request=replace(r.request, gpu=GpuRequest.none())))
        else:
            w.idle_reservations.append(slot)
            reserved.append(r)
            prefer[r.key] = (slot[1],)
    if cfg.gpu_shares == "reservation":
        for slot, ps in users.items():
            if slot not in reservations:
                w.orphan_shares.update({p.key: slot for p in ps if p.node and not p.deleting})
    return prefer


def _tree_key(tree: QueueTree | None) -> object:
    return None if tree is None else (tree.queues, tree.gpu_weights)


def _workload(g: Group, queue: str, carry: Carry | None) -> Workload:
    """The group's Workload; with `carry`, last cycle's object while everything it is made of is equal."""
    if carry is None:
        return workload_of(g, queue)
    key = (
        queue,
        tuple(g.pods),
        g.min_available,
        g.ran,
        g.topology,
        g.priority,
        g.preemptible,
        g.checkpoint_interval,
        g.estimated_runtime,
        g.exempt,
        tuple(g.subgroups),
        g.preempt_whole,
        g.preempts,
        created(g.pod_group) if g.pod_group is not None else 0.0,
        g.minimum_said,  # said in its reasons: a PodGroup gone leaves the same minimum, said otherwise
    )
    return carry.workload(g.name, key, lambda: workload_of(g, queue))
