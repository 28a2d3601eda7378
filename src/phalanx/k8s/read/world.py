"""The cache's API objects -> one snapshot for a cycle, and what could not be taken in.

Pods of ours that are bound (or whose gang plan names a node, before a restart cut the
binds short) are rebuilt with the devices their annotations record. Pods of other
schedulers count as used capacity on their nodes. Objects that cannot be read are left out
with a message naming them (`Kind namespace/name: what is wrong`); the scheduler turns those
into Events and conditions, and the rest goes on. Containment is in one place (`Contain`):
whatever error a translation raises, for whatever kind, ends there and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

import numpy as np

from phalanx.core import drafit
from phalanx.core.decisions import Bind
from phalanx.core.devices import default_assignment
from phalanx.core.errors import SpecError
from phalanx.core.feasibility import find_candidates
from phalanx.core.model import MILLI, GpuKind, GpuRequest, Node
from phalanx.core.queues import QueueTree
from phalanx.core.snapshot import ForeignUsage, Snapshot
from phalanx.k8s import keys
from phalanx.k8s.client.cache import object_key
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read import kueue as kueue_keys
from phalanx.k8s.read import native
from phalanx.k8s.read.contain import Contain, brief, describe, label, mapping, mappings, outlined
from phalanx.k8s.read.devices import decode, decode_plan
from phalanx.k8s.read.dra import allocation_of, parse_claim, pod_claim_names
from phalanx.k8s.read.groups import Group, ended_members, group_pods, workload_of
from phalanx.k8s.read.kueue import Kueue
from phalanx.k8s.read.nodes import dataset_sizes, parse_node
from phalanx.k8s.read.pods import PodInfo, is_active, parse_pod, timestamp
from phalanx.k8s.read.queues import build_tree
from phalanx.k8s.read.reservations import Slot, slot_of
from phalanx.spec.dra import Devices, node_devices, parse_slices

T = TypeVar("T")
ASSUMED = "__phalanx_assumed__"  # set on pod copies the scheduler edited (never cached)


class Translations:
    """Parsed nodes and pods by (uid, resourceVersion): an object is translated once per version."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[str, Node | SpecError]] = {}
        self.pods: dict[str, tuple[str, PodInfo | SpecError]] = {}

    @staticmethod
    def _version(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")

    def node(self, obj: dict[str, Any], cfg: AdapterConfig) -> Node:
        return self._memo(self.nodes, obj, lambda: parse_node(obj, cfg))

    def pod(self, obj: dict[str, Any], cfg: AdapterConfig) -> PodInfo:
        if obj.get(ASSUMED):
            return parse_pod(obj, cfg)
        return self._memo(self.pods, obj, lambda: parse_pod(obj, cfg))

    def _memo(self, table: dict[str, tuple[str, Any]], obj: dict[str, Any], fn: Callable[[], T]) -> T:
        uid, rv = self._version(obj)
        if not uid or not rv:
            return fn()
        hit = table.get(uid)
        if hit is not None and hit[0] == rv:
            if isinstance(hit[1], SpecError):
                raise hit[1]
            return hit[1]  # type: ignore[no-any-return]
        try:
            out = fn()
        except SpecError as e:
            table[uid] = (rv, e)
            raise
        table[uid] = (rv, out)
        return out

    def forget_except(self, nodes: set[str], pods: set[str]) -> None:
        """Drop entries of objects that no longer exist (called now and then)."""
        for table, alive in ((self.nodes, nodes), (self.pods, pods)):
            for uid in [u for u in table if u not in alive]:
                del table[uid]


@dataclass
class World:
    snapshot: Snapshot
    tree: QueueTree | None
    pods: dict[str, PodInfo] = field(default_factory=dict)  # ours, by task name (namespace/name)
    groups: dict[str, Group] = field(default_factory=dict)  # by workload name
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


def _ready(obj: dict[str, Any]) -> bool:
    if mapping(obj.get("spec")).get("unschedulable"):
        return False
    for c in mappings(mapping(obj.get("status")).get("conditions")):
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return True


@dataclass
class DraObjects:
    """The resource.k8s.io objects a cycle reads (empty on a cluster without DRA)."""

    classes: list[dict[str, Any]] = field(default_factory=list)
    slices: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)


def build_world(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    pod_groups: list[dict[str, Any]],
    queues: list[dict[str, Any]],
    cfg: AdapterConfig,
    now: float,
    memo: Translations | None = None,
    dra: DraObjects | None = None,
    kueue: Kueue | None = None,
    jobs: dict[str, dict[str, Any]] | None = None,
) -> World:
    memo = memo or Translations()
    contain = Contain()
    nodes, pods = outlined("Node", nodes, contain), outlined("Pod", pods, contain)
    pod_groups = outlined("PodGroup", pod_groups, contain)
    dra = dra or DraObjects()
    if kueue is not None:
        contain.problems.update(kueue.problems)
    devices = parse_slices(dra.slices, cfg.dra_nic_drivers) if dra.slices else Devices()
    contain.problems.update(devices.problems)
    parsed: list[Node] = []
    ready: dict[str, bool] = {}
    node_problems: dict[str, str] = {}
    for obj in sorted(nodes, key=lambda o: str((o.get("metadata") or {}).get("name", ""))):
        n = contain("Node", obj, partial(memo.node, obj, cfg))
        if n is None:
            node_problems[str((obj.get("metadata") or {}).get("name", ""))] = contain.problems[
                label("Node", obj)
            ]
            continue
        if n.name in devices.by_node:
            with_dra = contain("Node", obj, partial(_with_dra, n, devices))
            if with_dra is None:  # its published devices do not make a node: left out, named
                node_problems[n.name] = contain.problems[label("Node", obj)]
                continue
            n = with_dra
        parsed.append(n)
        ready[n.name] = _ready(obj)
    migrated = kueue.queue_specs if kueue is not None and kueue.mode == "migrate" else []
    tree, queue_problems = build_tree(queues, cfg.default_queue, migrated)
    local_pools = {(d.driver, d.pool) for devs in devices.by_node.values() for d in devs}
    snap = Snapshot(
        parsed,
        topology_levels=[lv for lv, _ in cfg.levels],
        datasets=dataset_sizes(nodes),
        queues=tree,
        dra_shared=devices.shared,
        dra_counter_sets=[cs for cs in devices.counter_sets if (cs.driver, cs.pool) not in local_pools],
    )
    w = World(snap, tree, node_problems=node_problems, queue_problems=queue_problems)
    for name, ok in ready.items():
        if not ok:
            snap.set_node_ready(name, False)
    ours: list[PodInfo] = []
    foreign: list[PodInfo] = []
    pods_by_key = {object_key(o): o for o in pods}
    reservations: dict[Slot, dict[str, Any]] = {}
    for obj in pods:
        if not is_active(obj):
            continue
        slot = slot_of(obj, cfg)
        if slot is not None:
            reservations[slot] = obj
            continue
        p = contain("Pod", obj, partial(memo.pod, obj, cfg))
        if p is None:
            if mapping(obj.get("spec")).get("schedulerName") == cfg.scheduler_name:
                meta = obj.get("metadata") or {}
                w.pod_problems[f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"] = (
                    contain.problems[label("Pod", obj)]
                )
            else:  # not ours: nobody to tell, and it still runs where it runs
                contain.problems.pop(label("Pod", obj), None)
            continue
        if p.ours and not p.deleting:
            ours.append(p)
        elif p.node:
            foreign.append(p)
    w.ended = ended_members(pods, cfg.scheduler_name)
    for pg in pod_groups:
        meta = pg.get("metadata") or {}
        gid = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        if gid not in w.pod_groups or str(pg.get("apiVersion", "")).startswith(keys.GROUP):
            w.pod_groups[gid] = pg  # ours win a name clash, as in `group_pods`
    claims = _Claims(dra, snap, contain)
    natives = {object_key(pg): pg for pg in pod_groups if native.is_native(pg)}
    holders = {p.uid for p in ours if p.node}  # and the native PodGroups of our bound pods (their claims)
    holders |= {
        str((natives[gk].get("metadata") or {}).get("uid"))
        for p in ours
        if p.node and (gk := f"{p.namespace}/{p.scheduling_group}") in natives
    }
    claims.reserve(holders)
    if dra.claims or dra.classes:
        ours = [
            claims.attach(p, pods_by_key.get(p.key, {}), natives.get(f"{p.namespace}/{p.scheduling_group}"))
            for p in ours
        ]
    w.group_claims = claims.group_reserved
    known = {n.name for n in parsed}
    for g in group_pods(ours, pod_groups, w.ended, cfg.levels):
        w.groups[g.name] = g
        for member in g.members:  # a native PodGroup merged into a multi-level gang: the gang speaks
            w.pod_groups.pop(object_key(member), None)
        _job_parallelism(g, jobs, now - cfg.gang_creation_grace_s)
        if kueue is not None:
            _kueue(g, kueue, jobs or {})
        g.problems += [claims.waiting[p.key] for p in g.pods if p.key in claims.waiting]
        queue = g.queue or cfg.default_queue
        if tree is not None and not tree.is_leaf(queue):
            why = queue_problems.get(queue) or (
                f"queue {queue!r} does not exist"
                if queue not in tree.queues
                else f"queue {queue!r} is not a leaf"
            )
            g.problems.append(why)
        if not g.problems and not g.waiting:
            try:
                snap.add_workload(workload_of(g, queue))
            except Exception as e:
                g.problems.append(describe("Workload", {"metadata": {"name": g.name}}, e))
        if g.problems or g.waiting:
            w.blocked[g.name] = g.problems or [g.waiting]
            if not g.problems:  # only short of pods: within the grace, pods are still being created
                since = max([p.created for p in g.pods] + [_created(g.pod_group)])
                w.waiting_pods[g.name] = now - since < cfg.gang_creation_grace_s
            foreign += [p for p in g.pods if p.node and p.node in known]
            continue
        _apply_plans(g, w, contain)
        for p in g.pods:
            w.pods[p.key] = p
    for p in w.pods.values():
        target = p.node or p.intent
        if not target:
            continue
        if target not in known:
            if not p.node:
                w.stale_intents.append(p.plan_holder or p.key)
            continue
        placed = _rebuild(snap, p, target, now)
        if placed is None:
            if p.node:
                foreign.append(p)  # runs there whatever we think; count it
            else:
                w.stale_intents.append(p.plan_holder or p.key)
        elif not p.node:
            w.unfinished.append(placed)
    prefer = _reservations(w, reservations, foreign, cfg, contain, memo)
    for p in foreign:
        if p.node in known:
            # a pod being deleted (a victim terminating, say) is gone by its grace period at the latest
            ends = (p.deletion or now) if p.deleting else None
            _foreign(snap, p, prefer.get(p.key, ()), ends)
    for entry in snap.running.values():
        since = min(a.since for a in entry.bound.values())
        entry.executed = max(0.0, now - since)
        entry.attained = entry.gpu_milli / MILLI * entry.executed
    w.stale_intents = sorted(set(w.stale_intents))
    if len(w.stale_intents) > 0:  # a stale plan: none of its pods may be finished from it
        stale = set(w.stale_intents)
        w.unfinished = [b for b in w.unfinished if (w.pods[b.task].plan_holder or b.task) not in stale]
    queue_labels = {f"Queue {q}": msg for q, msg in queue_problems.items()}
    w.problems = contain.problems | queue_labels
    return w


def _job_parallelism(g: Group, jobs: dict[str, dict[str, Any]] | None, grace_since: float) -> None:
    """A Job's pods are one gang of its parallelism (what is left of its completions), not of the pods
    that happen to exist yet: the Job controller may still be making them. A pod whose Job the watch
    has not delivered yet waits for it (within the creation grace, after `grace_since`), or it would
    be placed alone, outside the Job's gang and its LocalQueue. `jobs` None: Jobs are not watched."""
    first = g.pods[0]
    if (
        g.pod_group is not None
        or not first.owner
        or first.owner[0] != "Job"
        or g.name != f"{g.namespace}/Job/{first.owner[1]}"
    ):
        return
    if keys.MIN_AVAILABLE in first.annotations or keys.KUEUE_GROUP_TOTAL in first.annotations:
        return
    job = (jobs or {}).get(f"{g.namespace}/{first.owner[1]}")
    if job is None:
        if jobs is not None and max(p.created for p in g.pods) > grace_since:
            g.waiting = f"Job {g.namespace}/{first.owner[1]}: not seen yet, so neither is its parallelism"
        return
    spec, status = job.get("spec") or {}, job.get("status") or {}
    try:
        need = int(spec.get("parallelism", 1))
        if spec.get("completions") is not None:
            need = min(need, int(spec["completions"]) - int(status.get("succeeded") or 0))
    except (TypeError, ValueError):
        return
    if need > len(g.pods):
        g.missing = need - len(g.pods)
        g.waiting = (
            f"Job {g.namespace}/{first.owner[1]}: waiting for {g.missing} more pod"
            f"{'s' if g.missing != 1 else ''}: {len(g.pods)} of its {need} parallel pods exist"
        )
    g.min_available = max(1, min(need, len(g.pods)))


def _created(obj: dict[str, Any] | None) -> float:
    return timestamp(((obj or {}).get("metadata") or {}).get("creationTimestamp"))


def _kueue(g: Group, k: Kueue, jobs: dict[str, dict[str, Any]]) -> None:
    """What Kueue says of the group: wait for its admission, its queue, the nodes of its flavors."""
    first = g.pods[0]
    owners = [p.owner for p in g.pods if p.owner]
    group = first.labels.get(kueue_keys.POD_GROUP_LABEL)
    owners += [("PodGroup", group)] if group else []
    owners += [("Pod", p.name) for p in g.pods]
    label = first.labels.get(kueue_keys.QUEUE_LABEL, "")
    if not label and first.owner and first.owner[0] == "Job":
        job = jobs.get(f"{g.namespace}/{first.owner[1]}") or {}
        label = str(((job.get("metadata") or {}).get("labels") or {}).get(kueue_keys.QUEUE_LABEL, ""))
    own = g.queue if g.queue and g.queue != label else ""
    d = kueue_keys.decide(k, g.namespace, list(dict.fromkeys(owners)), label, own)
    if d.problem:
        g.problems.append(d.problem)
        return
    if d.queue is not None:
        g.queue = d.queue
    elif label and g.queue == label:
        g.queue = ""  # a LocalQueue name is not a Phalanx queue: the default queue
    g.exempt = d.exempt
    if d.terms:
        g.pods = [
            replace(
                p,
                request=replace(
                    p.request, node_affinity=kueue_keys.combine(p.request.node_affinity, d.terms)
                ),
            )
            for p in g.pods
        ]


def _apply_plans(g: Group, w: World, contain: Contain) -> None:
    """Members of a gang whose plan names them, not bound yet: they carry the plan's assignment."""
    by_key = {p.key: p for p in g.pods}
    for holder in g.pods:
        text = holder.annotations.get(keys.GANG_PLAN)
        if not text:
            continue
        where = f"pod {holder.key}"
        plan = contain("Pod", {"metadata": holder.meta}, partial(decode_plan, text, where))
        if plan is None:
            w.stale_intents.append(holder.key)
            continue
        for task, (uid, notes) in plan.items():
            p = by_key.get(task)
            if p is None or p.node or (uid and p.uid != uid):
                continue  # gone, bound already, or a new pod of the same name
            planned = replace(
                p,
                intent=notes[keys.NODE_INTENT],
                annotations={**p.annotations, **notes},
                plan_holder=holder.key,
            )
            by_key[task] = planned  # a copy: the translation cache keeps the pod as the API has it
            g.pods[g.pods.index(p)] = planned


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
    mask = np.zeros(len(snap.cluster), dtype=np.bool_)
    mask[i] = True
    cand = find_candidates(snap, p.request, mask)
    if not len(cand):
        return None
    devices = default_assignment(snap.cluster, i, cand.usable(0), p.request)
    if devices is None:
        return None
    snap.bind_existing(p.key, node, devices, since=since)
    return snap.bind_of(snap.allocations[p.key])


def _share_slots(p: PodInfo) -> list[Slot]:
    """The (node, GPU index) pairs a share of ours is bound or planned to."""
    target = p.node or p.intent
    if not target or keys.GPU_FRACTION not in p.annotations:
        return []
    text = p.annotations.get(keys.GPU_DEVICES, "")
    return [(target, int(x)) for x in text.split(",") if x.strip().isdigit()]


def _reservations(
    w: World,
    reservations: dict[Slot, dict[str, Any]],
    foreign: list[PodInfo],
    cfg: AdapterConfig,
    contain: Contain,
    memo: Translations,
) -> dict[str, tuple[int, ...]]:
    """GPU reservation pods: their GPU counts as the shares' (never twice) while a share of ours
    is bound or planned there, and as a whole GPU held when none is. Returns, for the pods added
    to `foreign`, which GPU they hold."""
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
            foreign.append(replace(r, request=replace(r.request, gpu=GpuRequest.none())))
        else:
            w.idle_reservations.append(slot)
            foreign.append(r)
            prefer[r.key] = (slot[1],)
    if cfg.gpu_shares == "reservation":
        for slot, ps in users.items():
            if slot not in reservations:
                w.orphan_shares.update({p.key: slot for p in ps if p.node and not p.deleting})
    return prefer


def _foreign(snap: Snapshot, p: PodInfo, prefer: tuple[int, ...] = (), ends: float | None = None) -> None:
    """Another scheduler's pod: its CPU and memory, and its GPUs on the ones it names or the first free."""
    i = snap.node_index(p.node)
    c = snap.cluster
    g = p.request.gpu
    want = g.devices if g.kind in (GpuKind.WHOLE, GpuKind.FRACTION, GpuKind.MEMORY) else 0
    milli = g.milli if g.kind in (GpuKind.WHOLE, GpuKind.FRACTION) else MILLI
    free = [j for j in range(int(c.gpu_count[i])) if c.gpu_milli_free[i, j] >= milli]
    named = [j for j in free if snap.nodes[i].gpus[j].index in prefer]
    free = named + [j for j in free if j not in named]
    gpus = tuple(snap.nodes[i].gpus[j].index for j in free[:want])
    cpu = min(p.request.cpu_milli, int(c.cpu_free[i]))
    mem = min(p.request.memory_mib, int(c.mem_free[i]))
    snap.add_foreign(ForeignUsage(p.node, cpu, mem, gpus, milli if gpus else MILLI, p.key, ends))


def _with_dra(n: Node, devices: Devices) -> Node:
    """The node with the devices its DRA drivers publish (its GPUs and NICs made from them)."""
    devs = devices.by_node[n.name]
    pools = {(d.driver, d.pool) for d in devs}
    sets = tuple(cs for cs in devices.counter_sets if (cs.driver, cs.pool) in pools)
    gpus, nics = node_devices(devs)
    return replace(
        n,
        gpus=gpus if gpus else n.gpus,
        nics=nics if nics else n.nics,
        mig_instances={} if gpus else n.mig_instances,
        dra=tuple(devs),
        counter_sets=sets,
    )


class _Claims:
    """Pods' ResourceClaims: allocated ones held in the snapshot, our pods' claims on their requests."""

    def __init__(self, dra: DraObjects, snap: Snapshot, contain: Contain) -> None:
        self.snap = snap
        self.contain = contain
        self.classes = {str((c.get("metadata") or {}).get("name", "")): c for c in dra.classes}
        self.objects = {
            f"{(c.get('metadata') or {}).get('namespace')}/{(c.get('metadata') or {}).get('name')}": c
            for c in dra.claims
        }
        self.waiting: dict[str, str] = {}  # pod -> why it waits (claim not made yet, or bad)
        self.group_reserved: dict[str, dict[str, str]] = {}  # claims of native PodGroups -> reservedFor

    def reserve(self, our_bound: set[str]) -> None:
        """Allocated claims hold their devices; their GPUs count as used unless one of our bound pods
        holds them (its annotations already account for them)."""
        for obj in self.objects.values():
            alloc = self.contain("ResourceClaim", obj, partial(allocation_of, obj))
            if alloc is None:
                continue
            self.snap.reserve_claim(alloc)
            users = {str(r.get("uid", "")) for r in mappings(mapping(obj.get("status")).get("reservedFor"))}
            if users & our_bound or not alloc.node or alloc.node not in self.snap.cluster.index:
                continue
            i = self.snap.node_index(alloc.node)
            held = drafit.assignment(self.snap, i, [alloc])
            if held is not None:
                self.snap.hold_devices(i, held)

    def attach(self, p: PodInfo, obj: dict[str, Any], pg: dict[str, Any] | None = None) -> PodInfo:
        try:
            names = pod_claim_names(obj)
        except Exception as e:  # a pod's own fields: it waits, and says why
            self.waiting[p.key] = f"pod {p.key}: its resourceClaims cannot be read ({type(e).__name__}: {e})"
            return p
        if not names:
            return p
        if pg is not None:  # the PodGroup's claims: shared by its pods, reserved for the PodGroup
            theirs = native.group_claims(obj, pg)
            names = [(pc, theirs[pc], True) if pc in theirs else (pc, cn, sh) for pc, cn, sh in names]
            for claim_name in theirs.values():
                if claim_name:
                    self.group_reserved[f"{p.namespace}/{claim_name}"] = native.reference(pg)
        out = []
        for pod_claim, claim_name, shared in names:
            if not claim_name:
                why = f"waiting for the ResourceClaim of {pod_claim!r} to be made from its template"
                self.waiting[p.key] = f"pod {p.key}: {why}"
                return p
            key = f"{p.namespace}/{claim_name}"
            cobj = self.objects.get(key)
            if cobj is None:
                self.waiting[p.key] = f"pod {p.key}: ResourceClaim {key} does not exist (yet)"
                return p
            c = self.contain("ResourceClaim", cobj, partial(parse_claim, cobj, self.classes, shared))
            if c is None:
                self.waiting[p.key] = self.contain.problems[label("ResourceClaim", cobj)]
                return p
            out.append(c)
        claims = tuple(out)
        try:  # what the claims amount to (a claim asking 10**6 GPUs is no request): the pod waits, says why
            gpu, nics = drafit.footprint(
                claims, list(self.snap.dra_devices.values()), self.snap.selector_cache
            )
            req = p.request
            classic = {"gpu": req.gpu.kind is not GpuKind.NONE, "nic": req.rdma_nics > 0}
            claimed = frozenset(
                r for r, asked in classic.items() if not asked
            )  # device-plugin asks stay classic
            return replace(
                p,
                request=replace(
                    req,
                    claims=claims,
                    claimed=claimed,
                    gpu=gpu if "gpu" in claimed else req.gpu,
                    rdma_nics=nics if "nic" in claimed else req.rdma_nics,
                    nic_same_pcie=req.nic_same_pcie and "nic" not in claimed,
                ),
            )
        except Exception as e:
            self.waiting[p.key] = (
                f"pod {p.key}: its ResourceClaims cannot be placed ({type(e).__name__}: {brief(e)})"
            )
            return p
