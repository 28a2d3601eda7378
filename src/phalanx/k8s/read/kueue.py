"""Kueue's objects (kueue.x-k8s.io v1beta2, or v1beta1 where only that is served) for Kueue users.

Two modes (`--kueue`):
- **coexist** (the default when a Kueue controller runs: its ClusterQueues have status
  conditions): Kueue admits, Phalanx places. A pod whose Job, pod group or pod has a Kueue
  Workload is placed only once that Workload is admitted, on nodes of the flavors Kueue
  assigned (the ResourceFlavor's node labels), and Phalanx's quota admission does not apply
  to it: the quota is Kueue's, never counted twice.
- **migrate**: the Kueue objects are configuration and Phalanx enforces them. Cohorts become
  parent queues (a Cohort's `parentName` nests them), ClusterQueues leaf queues whose quotas are
  the sums of their flavors' `nominalQuota`, `borrowingLimit` and `lendingLimit` per resource
  (`nvidia.com/gpu`, `cpu`, `memory`), with `fairSharing.weight` as the over-quota weight; a
  ClusterQueue outside any cohort cannot borrow. A LocalQueue name (the
  `kueue.x-k8s.io/queue-name` label on the pod or its Job) resolves to its ClusterQueue, and the
  pods go to nodes of that ClusterQueue's flavors. What Phalanx cannot honour is listed by
  `unhonoured` (logged at start-up and when it changes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from phalanx.core.affinity import NodeRequirement, NodeSelectorTerm
from phalanx.core.errors import SpecError
from phalanx.k8s.client.cache import object_key
from phalanx.k8s.client.kinds import JOBS, KUEUE
from phalanx.k8s.read.contain import Contain
from phalanx.spec.quantity import cpu_milli, memory_mib

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
GPU = "nvidia.com/gpu"
_OURS = {GPU: "gpu", "cpu": "cpu", "memory": "memory"}
_LIMITS = (
    ("nominalQuota", "deserved"),
    ("borrowingLimit", "borrowing_limit"),
    ("lendingLimit", "lending_limit"),
)


@dataclass(frozen=True)
class Admission:
    """A Kueue Workload as Phalanx needs it."""

    workload: str  # namespace/name
    cluster_queue: str
    admitted: bool
    flavors: tuple[str, ...]  # flavors assigned to its pod sets (any resource), in order


@dataclass
class Kueue:
    mode: str  # "coexist", "migrate" or "off"
    local_queues: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, name) -> CQ
    flavor_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    cq_flavors: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # by (namespace, owner kind, owner name); plain pods by (namespace, "Pod", name), pod groups by
    # (namespace, "PodGroup", group name)
    admissions: dict[tuple[str, str, str], Admission] = field(default_factory=dict)
    queue_specs: list[dict[str, Any]] = field(default_factory=list)  # migrate: our queue specs
    problems: dict[str, str] = field(default_factory=dict)  # "Kind name" -> what is wrong
    present: bool = False  # any Kueue ClusterQueue exists
    controller: bool = False  # a Kueue controller keeps their status
    unhonoured: list[str] = field(default_factory=list)  # migrate: what is not carried over

    def node_terms(self, flavors: tuple[str, ...]) -> tuple[NodeSelectorTerm, ...]:
        """Nodes of any of these flavors (a flavor without node labels matches every node)."""
        terms: list[NodeSelectorTerm] = []
        for f in flavors:
            labels = self.flavor_labels.get(f, {})
            if not labels:
                return ()
            terms.append(tuple(NodeRequirement(k, "In", (v,)) for k, v in sorted(labels.items())))
        return tuple(terms)


def _meta(obj: dict[str, Any]) -> tuple[str, str]:
    m = obj.get("metadata") or {}
    return str(m.get("namespace") or ""), str(m.get("name") or "")


def _amount(resource: str, value: Any, where: str) -> float:
    """A Kueue quantity in accounting units: GPUs, milli-CPU, MiB."""
    if resource == GPU:
        try:
            return float(str(value))
        except ValueError:
            raise SpecError(where, f"expected a number of GPUs, got {value!r}") from None
    if resource == "cpu":
        return float(cpu_milli(value, where))
    return float(memory_mib(value, where))


def _spec_value(resource: str, v: float) -> float | str:
    """Accounting units -> our queue spec's (GPUs, `m`, `Mi`)."""
    if resource == GPU:
        return v
    return f"{round(v)}m" if resource == "cpu" else f"{round(v)}Mi"


def _groups_quotas(spec: dict[str, Any], where: str) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """Per resource, the sums over flavors of nominal quota and limits; and the flavors in order."""
    sums: dict[str, dict[str, float]] = {}
    flavors: list[str] = []
    groups = spec.get("resourceGroups") or []
    if not isinstance(groups, list):
        raise SpecError(f"{where}: spec.resourceGroups", "must be a list")
    for gi, group in enumerate(groups):
        for fi, fl in enumerate((group or {}).get("flavors") or []):
            fname = str((fl or {}).get("name") or "")
            if not fname:
                raise SpecError(f"{where}: spec.resourceGroups[{gi}].flavors[{fi}]", "needs a name")
            if fname not in flavors:
                flavors.append(fname)
            for ri, res in enumerate((fl or {}).get("resources") or []):
                rname = str((res or {}).get("name") or "")
                if rname not in _OURS:
                    continue  # other resources (pods, ephemeral storage) are not accounted by Phalanx
                w = f"{where}: spec.resourceGroups[{gi}].flavors[{fi}].resources[{ri}]"
                for theirs, ours in _LIMITS:
                    if theirs in res:
                        v = _amount(rname, res[theirs], f"{w}.{theirs}")
                        sums.setdefault(rname, {})[ours] = sums.get(rname, {}).get(ours, 0.0) + v
    quotas = {_OURS[r]: {k: _spec_value(r, v) for k, v in vals.items()} for r, vals in sums.items()}
    return quotas, tuple(flavors)


def _cq(obj: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...], bool]:
    _, name = _meta(obj)
    where = f"ClusterQueue {name}"
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        raise SpecError(where, "spec must be a mapping")
    quotas, flavors = _groups_quotas(spec, where)
    cohort = str(spec.get("cohortName") or spec.get("cohort") or "")
    weight = (
        ((spec.get("fairSharing") or {}).get("weight")) if isinstance(spec.get("fairSharing"), dict) else None
    )
    for q in quotas.values():
        if weight is not None:
            q["over_quota_weight"] = float(str(weight))
        if not cohort:
            q["limit"] = q.get("deserved", 0)  # outside a cohort nothing can be borrowed
    status = obj.get("status") or {}
    controlled = bool(status.get("conditions")) if isinstance(status, dict) else False
    return {"name": name, "parent": cohort, "priority": 0, "quotas": quotas}, flavors, controlled


def unhonoured(cluster_queues: list[dict[str, Any]]) -> list[str]:
    """ClusterQueue fields migration mode does not carry over, one line per queue."""
    out = []
    for obj in cluster_queues:
        try:
            line = _unhonoured_one(obj)
        except Exception:  # a queue too broken to say more about: `parse` names it already
            continue
        if line:
            out.append(line)
    return out


def _unhonoured_one(obj: dict[str, Any]) -> str:
    _, name = _meta(obj)
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        return ""
    missed = []
    pre = spec.get("preemption") or {}
    if pre.get("withinClusterQueue", "Never") not in ("Never", "LowerPriority"):
        missed.append(
            f"preemption.withinClusterQueue={pre['withinClusterQueue']} (the profile's preempt decides)"
        )
    if pre.get("reclaimWithinCohort", "Never") not in ("Never", "Any"):
        missed.append(
            f"preemption.reclaimWithinCohort={pre['reclaimWithinCohort']} (the profile's reclaim decides)"
        )
    if pre.get("borrowWithinCohort"):
        missed.append("preemption.borrowWithinCohort")
    for key in (
        "flavorFungibility",
        "admissionChecks",
        "admissionChecksStrategy",
        "stopPolicy",
        "namespaceSelector",
    ):
        if spec.get(key) not in (None, {}, [], "None"):
            missed.append(key)
    groups = spec.get("resourceGroups")
    names = {str((f or {}).get("name")) for g in groups or [] for f in ((g or {}).get("flavors") or [])}
    if len(names) > 1:
        missed.append("per-flavor quotas (their sum is enforced; pods may use any of the flavors' nodes)")
    if spec.get("queueingStrategy") == "StrictFIFO":
        missed.append("queueingStrategy=StrictFIFO (the profile's order decides)")
    return f"ClusterQueue {name}: not honoured: {'; '.join(missed)}" if missed else ""


def _admission(obj: dict[str, Any]) -> tuple[list[tuple[str, str, str]], Admission]:
    ns, name = _meta(obj)
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    adm = status.get("admission") or {}
    admitted = any(
        c.get("type") == "Admitted" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    flavors: list[str] = []
    for ps in adm.get("podSetAssignments") or []:
        for f in (ps.get("flavors") or {}).values():
            if str(f) not in flavors:
                flavors.append(str(f))
    a = Admission(f"{ns}/{name}", str(adm.get("clusterQueue") or ""), admitted and bool(adm), tuple(flavors))
    keys = [(ns, str(r.get("kind")), str(r.get("name"))) for r in meta.get("ownerReferences") or []]
    keys.append((ns, "PodGroup", name))  # Kueue names a plain-pod group's Workload after the group
    return keys, a


def _flavor(obj: dict[str, Any]) -> dict[str, str]:
    _, name = _meta(obj)
    labels = (obj.get("spec") or {}).get("nodeLabels") or {}
    if not isinstance(labels, dict):
        raise SpecError(f"ResourceFlavor {name}: spec.nodeLabels", "must be a mapping of node labels")
    return {str(a): str(b) for a, b in labels.items()}


def _cohort(obj: dict[str, Any]) -> dict[str, Any]:
    _, name = _meta(obj)
    spec = obj.get("spec") or {}
    quotas, _ = _groups_quotas(spec, f"Cohort {name}")
    return {"name": name, "parent": str(spec.get("parentName") or ""), "priority": 0, "quotas": quotas}


def _local_queue(obj: dict[str, Any]) -> str:
    ns, name = _meta(obj)
    cq = str((obj.get("spec") or {}).get("clusterQueue") or "")
    if not cq:
        raise SpecError(f"LocalQueue {ns}/{name}: spec.clusterQueue", "is missing")
    return cq


def parse(objects: dict[str, list[dict[str, Any]]], mode: str) -> Kueue:
    """`objects` by kind name (ClusterQueue, LocalQueue, ResourceFlavor, Cohort, Workload).

    Each object is read through `Contain`: a bad one is left out with its problem named, whatever
    it raises, and the rest is read.
    """
    k = Kueue(mode)
    contain = Contain()
    cqs = objects.get("ClusterQueue", [])
    k.present = bool(cqs)
    for obj in objects.get("ResourceFlavor", []):
        labels = contain("ResourceFlavor", obj, partial(_flavor, obj))
        if labels is not None:
            k.flavor_labels[_meta(obj)[1]] = labels
    cohorts: dict[str, dict[str, Any]] = {}
    for obj in objects.get("Cohort", []):
        c = contain("Cohort", obj, partial(_cohort, obj))
        if c is not None:
            cohorts[c["name"]] = c
    specs: list[dict[str, Any]] = []
    for obj in cqs:
        got = contain("ClusterQueue", obj, partial(_cq, obj))
        if got is None:
            continue
        spec, flavors, controlled = got
        k.controller = k.controller or controlled
        k.cq_flavors[spec["name"]] = flavors
        specs.append(spec)
        if spec["parent"] and spec["parent"] not in cohorts:  # a cohort named only by its members
            cohorts[spec["parent"]] = {"name": spec["parent"], "parent": "", "priority": 0, "quotas": {}}
    k.queue_specs = [*cohorts.values(), *specs]
    for obj in objects.get("LocalQueue", []):
        cq = contain("LocalQueue", obj, partial(_local_queue, obj))
        if cq is not None:
            ns, name = _meta(obj)
            k.local_queues[(ns, name)] = cq
    for obj in objects.get("Workload", []):
        got_wl = contain("Workload", obj, partial(_admission, obj))
        if got_wl is not None:
            refs, a = got_wl
            for ref in refs:
                k.admissions[ref] = a
    k.problems = contain.problems
    return k


@dataclass
class Decision:
    """What Kueue says about one group of pods."""

    queue: str | None = None  # the Phalanx queue to use (None: the group's own)
    terms: tuple[NodeSelectorTerm, ...] = ()  # nodes it must go to (the flavors')
    exempt: bool = False  # Kueue admitted it: no Phalanx quota
    problem: str = ""  # why it must wait


def decide(
    k: Kueue,
    namespace: str,
    owners: list[tuple[str, str]],
    label: str,
    own_queue: str,
) -> Decision:
    """`owners`: the (kind, name) its Workload may be owned by (Job, pod group, pod); `label`: its
    `kueue.x-k8s.io/queue-name` (on a pod or its Job); `own_queue`: a Phalanx queue key, if any."""
    if k.mode == "coexist":
        adm = next(
            (
                k.admissions[(namespace, kind, name)]
                for kind, name in owners
                if (namespace, kind, name) in k.admissions
            ),
            None,
        )
        if adm is None:
            if label:
                return Decision(
                    problem=f"waiting for Kueue to make and admit its Workload "
                    f"(LocalQueue {namespace}/{label})"
                )
            return Decision()  # not Kueue's
        if not adm.admitted:
            where = f" (ClusterQueue {adm.cluster_queue})" if adm.cluster_queue else ""
            return Decision(problem=f"waiting for Kueue to admit Workload {adm.workload}{where}")
        return Decision(queue=own_queue or None, terms=k.node_terms(adm.flavors), exempt=True)
    if not label:
        return Decision()
    cq = k.local_queues.get((namespace, label))
    if k.mode == "migrate":
        if cq is None:
            return Decision(problem=f"Kueue LocalQueue {namespace}/{label} does not exist")
        return Decision(queue=cq, terms=k.node_terms(k.cq_flavors.get(cq, ())))
    if cq is not None and not own_queue:
        return Decision(
            problem=f"{namespace}/{label} is a Kueue LocalQueue (ClusterQueue {cq}) and no Kueue "
            "controller runs: start Phalanx with --kueue=migrate to enforce its ClusterQueue, "
            "or run Kueue (--kueue=coexist)"
        )
    return Decision()


def combine(
    own: tuple[NodeSelectorTerm, ...], extra: tuple[NodeSelectorTerm, ...]
) -> tuple[NodeSelectorTerm, ...]:
    """Both constraints: (A1 or A2) and (F1 or F2) as ORed terms (Ai and Fj)."""
    if not extra:
        return own
    if not own:
        return extra
    return tuple(a + f for a in own for f in extra)


def load(
    items: Callable[[str], list[dict[str, Any]]], mode: str
) -> tuple[Kueue | None, dict[str, dict[str, Any]]]:
    """Kueue's objects from a store (`items(kind key)`), in the mode asked for (auto: coexist when a
    Kueue controller runs, else off), and the Jobs by namespace/name; (None, {}) without Kueue."""
    if mode == "off":
        return None, {}
    objs = {kind: items(new.key) or items(old.key) for kind, (new, old) in KUEUE.items()}
    if not any(objs.values()):
        return None, {}
    k = parse(objs, mode)
    if mode == "auto":
        k.mode = "coexist" if k.controller else "off"
    if k.mode == "migrate":
        k.unhonoured = unhonoured(objs["ClusterQueue"])
    return k, {object_key(j): j for j in items(JOBS.key)}
