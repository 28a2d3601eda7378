"""Kubernetes' CompositePodGroup (scheduling.k8s.io/v1alpha3, 1.37): a tree of PodGroups placed as
one multi-level gang.

A PodGroup or CompositePodGroup names its parent in `spec.parentCompositePodGroupName`; the root
names none. A gang root (`schedulingPolicy.gang.minGroupCount`) needs that many child groups; each
PodGroup of the tree keeps its own gang minimum and topology, and the root's topology constraint
holds for the whole tree. Phalanx places such a tree as one workload whose subgroups are the
tree's PodGroups (`phalanx.k8s.read.groups`), all-or-nothing at the top. What the core cannot
honour is said, never silently dropped: a `minGroupCount` below the number of child groups (the
core places every subgroup), and a topology constraint on an inner CompositePodGroup of a deeper
tree (the core has one level of subgroups). A root with `basic: {}` is no gang: its PodGroups are
placed as the gangs they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phalanx.core.errors import SpecError
from phalanx.core.model import TopologyConstraint
from phalanx.k8s.read import native
from phalanx.spec.quantity import whole_number

KIND = "CompositePodGroup"
MAX_DEPTH = 4  # the API's WorkloadMaxTreeDepth

Key = tuple[str, str]  # (namespace, name)


def parent_of(obj: dict[str, Any]) -> str:
    """The CompositePodGroup this group belongs to ("" for a root or a group outside any tree)."""
    return str((obj.get("spec") or {}).get("parentCompositePodGroupName") or "")


def is_composite(obj: dict[str, Any]) -> bool:
    return native.is_native(obj) and obj.get("kind") == KIND


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "default")), str(meta.get("name", ""))


class NotYet(SpecError):
    """A parent named that does not exist yet: the group waits for it (it may be made next)."""


def chain(obj: dict[str, Any], composites: dict[Key, dict[str, Any]]) -> list[dict[str, Any]]:
    """The CompositePodGroups above `obj`, its parent first and the root last; raises SpecError for
    a parent that does not exist, a cycle, or a tree deeper than the API allows."""
    ns, name = key_of(obj)
    out: list[dict[str, Any]] = []
    seen = {name} if is_composite(obj) else set()
    at, where = obj, f"{obj.get('kind', 'PodGroup')} {ns}/{name}: spec.parentCompositePodGroupName"
    while parent := parent_of(at):
        found = composites.get((ns, parent))
        if found is None:
            raise NotYet(where, f"CompositePodGroup {ns}/{parent} does not exist yet: its pods wait for it")
        if parent in seen:
            raise SpecError(where, f"the parents form a cycle through {parent}")
        seen.add(parent)
        out.append(found)
        if len(out) >= MAX_DEPTH:
            raise SpecError(where, f"the tree is deeper than {MAX_DEPTH} levels")
        at, where = found, f"CompositePodGroup {ns}/{parent}: spec.parentCompositePodGroupName"
    return out


@dataclass
class CompositeSpec:
    """What one CompositePodGroup asks: a gang of `min_groups` child groups (None: `basic`, no gang)."""

    name: str
    min_groups: int | None
    topology: TopologyConstraint | None = None
    priority: int | None = None
    preempt_whole: bool = False
    preempts: bool = True
    problems: list[str] = field(default_factory=list)


def read(cpg: dict[str, Any], levels: tuple[tuple[str, str], ...]) -> CompositeSpec:
    """The CompositePodGroup's policy; raises SpecError naming the field that is wrong."""
    ns, name = key_of(cpg)
    kind = f"{KIND} {ns}/{name}"
    spec = cpg.get("spec") or {}
    policy = spec.get("schedulingPolicy") or {}
    if "gang" in policy:
        raw = (policy.get("gang") or {}).get("minGroupCount", 1)
        groups: int | None = whole_number(raw, f"{kind}: spec.schedulingPolicy.gang.minGroupCount", 1)
    elif "basic" in policy:
        groups = None
    else:
        raise SpecError(f"{kind}: spec.schedulingPolicy", "needs gang: {minGroupCount: N} or basic: {}")
    # the PodGroup reader's topology, priority and modes: the fields are spelled alike
    as_group = {"metadata": cpg.get("metadata") or {}, "spec": {**spec, "schedulingPolicy": {"basic": {}}}}
    base = native.read_spec(as_group, levels, noun=KIND)
    return CompositeSpec(
        f"{ns}/{name}", groups, base.topology, base.priority, base.preempt_whole, base.preempts
    )


def children(
    root: Key, pod_groups: dict[Key, dict[str, Any]], composites: dict[Key, dict[str, Any]]
) -> tuple[list[Key], list[Key]]:
    """The direct children of `root`: (its PodGroups, its CompositePodGroups), by key, sorted."""
    ns, name = root
    groups = sorted(k for k, o in pod_groups.items() if k[0] == ns and parent_of(o) == name)
    inner = sorted(k for k, o in composites.items() if k[0] == ns and parent_of(o) == name)
    return groups, inner


def leaves(
    root: Key, pod_groups: dict[Key, dict[str, Any]], composites: dict[Key, dict[str, Any]]
) -> list[Key]:
    """Every PodGroup under `root`, at any depth, by key."""
    groups, inner = children(root, pod_groups, composites)
    return groups + [k for c in inner for k in leaves(c, pod_groups, composites)]
