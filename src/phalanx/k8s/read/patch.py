"""The kept world patched from the watch cache's change feed: a read that costs what changed (issue 34).

`build_world` reads every object each cycle, even with the kept snapshot (`carry`), so a cycle's
read grew with the cluster. Here the last world is patched instead: the pods the feed names are
classified again, the groups they belong to (and those whose state reads the clock) are staged again
exactly as `build_world` stages them, and only the nodes those pods are on, or whose snapshot state
the core changed (`Snapshot.touched`), are recorded again. A changed PodGroup stages its group
again. What cannot be patched that way returns None and the caller builds the world from scratch: a
change to anything but pods, nodes, PodGroups and Jobs (queues, DRA objects, Kueue's), a node whose
parsed form or datasets changed, pods with ResourceClaims among the changes or in a changed group
(claims hold devices across nodes: a DRA cluster is patched while its DRA objects and its pods with
claims stay as they are), GPU shares and reservation pods among the changes (their accounting spans
pods), PodGroups that merge groups into multi-level gangs, and a burst that touches a large part of
the cluster. The guard is
the same as the kept snapshot's: after random event sequences the patched world equals one built
from scratch (tests/test_patch.py), and the scheduler audits it against one now and then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from phalanx.core.decisions import Bind
from phalanx.core.model import MIG_BACKEND, Node
from phalanx.k8s import keys
from phalanx.k8s.client.cache import Changes, object_key
from phalanx.k8s.client.kinds import COMPOSITE_POD_GROUPS, JOBS, NODES, POD_GROUPS, PODS
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.carry import Carry, record_nodes, reset_cycle_state
from phalanx.k8s.read.contain import label, mapping, outlined
from phalanx.k8s.read.devices import decode_plan
from phalanx.k8s.read.groups import ended_member, first_level, group_pods, merges
from phalanx.k8s.read.kueue import Kueue
from phalanx.k8s.read.nodes import dataset_sizes
from phalanx.k8s.read.pods import PodInfo
from phalanx.k8s.read.translations import Translations
from phalanx.k8s.read.world import (
    Build,
    Seen,
    World,
    by_node,
    classify,
    node_ready,
    ours_target,
    place_group,
    serve,
    settle_leftovers,
    stage_group,
)

Lookup = Callable[[str], dict[str, Any] | None]  # the object of a key now (None: gone)
KindLookup = Callable[[str, str], dict[str, Any] | None]  # (kind key, object key) -> the object now
BURST = 0.25  # a change to more than this share of the pods is cheaper read from scratch
# PodGroups of every dialect but the composite ones (those merge groups), in the order a full read lists them
GROUP_KINDS = tuple(k.key for k in POD_GROUPS if k not in COMPOSITE_POD_GROUPS)
PATCHED_KINDS = {PODS.key, NODES.key, JOBS.key, *GROUP_KINDS}


@dataclass
class Feed:
    """What changed since the kept world was read (None: not known, read everything), and where to
    look up a changed pod or node as it is now."""

    changes: Changes | None
    pod: Lookup
    node: Lookup
    get: KindLookup | None = None  # any other kind's object (PodGroups); None: their changes read anew


@dataclass
class Index:
    """What the last world was made of, by key, for patching it without reading everything again."""

    seen: dict[str, Seen]  # every pod object, by store key
    ended: dict[str, tuple[str, str]]  # our ended pods of named groups: key -> (group, phase)
    members: dict[str, set[str]]  # group -> the keys of its pods of ours to schedule
    pod_groups: dict[tuple[str, str], list[dict[str, Any]]]  # PodGroup objects by (namespace, name)
    held_at: dict[str, dict[str, PodInfo]]  # node -> pods holding capacity there (not ours to schedule)
    group_held: dict[str, list[PodInfo]]  # blocked group -> its pods holding capacity on nodes
    ours_at: dict[str, set[str]]  # node -> our pods recorded there
    first: dict[str, str]  # group -> its first pod's key (the order groups are staged in)
    nodes: dict[str, dict[str, Any]]  # node objects by name
    parsed: dict[str, Node]
    stale_group: dict[str, set[str]] = field(default_factory=dict)  # group -> plans its gang plan made stale
    stale_pod: dict[str, str] = field(default_factory=dict)  # pod -> its plan, stale (node gone)
    stale_fit: dict[str, str] = field(default_factory=dict)  # pod -> its plan, stale (does not fit)
    placed: dict[str, Bind] = field(default_factory=dict)  # planned, not bound: binds to finish
    claimed: set[str] = field(default_factory=set)  # pods whose objects name ResourceClaims
    served: frozenset[str] = frozenset()  # extended resources DRA serves: a pod asking one has a claim
    bare: dict[str, Node] = field(default_factory=dict)  # nodes with DRA devices, as their Node reads alone
    _known: set[str] | None = None

    @property
    def known(self) -> set[str]:
        """The nodes of the snapshot (made once: the patch never changes which nodes there are)."""
        if self._known is None:
            self._known = set(self.parsed)
        return self._known


def remember(
    carry: Carry,
    w: World,
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    pod_groups: list[dict[str, Any]],
    cfg: AdapterConfig,
    memo: Translations,
) -> None:
    """After a world built from scratch or kept: index it for the next cycle's patch (or not, where
    it could not be patched)."""
    carry.index = None
    if w.snapshot is not carry.snap or merges(pod_groups):
        return
    parsed = {n.name: n for n in w.snapshot.nodes}
    b = Build(cfg, 0.0, memo, nodes=set(parsed) if cfg.shard is not None else None)
    seen: dict[str, Seen] = {}
    ended: dict[str, tuple[str, str]] = {}
    claimed: set[str] = set()
    pod_groups = outlined("PodGroup", pod_groups, b.contain)  # as the full read leaves them out
    for obj in outlined("Pod", pods, b.contain):
        key = object_key(obj)
        seen[key] = classify(b, obj)
        hit = ended_member(obj, cfg.scheduler_name)
        if hit is not None:
            ended[key] = hit
        if _has_claims(obj, w.dra_served):
            claimed.add(key)
    by_name = {str((o.get("metadata") or {}).get("name", "")): o for o in nodes}
    ix = Index(
        seen,
        ended,
        {},
        {},
        {},
        {},
        {},
        {},
        {k: by_name[k] for k in parsed},
        parsed,
        claimed=claimed,
        served=w.dra_served,
    )
    for name, n in parsed.items():
        if n.dra:  # made with its published devices: a change to its Node is compared without them
            bare = b.contain("Node", by_name[name], partial(memo.node, by_name[name], cfg))
            if bare is None:
                return
            ix.bare[name] = bare
    for key, s in seen.items():
        if s.ours is not None:
            ix.members.setdefault(first_level(s.ours), set()).add(key)
        elif s.held is not None and s.held.node in parsed:
            ix.held_at.setdefault(s.held.node, {})[key] = s.held
    for pg in pod_groups:
        meta = pg.get("metadata") or {}
        at = (str(meta.get("namespace", "default")), str(meta.get("name", "")))
        ix.pod_groups.setdefault(at, []).append(pg)
    for name, g in w.groups.items():
        ix.first[name] = g.pods[0].key
        if name in w.blocked:
            ix.group_held[name] = [p for p in g.pods if p.node and p.node in parsed]
        else:  # gang plans that would not decode (`apply_plans`)
            bad = {p.key for p in g.pods if keys.GANG_PLAN in p.annotations and not _decodes(p)}
            if bad:
                ix.stale_group[name] = bad
    outcomes: dict[str, Bind | None] = {}
    for rec in carry.nodes.values():
        mine = rec.sig[1]
        assert isinstance(mine, tuple)
        outcomes.update(zip((p.key for p in mine), rec.outcomes, strict=True))
    for p in w.pods.values():
        target = p.node or p.intent
        if target in parsed:
            ix.ours_at.setdefault(target, set()).add(p.key)
        elif target and not p.node:
            ix.stale_pod[p.key] = p.plan_holder or p.key
        _leftover(ix, p, outcomes.get(p.key), p.key in outcomes)
    carry.index = ix


def _has_claims(obj: dict[str, Any], served: frozenset[str]) -> bool:
    """Whether the pod names ResourceClaims, or asks an extended resource DRA may serve (what they
    hold spans nodes and pods: not patched)."""
    spec = mapping(obj.get("spec"))
    if spec.get("resourceClaims"):
        return True
    if not served:
        return False
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = mapping(mapping(c).get("resources"))
        if served & {*mapping(res.get("limits")), *mapping(res.get("requests"))}:
            return True
    return False


def _pod_label(key: str) -> str:
    """How problems name the pod of this key (`contain.label`)."""
    ns, _, name = key.partition("/")
    return label("Pod", {"metadata": {"namespace": ns, "name": name}})


def _decodes(p: PodInfo) -> bool:
    try:
        decode_plan(p.annotations[keys.GANG_PLAN], f"pod {p.key}")
    except Exception:
        return False
    return True


def _leftover(ix: Index, p: PodInfo, placed: Bind | None, recorded: bool) -> None:
    """A pod of ours after its node was recorded: a plan to finish, one that no longer fits, or neither."""
    ix.placed.pop(p.key, None)
    ix.stale_fit.pop(p.key, None)
    if not recorded or p.node:
        return
    if placed is None:
        ix.stale_fit[p.key] = p.plan_holder or p.key
    else:
        ix.placed[p.key] = placed


def _special(p: PodInfo | None) -> bool:
    """A GPU share: a fraction of GPUs, or a fraction a MIG instance serves (reservation accounting)."""
    if p is None:
        return False
    return keys.GPU_FRACTION in p.annotations or p.annotations.get(keys.GPU_BACKEND_CHOSEN) == MIG_BACKEND


def patch(
    carry: Carry,
    changes: Changes,
    pod_of: Lookup,
    node_of: Lookup,
    cfg: AdapterConfig,
    now: float,
    memo: Translations,
    *,
    get: KindLookup | None = None,
    kueue: Kueue | None = None,
    jobs: dict[str, dict[str, Any]] | None = None,
    stamp: object = None,
    split: dict[str, list[str]] | None = None,
) -> World | None:
    """The last world with `changes` applied, or None where it cannot be patched (build it anew)."""
    ix, w = carry.index, carry.world
    if ix is None or w is None or w.snapshot is not carry.snap or set(changes) - PATCHED_KINDS:
        return None
    pod_keys, node_names, job_keys = (changes.get(k, set()) for k in (PODS.key, NODES.key, JOBS.key))
    if pod_keys is None or node_names is None or job_keys is None:
        return None
    if len(pod_keys) > max(64, BURST * len(ix.seen)):
        return None
    snap = w.snapshot
    if any(a.claims for i in snap.touched for a in snap.on_node[i].values()):
        return None  # the core placed claims last cycle: they are read back with their DRA objects
    b = Build(
        cfg, now, memo, carry=carry, split=split or {}, nodes=ix.known if cfg.shard is not None else None
    )
    groups = _groups(b, changes, get)
    if groups is None:
        return None
    nodes = _nodes(b, ix, node_names, node_of)
    if nodes is None:
        return None
    pods = _pods(b, ix, pod_keys, pod_of)
    if pods is None:
        return None
    dirty_groups = set(w.clock_groups) | {f"{k.split('/', 1)[0]}/Job/{k.split('/', 1)[1]}" for k in job_keys}
    dirty_groups |= groups.keys()
    for _, old, new, old_end, new_end in pods:
        dirty_groups |= {first_level(s.ours) for s in (old, new) if s.ours is not None}
        dirty_groups |= {e[0] for e in (old_end, new_end) if e is not None}
    members = [k for gid in dirty_groups for k in ix.members.get(gid, ())]
    if any(_special(ix.seen[k].ours) or k in ix.claimed for k in members):
        return None  # a GPU share's reservation accounting spans its gang's plan, claims their devices
    return _apply(b, carry, ix, w, nodes, pods, groups, dirty_groups, kueue, jobs, stamp)


def _groups(b: Build, changes: Changes, get: KindLookup | None) -> dict[str, list[dict[str, Any]]] | None:
    """Each changed PodGroup name's objects now, of every dialect in the order a full read lists them
    (those that cannot be read left out and named); None where one merges groups into a multi-level
    gang or the objects cannot be looked up."""
    names: set[str] = set()
    for kind in GROUP_KINDS:
        changed = changes.get(kind, set())
        if changed is None:
            return None
        names |= changed
    if names and get is None:
        return None
    out: dict[str, list[dict[str, Any]]] = {}
    for key in sorted(names):
        assert get is not None
        found = [o for kind in GROUP_KINDS if (o := get(kind, key)) is not None]
        if merges(found):
            return None
        out[key] = outlined("PodGroup", found, b.contain)
    return out


PodChange = tuple[str, Seen, Seen, tuple[str, str] | None, tuple[str, str] | None]


def _nodes(b: Build, ix: Index, names: set[str], node_of: Lookup) -> list[tuple[str, dict[str, Any]]] | None:
    """Changed nodes whose parsed form and datasets are what they were (else None: a new snapshot)."""
    out = []
    for name in names:
        obj, old = node_of(name), ix.nodes.get(name)
        if obj is None or old is None:
            return None
        n = b.contain("Node", obj, partial(b.memo.node, obj, b.cfg))
        was = ix.bare.get(name, ix.parsed[name])
        if n is None or n != was or dataset_sizes([obj]) != dataset_sizes([old]):
            return None
        out.append((name, obj))
    return out


def _pods(b: Build, ix: Index, pod_keys: set[str], pod_of: Lookup) -> list[PodChange] | None:
    """Each changed pod as it was and is; None if one is (or was) a GPU share or reservation pod."""
    out: list[PodChange] = []
    for key in sorted(pod_keys):
        obj = pod_of(key)
        if obj is not None and not outlined("Pod", [obj], b.contain):
            obj = None  # its outline cannot be read: left out and named, as a full read does
        if key in ix.claimed or (obj is not None and _has_claims(obj, ix.served)):
            return None
        new = classify(b, obj) if obj is not None else Seen()
        old = ix.seen.get(key, Seen())
        if old.slot is not None or new.slot is not None:
            return None
        if any(_special(p) for s in (old, new) for p in (s.ours, s.held)):
            return None
        new_end = ended_member(obj, b.cfg.scheduler_name) if obj is not None else None
        out.append((key, old, new, ix.ended.get(key), new_end))
    return out


def _apply(
    b: Build,
    carry: Carry,
    ix: Index,
    w: World,
    nodes: list[tuple[str, dict[str, Any]]],
    pods: list[PodChange],
    groups: dict[str, list[dict[str, Any]]],
    dirty_groups: set[str],
    kueue: Kueue | None,
    jobs: dict[str, dict[str, Any]] | None,
    stamp: object,
) -> World:
    snap = w.snapshot
    snap.evicted_for = {}  # the driver's memory, lent last cycle: not the snapshot's to forget (`prune`)
    dirty_nodes = {snap.nodes[i].name for i in snap.touched}
    for name, obj in nodes:
        ix.nodes[name] = obj
        ready = node_ready(obj)
        if bool(snap.cluster.node_ready[snap.node_index(name)]) != ready:
            snap.set_node_ready(name, ready)
            dirty_nodes.add(name)
    for key, objs in groups.items():
        _regroup(ix, w, key, objs)
    known = ix.known
    for key, old, new, old_end, new_end in pods:
        _unindex(ix, w, key, old, old_end, dirty_nodes)
        ix.seen[key] = new
        if new.ours is not None:
            ix.members.setdefault(first_level(new.ours), set()).add(key)
        if new.held is not None and new.held.node in known:
            ix.held_at.setdefault(new.held.node, {})[key] = new.held
            dirty_nodes.add(new.held.node)
        if new_end is not None:
            ix.ended[key] = new_end
            counts = w.ended.setdefault(new_end[0], {})
            counts[new_end[1]] = counts.get(new_end[1], 0) + 1
        if new.problem:
            w.pod_problems[key] = new.problem
    restaged: list[PodInfo] = []
    for gid in sorted(dirty_groups):
        restaged += _restage(b, carry, ix, w, gid, kueue, jobs, dirty_nodes)
    _record(b, carry, ix, w, restaged, dirty_nodes & known)
    w.problems.update(b.contain.problems)
    w.time_bound = w.time_bound or b.time_bound
    reset_cycle_state(snap)
    serve(snap, b.now)
    carry.keep(w, stamp)
    carry.patched += 1
    carry.recorded = len(dirty_nodes & known)
    return w


def _regroup(ix: Index, w: World, key: str, objs: list[dict[str, Any]]) -> None:
    """A PodGroup name's objects as they are now (its group is staged again after)."""
    ns, _, name = key.partition("/")
    w.problems.pop(label("PodGroup", {"metadata": {"namespace": ns, "name": name}}), None)
    if objs:
        ix.pod_groups[(ns, name)] = objs
    else:
        ix.pod_groups.pop((ns, name), None)
    chosen = None
    for pg in objs:  # the object whose status is written: ours win a name clash (`_pod_group_objects`)
        if chosen is None or keys.is_ours(pg):
            chosen = pg
    if chosen is None:
        w.pod_groups.pop(key, None)
    else:
        w.pod_groups[key] = chosen


def _unindex(
    ix: Index, w: World, key: str, old: Seen, old_end: tuple[str, str] | None, dirty_nodes: set[str]
) -> None:
    """Forget what a changed pod was."""
    if old.ours is not None:
        gid = first_level(old.ours)
        left = ix.members.get(gid)
        if left is not None:
            left.discard(key)
            if not left:
                del ix.members[gid]
    if old.held is not None:
        ix.held_at.get(old.held.node, {}).pop(key, None)
        dirty_nodes.add(old.held.node)
    if old_end is not None:
        del ix.ended[key]
        counts = w.ended[old_end[0]]
        counts[old_end[1]] -= 1
        if not counts[old_end[1]]:
            del counts[old_end[1]]
        if not counts:
            del w.ended[old_end[0]]
    w.pod_problems.pop(key, None)
    w.problems.pop(_pod_label(key), None)


def _restage(
    b: Build,
    carry: Carry,
    ix: Index,
    w: World,
    gid: str,
    kueue: Kueue | None,
    jobs: dict[str, dict[str, Any]] | None,
    dirty_nodes: set[str],
) -> list[PodInfo]:
    """The group staged again as `build_world` stages it; returns its pods of ours now in the world."""
    snap = w.snapshot
    old = w.groups.pop(gid, None)
    w.native_groups.discard(gid)
    if old is not None:
        for p in old.pods:
            w.problems.pop(_pod_label(p.key), None)
            if w.pods.get(p.key) is p:
                del w.pods[p.key]
                target = p.node or p.intent
                ix.ours_at.get(target, set()).discard(p.key)
                dirty_nodes.add(target)
            ix.stale_pod.pop(p.key, None)
            ix.stale_fit.pop(p.key, None)
            ix.placed.pop(p.key, None)
        dirty_nodes |= {p.node for p in ix.group_held.pop(gid, [])}
    w.blocked.pop(gid, None)
    w.waiting_pods.pop(gid, None)
    w.clock_groups.discard(gid)
    ix.stale_group.pop(gid, None)
    ix.first.pop(gid, None)
    members = ix.members.get(gid)
    found = [ix.seen[k].ours for k in members or ()]
    ours = sorted((q for q in found if q is not None), key=lambda q: q.key)
    if not ours:
        if gid in snap.workloads:
            snap.remove_workload(gid)
        carry.workloads.pop(gid, None)
        return []
    ns, _, name = gid.partition("/")
    (g,) = group_pods(ours, ix.pod_groups.get((ns, name), []), w.ended, b.cfg.levels)
    clock, b.time_bound = b.time_bound, False
    g, wl = stage_group(b, w, g, None, kueue, jobs)
    entry = snap.workloads.get(gid)
    if entry is not None and entry.workload is not wl:
        snap.remove_workload(gid)
    if wl is None:
        carry.workloads.pop(gid, None)
    stale, w.stale_intents = w.stale_intents, []
    held = place_group(b, w, g, wl, ix.known)
    if w.stale_intents:
        ix.stale_group[gid] = set(w.stale_intents)
    w.stale_intents = stale
    b.time_bound = clock or b.time_bound
    ix.first[gid] = g.pods[0].key
    if held:
        ix.group_held[gid] = held
        dirty_nodes |= {p.node for p in held}
    placed = [p for p in g.pods if w.pods.get(p.key) is p]
    for p in placed:
        dirty_nodes.add(p.node or p.intent)
    return placed


def _record(b: Build, carry: Carry, ix: Index, w: World, restaged: list[PodInfo], dirty: set[str]) -> None:
    """The dirty nodes recorded again (each as `build_world` records it), and the leftovers of their pods."""
    snap = w.snapshot
    known = ix.known
    for p in restaged:
        stale, w.stale_intents = w.stale_intents, []
        target = ours_target(b, w, p, known)
        if w.stale_intents:
            ix.stale_pod[p.key] = w.stale_intents[0]
        w.stale_intents = stale
        if target:
            ix.ours_at.setdefault(target, set()).add(p.key)
    mine: dict[str, list[PodInfo]] = {}
    theirs: dict[str, list[PodInfo]] = {}
    for n in dirty:
        ours = [w.pods[k] for k in ix.ours_at.get(n, ())]
        for p in ours:
            if not (p.started or p.created):
                b.reads_clock()
        mine[n] = sorted(ours, key=lambda p: (ix.first[first_level(p)], p.key))
        theirs[n] = [*ix.held_at.get(n, {}).values()]
    for held in ix.group_held.values():
        for p in held:
            if p.node in dirty:
                theirs[p.node].append(p)
    foreign = {n: by_node(b, pods, known).get(n, []) for n, pods in theirs.items()}
    reserved = {n: w.reserved_at.get(n, []) for n in dirty}
    outcomes = record_nodes(snap, carry, mine, foreign, reserved, b.now, only=dirty)
    snap.touched.clear()
    for n in dirty:
        for p in mine[n]:
            _leftover(ix, p, outcomes.get(p.key), p.key in outcomes)
    w.stale_intents = [
        *(x for s in ix.stale_group.values() for x in s),
        *ix.stale_pod.values(),
        *ix.stale_fit.values(),
    ]
    w.unfinished = list(ix.placed.values())
    settle_leftovers(w)


__all__ = ["Feed", "Index", "patch", "remember"]
