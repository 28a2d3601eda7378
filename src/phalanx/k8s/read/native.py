"""Kubernetes-native gangs (scheduling.k8s.io: PodGroup v1alpha2 in 1.36, v1beta1 in 1.37;
CompositePodGroup v1alpha3 in 1.37) read as a dialect beside ours, KAI's and Volcano's, and the
subgroups of ours and KAI's PodGroups.

A pod joins a native PodGroup with `spec.schedulingGroup.podGroupName`. The PodGroup carries a
copy of its Workload template's policy: `schedulingPolicy.gang.minCount` (or `basic: {}`, pods
placed one by one; mutable from 1.37, read anew each cycle), `schedulingConstraints.topology[].key`
(node label keys, mapped onto the configured topology levels; always required), `priority` /
`priorityClassName`, `disruptionMode` (preempted whole: the string `PodGroup` in v1alpha2, the
union `{all: {}}` in v1beta1), `preemptionPolicy` (1.37: `Never` evicts nobody to be placed) and
`resourceClaims` (claims its pods share, allocated once and reserved for the PodGroup:
`group_claims`). Its Workload is `podGroupTemplateRef.workload` (v1alpha2) or `workloadRef`
(v1beta1), and a PodGroup of a CompositePodGroup tree names its parent in
`parentCompositePodGroupName`: the tree is one multi-level gang (`composite_of`). The reader goes
by field names, never by version; a field it does not know is ignored, a value it cannot honour
is a problem that keeps the gang waiting, said so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phalanx.core.errors import SpecError
from phalanx.core.model import TopologyConstraint
from phalanx.spec.quantity import whole_number

GROUP = "scheduling.k8s.io"
HOSTNAME = "kubernetes.io/hostname"
SUBGROUP_LABELS = ("phalanx.io/subgroup", "kai.scheduler/subgroup-name")
# Volcano's pods no subGroupPolicy entry selects: in parentheses, so that it sorts before any name
# a user can write (subgroups of equal demand are tried by name) and is never taken for one
IMPLICIT = "(pods no subGroupPolicy entry selects)"


def is_native(obj: dict[str, Any] | None) -> bool:
    return obj is not None and str(obj.get("apiVersion", "")).startswith(GROUP + "/")


@dataclass
class NativeSpec:
    """What a native PodGroup asks of its pods."""

    min_count: int = 1
    gang: bool = True
    topology: TopologyConstraint | None = None
    priority: int | None = None
    preempt_whole: bool = False
    preempts: bool = True  # preemptionPolicy: Never says False
    workload: str = ""  # the Workload it was made from (`template_of`)
    template: str = ""  # ... and its template
    problems: list[str] = field(default_factory=list)


def gang_minimum(pg: dict[str, Any]) -> tuple[str, Any]:
    """Where a PodGroup keeps its gang's minimum, and what it says there (1 when it says nothing):
    Kubernetes' own PodGroup in its gang policy's `minCount`, ours, KAI's, Volcano's and
    scheduler-plugins' in `spec.minMember`. The raw JSON value: each reader checks it its own way."""
    spec = pg.get("spec") or {}
    if is_native(pg):
        gang = (spec.get("schedulingPolicy") or {}).get("gang") or {}
        return "spec.schedulingPolicy.gang.minCount", gang.get("minCount", 1)
    return "spec.minMember", spec.get("minMember", 1)


def min_member(pg: dict[str, Any], kind: str) -> int:
    """The PodGroup's gang minimum, a whole number >= 1; raises SpecError naming `kind` and the field."""
    where, raw = gang_minimum(pg)
    return whole_number(raw, f"{kind}: {where}", 1)


def level_of(key: str, levels: tuple[tuple[str, str], ...], where: str) -> str:
    """A node label key (`topology.kubernetes.io/zone`) -> our level (`zone`); the level's own
    name is accepted too."""
    if key in (HOSTNAME, "node", "hostname"):
        return "node"
    for level, label in levels:
        if key in (label, level):
            return level
    known = ", ".join(f"{lv}={lab}" for lv, lab in levels) or "none"
    raise SpecError(where, f"no topology level has node label key {key!r} (levels: {known}, {HOSTNAME})")


def read_spec(pg: dict[str, Any], levels: tuple[tuple[str, str], ...], noun: str = "PodGroup") -> NativeSpec:
    """The PodGroup's policy (or a CompositePodGroup's: `noun`, for messages); raises SpecError
    naming the field that is wrong."""
    meta = pg.get("metadata") or {}
    kind = f"{noun} {meta.get('namespace', 'default')}/{meta.get('name', '')}"
    spec = pg.get("spec") or {}
    out = NativeSpec()
    policy = spec.get("schedulingPolicy") or {}
    if "gang" in policy:
        out.min_count = min_member(pg, kind)
    elif "basic" in policy:
        out.gang = False
    else:
        raise SpecError(f"{kind}: spec.schedulingPolicy", "needs gang: {minCount: N} or basic: {}")
    topo = (spec.get("schedulingConstraints") or {}).get("topology") or []
    order = ["node", *reversed([lv for lv, _ in levels])]  # narrowest first
    found = []
    for k, t in enumerate(topo):
        where = f"{kind}: spec.schedulingConstraints.topology[{k}].key"
        key = t.get("key") if isinstance(t, dict) else None
        if not key:
            raise SpecError(where, "needs a node label key, e.g. topology.kubernetes.io/zone")
        found.append(level_of(str(key), levels, where))
    if found:  # every constraint holds when the narrowest does (levels nest)
        out.topology = TopologyConstraint(min(found, key=order.index), True)
    if spec.get("priority") is not None:
        out.priority = whole_number(spec["priority"], f"{kind}: spec.priority", -(2**31))
    out.preempt_whole = disrupted_whole(spec, kind)
    out.preempts = preempts(spec, kind)
    out.workload, out.template = template_of(pg)
    return out


# disruptionMode: v1alpha2 (1.36) writes a string, v1beta1 (1.37) a union of one empty member
_WHOLE = {"PodGroup": True, "Pod": False, "All": True, "Single": False, "all": True, "single": False}


def disrupted_whole(spec: dict[str, Any], kind: str) -> bool:
    """`disruptionMode`: True when the group is preempted only whole (`PodGroup`, `{all: {}}`)."""
    mode = spec.get("disruptionMode")
    where = f"{kind}: spec.disruptionMode"
    if mode is None:
        return False
    if isinstance(mode, dict):
        set_ = [k for k, v in mode.items() if v is not None]
        if len(set_) != 1 or set_[0] not in ("all", "single"):
            raise SpecError(where, f"must set exactly one of all: {{}} or single: {{}}, got {mode!r}")
        return _WHOLE[set_[0]]
    if isinstance(mode, str) and mode in _WHOLE:
        return _WHOLE[mode]
    raise SpecError(where, f"must be {{all: {{}}}} or {{single: {{}}}} (1.36: PodGroup or Pod), got {mode!r}")


def preempts(spec: dict[str, Any], kind: str) -> bool:
    """`preemptionPolicy` (1.37): `Never` places the group only in free room, evicting nobody."""
    policy = spec.get("preemptionPolicy")
    if policy in (None, "PreemptLowerPriority"):
        return True
    if policy == "Never":
        return False
    raise SpecError(
        f"{kind}: spec.preemptionPolicy", f"must be PreemptLowerPriority or Never, got {policy!r}"
    )


def template_of(pg: dict[str, Any]) -> tuple[str, str]:
    """(Workload name, template name) the group was made from: `workloadRef` (1.37) or
    `podGroupTemplateRef.workload` (1.36); ("", "") for a group made by hand."""
    spec = pg.get("spec") or {}
    ref = spec.get("workloadRef")
    if isinstance(ref, dict):
        return str(ref.get("workloadName") or ""), str(ref.get("templateName") or "")
    old = (spec.get("podGroupTemplateRef") or {}).get("workload") or {}
    return str(old.get("workloadName") or ""), str(old.get("podGroupTemplateName") or "")


def group_claims(pod: dict[str, Any], pg: dict[str, Any]) -> dict[str, str]:
    """The pod's claims that are its PodGroup's (`spec.resourceClaims`, matched on every field, as
    the API matches them): pod claim name -> the ResourceClaim's name, "" while the one made from
    a template is not recorded in the PodGroup's `status.resourceClaimStatuses` yet. Such a claim
    is allocated once and reserved for the PodGroup, not for its pods."""
    fields = ("name", "resourceClaimName", "resourceClaimTemplateName")
    theirs = {
        tuple(str(c.get(f) or "") for f in fields) for c in (pg.get("spec") or {}).get("resourceClaims") or []
    }
    made = {
        str(s.get("name")): str(s.get("resourceClaimName") or "")
        for s in (pg.get("status") or {}).get("resourceClaimStatuses") or []
    }
    out = {}
    for rc in (pod.get("spec") or {}).get("resourceClaims") or []:
        key = tuple(str(rc.get(f) or "") for f in fields)
        if key in theirs:
            out[key[0]] = key[1] or made.get(key[0], "")
    return out


def reference(pg: dict[str, Any]) -> dict[str, str]:
    """The PodGroup as a claim's `status.reservedFor` entry."""
    meta = pg.get("metadata") or {}
    return {
        "apiGroup": GROUP,
        "resource": "podgroups",
        "name": str(meta.get("name")),
        "uid": str(meta.get("uid")),
    }


@dataclass
class SubGroupOf:
    """One subgroup of a group: its name, its minimum, its topology and its pods (by key)."""

    name: str
    min_available: int
    topology: TopologyConstraint | None
    pods: list[str] = field(default_factory=list)
    implicit: bool = False  # not one the user wrote (`SubGroup.implicit`)


def read_subgroups(pg: dict[str, Any], levels: tuple[tuple[str, str], ...]) -> list[SubGroupOf]:
    """Ours: spec.subGroups[] {name, minMember, topology: {level, required}}. KAI's (v2alpha2):
    spec.subgroups[] {name, minMember, parent, topologyConstraint: {requiredTopologyLevel,
    preferredTopologyLevel}} - leaves only: a parent's own constraint is not honoured."""
    meta = pg.get("metadata") or {}
    kind = f"PodGroup {meta.get('namespace', 'default')}/{meta.get('name', '')}"
    spec = pg.get("spec") or {}
    field_name = "subGroups" if "subGroups" in spec else "subgroups"
    items = spec.get(field_name) or []
    if not isinstance(items, list):
        raise SpecError(f"{kind}: spec.{field_name}", "must be a list")
    parents = {str(s.get("parent")) for s in items if isinstance(s, dict) and s.get("parent")}
    out = []
    for k, s in enumerate(items):
        where = f"{kind}: spec.{field_name}[{k}]"
        if not isinstance(s, dict) or not s.get("name"):
            raise SpecError(where, "needs a name")
        if str(s["name"]) in parents:
            continue  # an inner node of KAI's hierarchy: its leaves carry the pods
        topo = None
        t = s.get("topology")
        if isinstance(t, dict) and t.get("level"):
            topo = TopologyConstraint(str(t["level"]), bool(t.get("required", False)))
        kai = s.get("topologyConstraint")
        if isinstance(kai, dict):
            for key, required in (("requiredTopologyLevel", True), ("preferredTopologyLevel", False)):
                if kai.get(key):
                    lv = level_of(str(kai[key]), levels, f"{where}.topologyConstraint.{key}")
                    topo = TopologyConstraint(lv, required)
                    break
        size = whole_number(s.get("minMember", 1), f"{where}.minMember", 1)
        out.append(SubGroupOf(str(s["name"]), size, topo))
    return out


def volcano_subgroups(
    pg: dict[str, Any], pods: list[tuple[str, dict[str, str]]], min_member: int
) -> list[SubGroupOf]:
    """Volcano's `spec.subGroupPolicy[]` (1.14): pods matching an entry's `labelSelector.matchLabels`,
    split by the values of its `matchLabelKeys`, form subgroups of `subGroupSize` pods each (the
    minimum). Phalanx needs every subgroup an entry forms (`minSubGroups` below their count is
    refused, said so); `networkTopology` (HyperNode tiers) is not read. Pods no entry selects form
    one more subgroup with what `minMember` leaves, marked implicit. A PodGroup without a
    subGroupPolicy has no subgroups: the flat gang it is to its user."""
    meta = pg.get("metadata") or {}
    kind = f"PodGroup {meta.get('namespace', 'default')}/{meta.get('name', '')}"
    out: list[SubGroupOf] = []
    taken: set[str] = set()
    for k, e in enumerate((pg.get("spec") or {}).get("subGroupPolicy") or []):
        where = f"{kind}: spec.subGroupPolicy[{k}]"
        if not isinstance(e, dict) or not e.get("name"):
            raise SpecError(where, "needs a name")
        sel = e.get("labelSelector") or {}
        if sel.get("matchExpressions"):
            raise SpecError(f"{where}.labelSelector", "only matchLabels is read")
        match = {str(a): str(b) for a, b in (sel.get("matchLabels") or {}).items()}
        split_by = [str(x) for x in e.get("matchLabelKeys") or []]
        size = whole_number(e.get("subGroupSize", 1), f"{where}.subGroupSize", 1)
        parts: dict[str, list[str]] = {}
        for key, labels in pods:
            if key not in taken and all(labels.get(a) == b for a, b in match.items()):
                parts.setdefault("/".join(labels.get(x, "") for x in split_by), []).append(key)
                taken.add(key)
        want = whole_number(e.get("minSubGroups", len(parts) or 1), f"{where}.minSubGroups", 0)
        if parts and want < len(parts):
            raise SpecError(
                f"{where}.minSubGroups",
                f"{want} of the {len(parts)} subgroups it forms: Phalanx places every subgroup "
                f"(set it to {len(parts)})",
            )
        for value, keys in sorted(parts.items()):
            out.append(SubGroupOf(f"{e['name']}/{value}" if split_by else str(e["name"]), size, None, keys))
        for j in range(len(parts), want):  # subgroups whose pods do not exist yet
            out.append(SubGroupOf(f"{e['name']}/#{j}", size, None, []))
    if not out:
        return []  # no subGroupPolicy: a flat gang, decided as one (packing, consolidation, shrinking)
    rest = [key for key, _ in pods if key not in taken]
    if rest:
        need = max(1, min(len(rest), min_member - sum(sg.min_available for sg in out)))
        out.append(SubGroupOf(IMPLICIT, need, None, rest, implicit=True))
    return out
