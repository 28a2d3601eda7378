"""Pods -> workloads (gangs): by named pod group, by controlling owner, or one pod alone.

A pod names its group with any key of `keys.GROUP_KEYS`; the PodGroup object of that name
(ours, KAI, Volcano or scheduler-plugins) gives `minMember`, queue and topology. Without a
PodGroup object, Kueue's `pod-group-total-count` or the pods present set the minimum.
Pods with no group but a controlling owner of a kind in `keys.AUTO_GROUP_OWNERS` form one
workload per owner: all pods present are the gang (a RayCluster needs only its head), unless
`phalanx.io/min-available` says otherwise. Any other pod is a workload of its own.

Members of a named group that ended (Succeeded or Failed) count as members that ran, as in
Volcano's gang plugin: a PodGroup of `minMember: 2` whose one pod completed while the other
runs is a running gang of one pod left, not a gang short of a member. A group with fewer
members than its minimum (pods still being created, say) waits for them (`Group.waiting`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from phalanx.core.errors import SpecError
from phalanx.core.model import PodSet, SubGroup, TaskRequest, TopologyConstraint, Workload
from phalanx.k8s import keys
from phalanx.k8s.read import composite, native
from phalanx.k8s.read.contain import describe
from phalanx.k8s.read.pods import PodInfo, timestamp
from phalanx.spec.quantity import whole_number
from phalanx.spec.times import rfc3339

log = logging.getLogger(__name__)


@dataclass
class Group:
    """One workload and where it came from."""

    name: str  # namespace/group, namespace/Kind/owner, or namespace/pod
    namespace: str
    pods: list[PodInfo]
    pod_group: dict[str, Any] | None = None  # the PodGroup object, if any
    min_available: int = 0
    queue: str = ""
    topology: TopologyConstraint | None = None
    problems: list[str] = field(default_factory=list)
    # from our PodGroup's spec; None: the pods' phalanx.io/ annotations decide
    preemptible: bool | None = None
    checkpoint_interval: float | None = None
    estimated_runtime: float | None = None
    exempt: bool = False  # admitted by Kueue: its quota is Kueue's
    ended: dict[str, int] = field(default_factory=dict)  # members that ran and ended, by phase
    missing: int = 0  # members the minimum still needs: pods not created yet
    waiting: str = ""  # why it waits for them ("... waiting for 1 more pod"); empty if it does not
    priority: int | None = None  # a native PodGroup's spec.priority; None: the pods' highest
    preempt_whole: bool = False  # a native PodGroup's disruptionMode: PodGroup ({all: {}})
    preempts: bool = True  # False: a native group's preemptionPolicy Never (evicts nobody)
    subgroups: list[native.SubGroupOf] = field(default_factory=list)  # a multi-level gang's levels
    members: list[dict[str, Any]] = field(default_factory=list)  # native PodGroups merged into it
    composites: list[dict[str, Any]] = field(default_factory=list)  # the CompositePodGroups of its tree
    minimum_said: str = ""  # the minimum as its user wrote it, for reasons ("minMember 4")

    @property
    def ran(self) -> int:
        """Members that ran and ended (Succeeded or Failed): they count toward the minimum."""
        return sum(self.ended.values())


def group_id(
    namespace: str, labels: dict[str, Any], annotations: dict[str, Any], scheduling_group: str = ""
) -> str:
    """The named group a pod joins (`namespace/group`), or "" (the same keys and order as `PodInfo.tag`)."""
    if scheduling_group:
        return f"{namespace}/{scheduling_group}"
    for k in keys.GROUP_KEYS:
        for where in (labels, annotations):
            if k in where:
                return f"{namespace}/{where[k]}"
    return ""


def ended_member(obj: dict[str, Any], scheduler_name: str) -> tuple[str, str] | None:
    """(group, phase) of our pod of a named group that ended (Succeeded, Failed); None otherwise."""
    phase = (obj.get("status") or {}).get("phase")
    if phase not in ("Succeeded", "Failed") or (obj.get("spec") or {}).get("schedulerName") != scheduler_name:
        return None
    meta = obj.get("metadata") or {}
    gid = group_id(
        str(meta.get("namespace", "default")),
        meta.get("labels") or {},
        meta.get("annotations") or {},
        str(((obj.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") or ""),
    )
    return (gid, str(phase)) if gid else None


def ended_members(objs: list[dict[str, Any]], scheduler_name: str) -> dict[str, dict[str, int]]:
    """Our pods of named groups that ended (Succeeded, Failed), counted by group and phase."""
    out: dict[str, dict[str, int]] = {}
    for obj in objs:
        hit = ended_member(obj, scheduler_name)
        if hit is not None:
            counts = out.setdefault(hit[0], {})
            counts[hit[1]] = counts.get(hit[1], 0) + 1
    return out


def first_level(p: PodInfo) -> str:
    """The group a pod joins before multi-level gangs merge groups: its named group, its controlling
    owner's, or its own (`group_pods`)."""
    gname = p.scheduling_group or p.tag(keys.GROUP_KEYS)
    if gname:
        return f"{p.namespace}/{gname}"
    owner = _owner(p)
    return f"{p.namespace}/{owner[0]}/{owner[1]}" if owner else p.key


def merges(pod_groups: list[dict[str, Any]]) -> bool:
    """Whether any PodGroup makes groups into one multi-level gang (a native one of a Workload or of a
    CompositePodGroup tree): then a group's Workload depends on other groups' pods too."""
    return any(
        composite.is_composite(pg)
        or (native.is_native(pg) and (native.template_of(pg)[0] or composite.parent_of(pg)))
        for pg in pod_groups
    )


def group_pods(
    pods: list[PodInfo],
    pod_groups: list[dict[str, Any]],
    ended: dict[str, dict[str, int]] | None = None,
    levels: tuple[tuple[str, str], ...] = (),
) -> list[Group]:
    """`ended`: members of named groups that ended (`ended_members`); they count as members that ran.
    `levels`: the topology levels, to map native topology keys onto."""
    by_name: dict[tuple[str, str], dict[str, Any]] = {}
    natives: dict[tuple[str, str], dict[str, Any]] = {}
    composites: dict[tuple[str, str], dict[str, Any]] = {}
    ordered = sorted(pod_groups, key=lambda o: not keys.is_ours(o))
    for pg in ordered:
        meta = pg.get("metadata") or {}
        at = (str(meta.get("namespace", "default")), str(meta.get("name", "")))
        if composite.is_composite(pg):  # no pod names one: not a PodGroup of that name
            composites.setdefault(at, pg)
            continue
        by_name.setdefault(at, pg)
        if native.is_native(pg):
            natives.setdefault(at, pg)
    groups: dict[str, Group] = {}
    for p in sorted(pods, key=lambda p: p.key):
        gname = p.scheduling_group or p.tag(keys.GROUP_KEYS)
        gid = first_level(p)
        if gname:
            found = (
                natives.get((p.namespace, gname)) if p.scheduling_group else by_name.get((p.namespace, gname))
            )
            g = groups.get(gid)  # not setdefault: a Group made for every pod was a tenth of a cycle
            if g is None:
                g = groups[gid] = Group(gid, p.namespace, [], found)
                g.ended = dict((ended or {}).get(gid, {}))
            if p.scheduling_group and found is None and not g.waiting:
                g.waiting = f"PodGroup {gid} ({native.GROUP}) does not exist yet: its pods wait for it"
        else:
            g = groups.get(gid)
            if g is None:
                g = groups[gid] = Group(gid, p.namespace, [])
        g.pods.append(p)
    for g in groups.values():
        if not g.waiting:
            _settle(g, levels)
    return _by_composite(_by_workload(list(groups.values())), natives, composites, levels)


def _owner(p: PodInfo) -> tuple[str, str] | None:
    for label, kind in keys.OWNER_LABELS:
        if label in p.labels:
            name = p.labels[label]
            if kind == "LeaderWorkerSet":  # each leader + workers group is one gang
                name = f"{name}-{p.labels.get('leaderworkerset.sigs.k8s.io/group-index', '0')}"
            return kind, name
    if p.owner and p.owner[0] in keys.AUTO_GROUP_OWNERS:
        return p.owner
    return None


def _settle(g: Group, levels: tuple[tuple[str, str], ...] = ()) -> None:
    """Minimum, queue and topology of the group, or the problems that keep it from running."""
    n = len(g.pods)
    have = n + g.ran  # members that ran count toward the minimum
    first = g.pods[0]
    try:
        if native.is_native(g.pod_group):
            assert g.pod_group is not None
            _native(g, native.read_spec(g.pod_group, levels), have)
        elif g.pod_group is not None:
            spec = g.pod_group.get("spec") or {}
            kind = f"PodGroup {g.name}"
            g.min_available = native.min_member(g.pod_group, kind)
            g.minimum_said = f"minMember {g.min_available}"
            g.queue = str(spec.get("queue") or "")
            topo = spec.get("topology")
            if topo:
                if not isinstance(topo, dict) or not topo.get("level"):
                    raise SpecError(
                        f"{kind}: spec.topology", "needs a level, e.g. {level: rack, required: true}"
                    )
                g.topology = TopologyConstraint(str(topo["level"]), bool(topo.get("required", False)))
            if keys.is_ours(g.pod_group):
                _tenancy_fields(g, spec, kind)
            if str(g.pod_group.get("apiVersion", "")).startswith("scheduling.volcano.sh/"):
                members = [(p.key, p.labels) for p in g.pods]
                g.subgroups = native.volcano_subgroups(g.pod_group, members, g.min_available)
                _short(g, kind)
            else:
                g.subgroups = native.read_subgroups(g.pod_group, levels)
                if g.subgroups:
                    _assign(g, kind)
            if g.min_available > have and not g.waiting:  # a subgroup short says more
                _below_minimum(g, kind, have)
        elif keys.KUEUE_GROUP_TOTAL in first.annotations:
            g.min_available = whole_number(
                first.annotations[keys.KUEUE_GROUP_TOTAL], f"pod {first.key}: {keys.KUEUE_GROUP_TOTAL}"
            )
            g.minimum_said = f"{keys.KUEUE_GROUP_TOTAL} {g.min_available}"
            if g.min_available > have:
                why = f"{g.min_available} pods expected, {have} present"
                wait_for_pods(g, f"pod group {g.name}", g.min_available - have, why)
        elif keys.MIN_AVAILABLE in first.annotations:
            g.min_available = whole_number(
                first.annotations[keys.MIN_AVAILABLE], f"pod {first.key}: {keys.MIN_AVAILABLE}"
            )
            g.min_available = min(g.min_available, n)
            g.minimum_said = f"{keys.MIN_AVAILABLE} {g.min_available}"
        elif "/RayCluster/" in g.name:
            g.min_available = 1
        else:
            g.min_available = n
        level = first.annotations.get(keys.TOPOLOGY_LEVEL)
        if level and g.topology is None:
            g.topology = TopologyConstraint(
                level, first.annotations.get(keys.TOPOLOGY_REQUIRED, "").lower() == "true"
            )
    except Exception as e:
        g.problems.append(
            describe("PodGroup", g.pod_group, e)
            if g.pod_group is not None
            else describe("Workload", {"metadata": {"name": g.name}}, e)
        )
    g.queue = g.queue or first.tag(keys.QUEUE_KEYS)


def _native(g: Group, spec: native.NativeSpec, have: int) -> None:
    """A Kubernetes-native PodGroup: its gang's minimum (or none), topology, priority, disruption mode."""
    kind = f"PodGroup {g.name}"
    g.problems += spec.problems
    g.min_available = spec.min_count if spec.gang else 1
    g.minimum_said = f"minCount {spec.min_count}" if spec.gang else ""
    g.topology = spec.topology
    g.priority = spec.priority
    g.preempt_whole = spec.preempt_whole
    g.preempts = spec.preempts
    if spec.gang and g.min_available > have:
        _below_minimum(g, kind, have)


def _below_minimum(g: Group, kind: str, have: int) -> None:
    """The gang's minimum exceeds the pods that belong to it so far (`have`: with the members that
    ran): it waits for the rest, and says its minimum as its user wrote it (`minimum_said`)."""
    ran = f", {g.ran} more ended" if g.ran else ""
    why = f"{g.minimum_said} exceeds the {len(g.pods)} pod(s) that belong to it so far{ran}"
    wait_for_pods(g, kind, g.min_available - have, why)


def wait_for_pods(g: Group, who: str, missing: int, why: str) -> None:
    """The gang waits for `missing` more pods to be made (a controller is still making them, or its
    minimum is wrong): one reason for all its pods, said alike for every kind of group."""
    g.missing = missing
    g.waiting = f"{who}: waiting for {more_pods(missing)}: {why}"


def _assign(g: Group, kind: str) -> None:
    """Each pod to the subgroup its label names; a subgroup short of its minimum waits for pods."""
    by_name = {sg.name: sg for sg in g.subgroups}
    for p in g.pods:
        name = p.tag(native.SUBGROUP_LABELS)
        if name not in by_name:
            raise SpecError(
                f"pod {p.key}: label {native.SUBGROUP_LABELS[0]}",
                f"names no subgroup of {kind} ({name!r}; subgroups: {', '.join(sorted(by_name))})",
            )
        by_name[name].pods.append(p.key)
    _short(g, kind)


def _short(g: Group, kind: str) -> None:
    """A subgroup short of its minimum: the group waits for pods."""
    short = [
        (sg.name, sg.min_available - len(sg.pods)) for sg in g.subgroups if len(sg.pods) < sg.min_available
    ]
    if short:
        g.missing = sum(k for _, k in short)
        what = ", ".join(f"{more_pods(k)} in subgroup {name}" for name, k in short)
        g.waiting = f"{kind}: waiting for {what}"


def _by_workload(groups: list[Group]) -> list[Group]:
    """Native PodGroups of one Workload made from different templates (prefill and decode, a
    driver and its workers) are one multi-level gang: each PodGroup a subgroup with its own
    minimum and topology, the whole all-or-nothing. PodGroups of one template (replicas, as a
    LeaderWorkerSet makes them) stay gangs of their own; those of a CompositePodGroup tree are
    its (`_by_composite`)."""
    by_workload: dict[tuple[str, str], list[Group]] = {}
    for g in groups:
        if native.is_native(g.pod_group) and not composite.parent_of(g.pod_group or {}):
            wname = native.template_of(g.pod_group or {})[0]
            if wname:
                by_workload.setdefault((g.namespace, wname), []).append(g)
    out = [g for g in groups]
    for (ns, wname), members in sorted(by_workload.items()):
        templates = {native.template_of(m.pod_group or {})[1] for m in members}
        if len(templates) < 2:
            continue
        merged = _merge(f"{ns}/Workload/{wname}", ns, members)
        out = [g for g in out if g not in members] + [merged]
    return out


def _merge(name: str, ns: str, members: list[Group]) -> Group:
    """Native PodGroups as one multi-level gang: each a subgroup with its own minimum and topology."""
    merged = Group(name, ns, [p for m in members for p in m.pods])
    merged.members = [m.pod_group for m in members if m.pod_group is not None]
    merged.problems = [x for m in members for x in m.problems]
    merged.waiting = "; ".join(m.waiting for m in members if m.waiting)
    merged.missing = sum(m.missing for m in members)
    merged.ended = {k: sum(m.ended.get(k, 0) for m in members) for k in ("Succeeded", "Failed")}
    merged.priority = max((m.priority for m in members if m.priority is not None), default=None)
    merged.preempt_whole = any(m.preempt_whole for m in members)
    merged.preempts = all(m.preempts for m in members)
    merged.queue = next((m.queue for m in members if m.queue), "")
    merged.subgroups = [
        native.SubGroupOf(
            m.name.split("/", 1)[1],
            max(1, min(m.min_available - m.ran, len(m.pods))),
            m.topology,
            [p.key for p in m.pods],
        )
        for m in members
    ]
    merged.min_available = sum(sg.min_available for sg in merged.subgroups)
    merged.minimum_said = "minCount " + "+".join(str(m.min_available) for m in members)
    return merged


Key = tuple[str, str]


def _by_composite(
    groups: list[Group],
    natives: dict[Key, dict[str, Any]],
    composites: dict[Key, dict[str, Any]],
    levels: tuple[tuple[str, str], ...],
) -> list[Group]:
    """The PodGroups of one CompositePodGroup tree (1.37) as one multi-level gang (`_tree`)."""
    out: list[Group] = []
    trees: dict[Key, list[Group]] = {}
    for g in groups:
        pg = g.pod_group
        if pg is None or not native.is_native(pg) or not composite.parent_of(pg):
            out.append(g)
            continue
        try:
            up = composite.chain(pg, composites)
        except composite.NotYet as e:
            g.waiting = g.waiting or str(e)
            out.append(g)
            continue
        except SpecError as e:
            g.problems.append(describe("PodGroup", pg, e))
            out.append(g)
            continue
        trees.setdefault(composite.key_of(up[-1]), []).append(g)
    for root, members in sorted(trees.items()):
        out += _tree(root, members, natives, composites, levels)
    return out


def _tree(
    root: Key,
    members: list[Group],
    natives: dict[Key, dict[str, Any]],
    composites: dict[Key, dict[str, Any]],
    levels: tuple[tuple[str, str], ...],
) -> list[Group]:
    """One tree: its gang levels checked against what the core places (every subgroup, one level of
    them), its PodGroups merged; a `basic` root leaves them the gangs they are."""
    ns, name = root
    tree = [root, *_inner(root, natives, composites)]
    problems: list[str] = []
    specs: dict[Key, composite.CompositeSpec] = {}
    for k in tree:
        try:
            specs[k] = composite.read(composites[k], levels)
        except SpecError as e:
            problems.append(describe(composite.KIND, composites[k], e))
    top = specs.get(root)
    if top is not None and top.min_groups is None:  # basic: no gang over its PodGroups
        if top.topology is not None:
            for m in members:
                m.problems.append(
                    f"{composite.KIND} {ns}/{name}: spec.schedulingConstraints: a topology constraint over "
                    "a basic (non-gang) tree is not honoured: make it a gang (minGroupCount) or drop it"
                )
        return members
    merged = _merge(f"{ns}/{composite.KIND}/{name}", ns, members)
    merged.composites = [composites[k] for k in tree]
    merged.problems += problems
    waiting = [merged.waiting] if merged.waiting else []
    have = {composite.key_of(m.pod_group) for m in members if m.pod_group is not None}
    for k, spec in specs.items():
        label = f"{composite.KIND} {k[0]}/{k[1]}"
        if k != root and spec.topology is not None:
            merged.problems.append(
                f"{label}: spec.schedulingConstraints: a topology constraint on an inner level of a "
                "tree is not honoured yet (Phalanx places topology at the root and at each PodGroup)"
            )
        kids = sum(len(x) for x in composite.children(k, natives, composites))
        if spec.min_groups is not None and spec.min_groups < kids:
            merged.problems.append(
                f"{label}: spec.schedulingPolicy.gang.minGroupCount: {spec.min_groups} of the {kids} "
                f"groups under it: Phalanx places every group (set it to {kids})"
            )
        elif spec.min_groups is not None and spec.min_groups > kids:
            waiting.append(
                f"{label}: waiting for {spec.min_groups - kids} more group(s) "
                f"(minGroupCount {spec.min_groups})"
            )
    for k in composite.leaves(root, natives, composites):
        if k not in have:  # a PodGroup of the tree none of whose pods exists yet
            need = native.min_member(natives[k], f"PodGroup {k[0]}/{k[1]}")
            merged.missing += need
            waiting.append(f"PodGroup {k[0]}/{k[1]}: waiting for {more_pods(need)}")
    merged.waiting = "; ".join(waiting)
    if top is not None:
        merged.topology = top.topology
        if top.priority is not None:
            merged.priority = top.priority if merged.priority is None else max(top.priority, merged.priority)
    merged.preempt_whole = merged.preempt_whole or any(s.preempt_whole for s in specs.values())
    merged.preempts = merged.preempts and all(s.preempts for s in specs.values())
    return [merged]


def _inner(root: Key, natives: dict[Key, dict[str, Any]], composites: dict[Key, dict[str, Any]]) -> list[Key]:
    """The CompositePodGroups under `root`, at any depth."""
    _, kids = composite.children(root, natives, composites)
    return kids + [k for c in kids for k in _inner(c, natives, composites)]


def more_pods(k: int) -> str:
    """`1 more pod`, `3 more pods`: how many pods a gang still waits for."""
    return f"{k} more pod" + ("s" if k != 1 else "")


def _tenancy_fields(g: Group, spec: dict[str, Any], kind: str) -> None:
    """Our PodGroup's preemption and run-time fields (issue 5): what reclaim and reservation read."""
    if "preemptible" in spec:
        if not isinstance(spec["preemptible"], bool):
            raise SpecError(
                f"{kind}: spec.preemptible", f"must be true or false, got {spec['preemptible']!r}"
            )
        g.preemptible = spec["preemptible"]
    for key, attr in (
        ("checkpointIntervalSeconds", "checkpoint_interval"),
        ("estimatedRuntimeSeconds", "estimated_runtime"),
    ):
        if key in spec:
            setattr(g, attr, _seconds(str(spec[key]), f"{kind}: spec.{key}"))


def workload_of(g: Group, queue: str) -> Workload:
    """The group as a core Workload; its tasks are named by pod (namespace/name)."""
    shapes: dict[tuple[object, ...], tuple[TaskRequest, list[str]]] = {}
    subgroup = {key: sg.name for sg in g.subgroups for key in sg.pods}
    for p in g.pods:
        shapes.setdefault((subgroup.get(p.key, ""), p.request.shape_key), (p.request, []))[1].append(p.key)
    podsets = tuple(
        PodSet(f"ps{k}", len(names), req, tuple(names)) for k, (req, names) in enumerate(shapes.values())
    )
    subgroups = tuple(
        SubGroup(
            sg.name,
            tuple(ps.name for (name, _), ps in zip(shapes, podsets, strict=True) if name == sg.name),
            max(1, min(sg.min_available, len(sg.pods))),
            sg.topology,
            implicit=sg.implicit,
        )
        for sg in g.subgroups
        if sg.pods
    )
    first = g.pods[0]
    notes = first.annotations
    where = f"pod {first.key}"
    created = min(p.created for p in g.pods)
    if g.pod_group is not None:
        created = timestamp((g.pod_group.get("metadata") or {}).get("creationTimestamp")) or created
    return Workload(
        g.name,
        podsets,
        # members that ran and ended count toward the minimum: those left need only the rest
        min_available=max(1, min(g.min_available - g.ran, len(g.pods))),
        queue=queue,
        priority=g.priority if g.priority is not None else max(p.priority for p in g.pods),
        preemptible=(
            g.preemptible
            if g.preemptible is not None
            else notes.get(keys.PREEMPTIBLE, "true").lower() != "false"
        ),
        creation_time=created,
        topology=g.topology,
        checkpoint_interval=g.checkpoint_interval
        or _seconds(notes.get(keys.CHECKPOINT_INTERVAL), f"{where}: {keys.CHECKPOINT_INTERVAL}")
        or 0.0,
        last_checkpoint=last_checkpoint(g.pods),
        restart_s=_seconds(notes.get(keys.RESTART_SECONDS), f"{where}: {keys.RESTART_SECONDS}", zero=True),
        estimated_runtime=g.estimated_runtime
        or _seconds(notes.get(keys.ESTIMATED_RUNTIME), f"{where}: {keys.ESTIMATED_RUNTIME}"),
        quota_exempt=g.exempt,
        subgroups=subgroups,
        preempt_whole=g.preempt_whole,
        preempts=g.preempts and all(p.preempts for p in g.pods),
        task_noun="pod",
        minimum_said=g.minimum_said,
    )


def last_checkpoint(pods: list[PodInfo]) -> float | None:
    """The latest `phalanx.io/last-checkpoint` among the pods (any rank may report it).

    A value that is not an RFC 3339 time is logged, naming the pod, and left out: the workload
    is scheduled as if it had not reported (its checkpoints counted from its bind), not dropped.
    """
    out: float | None = None
    for p in pods:
        text = p.annotations.get(keys.LAST_CHECKPOINT)
        if text is None:
            continue
        at = _instant(text)
        if at is None:
            if len(_warned) > 10_000:
                _warned.clear()
            if (p.key, text) not in _warned:
                _warned.add((p.key, text))
                log.warning(
                    "pod %s: annotation %s is not an RFC 3339 time with an offset (%r); "
                    "its checkpoints count from its bind",
                    p.key,
                    keys.LAST_CHECKPOINT,
                    text[:64],
                )
            continue
        out = at if out is None else max(out, at)
    return out


_warned: set[tuple[str, str]] = set()  # bad last-checkpoint values already logged (once each)


def _instant(text: str) -> float | None:
    """A user-written RFC 3339 time ("2026-12-01T10:00:00Z", an offset required) -> epoch seconds;
    None if not one. Written by hand or by a training script, it may carry spaces around it and
    a lower-case `z`, which RFC 3339 allows."""
    return rfc3339(text.strip().replace("z", "+00:00"), offset_required=True)


def _seconds(text: str | None, where: str, zero: bool = False) -> float | None:
    """Seconds from an annotation (`90` or `90s`); above 0, or also 0 with `zero`."""
    if text is None:
        return None
    try:
        v = float(text.rstrip("s"))
    except ValueError:
        raise SpecError(where, f"expected seconds, got {text!r}") from None
    if not (v > 0 or (zero and v == 0)) or not math.isfinite(v):
        raise SpecError(where, f"must be {'>=' if zero else '>'} 0 seconds, got {text!r}")
    return v
