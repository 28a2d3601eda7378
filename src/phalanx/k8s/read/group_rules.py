"""What a group's Job, Kueue and gang plan say of it, before it becomes a workload.

A Job's pods are one gang of its parallelism, or as its `spec.scheduling` says (1.37); Kueue
decides a group's queue, admission and the nodes of its flavors; a gang whose plan was written
before a restart cut its binds short carries the plan's assignment on the members not bound yet.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from phalanx.core.errors import SpecError
from phalanx.k8s import keys
from phalanx.k8s.read import kueue as kueue_keys
from phalanx.k8s.read import native
from phalanx.k8s.read.contain import Contain
from phalanx.k8s.read.devices import decode_plan
from phalanx.k8s.read.groups import Group, wait_for_pods
from phalanx.k8s.read.kueue import Kueue
from phalanx.k8s.read.pods import timestamp


def job_parallelism(
    g: Group,
    jobs: dict[str, dict[str, Any]] | None,
    grace_since: float,
    levels: tuple[tuple[str, str], ...] = (),
) -> bool:
    """A Job's pods are one gang of its parallelism (what is left of its completions), not of the pods
    that happen to exist yet: the Job controller may still be making them. A pod whose Job the watch
    has not delivered yet waits for it (within the creation grace, after `grace_since`), or it would
    be placed alone, outside the Job's gang and its LocalQueue. `jobs` None: Jobs are not watched.
    Returns whether the answer depended on the clock (the grace)."""
    first = g.pods[0]
    if (
        g.pod_group is not None
        or not first.owner
        or first.owner[0] != "Job"
        or g.name != f"{g.namespace}/Job/{first.owner[1]}"
    ):
        return False
    if keys.MIN_AVAILABLE in first.annotations or keys.KUEUE_GROUP_TOTAL in first.annotations:
        return False
    job = (jobs or {}).get(f"{g.namespace}/{first.owner[1]}")
    if job is None:
        if jobs is not None and max(p.created for p in g.pods) > grace_since:
            g.waiting = f"Job {g.namespace}/{first.owner[1]}: not seen yet, so neither is its parallelism"
        return jobs is not None
    spec, status = job.get("spec") or {}, job.get("status") or {}
    try:
        need = int(spec.get("parallelism", 1))
        if spec.get("completions") is not None:
            need = min(need, int(spec["completions"]) - int(status.get("succeeded") or 0))
    except (TypeError, ValueError):
        return False
    if spec.get("scheduling") is not None:
        job_policy(g, job, need, levels)
        return False
    if need > len(g.pods):
        why = f"{len(g.pods)} of its {need} parallel pods exist"
        wait_for_pods(g, f"Job {g.namespace}/{first.owner[1]}", need - len(g.pods), why)
    g.min_available = max(1, min(need, len(g.pods)))
    g.minimum_said = f"Job parallelism {need}"
    return False


def job_policy(g: Group, job: dict[str, Any], need: int, levels: tuple[tuple[str, str], ...]) -> None:
    """A Job's `spec.scheduling` (batch/v1, 1.37 alpha, gate WorkloadWithJob): the PodGroup policy
    its pods would get. With the gate on in kube-controller-manager the Job controller makes that
    PodGroup and links the pods to it, and the PodGroup is read instead (the pods then are not the
    Job's group); this reads it where the pods are not linked. `gang: {}` without `minCount` is a
    gang of the parallelism (as the controller defaults it), `basic: {}` or no policy places the
    pods one by one; `schedulingConstraints` and `disruptionMode` as on a PodGroup. `need`: the
    parallelism still to run."""
    meta = job.get("metadata") or {}
    name = f"Job {meta.get('namespace', g.namespace)}/{meta.get('name', '')}"
    sched = (job.get("spec") or {}).get("scheduling")
    if not isinstance(sched, dict):
        g.problems.append(f"{name}: spec.scheduling: must be an object, got {sched!r}")
        return
    if sched.get("resourceClaims"):
        g.problems.append(
            f"{name}: spec.scheduling.resourceClaims: claims the Job's pods share are allocated once the "
            "Job controller has made its PodGroup (gate WorkloadWithJob in kube-controller-manager); "
            "they are not read from the Job"
        )
        return
    body = dict(sched)
    policy = body.get("schedulingPolicy") or {"basic": {}}
    if isinstance(policy, dict) and isinstance(policy.get("gang"), dict):
        policy = {"gang": {"minCount": need, **policy["gang"]}}
    body["schedulingPolicy"] = policy
    try:  # read as the PodGroup the controller would make; its fields sit under spec.scheduling
        spec = native.read_spec(
            {"apiVersion": f"{native.GROUP}/v1beta1", "metadata": meta, "spec": body}, levels, "Job"
        )
    except SpecError as e:
        g.problems.append(f"{e.where.replace(': spec.', ': spec.scheduling.', 1)}: {e.message}")
        return
    g.topology, g.preempt_whole, g.preempts = spec.topology, spec.preempt_whole, spec.preempts
    if not spec.gang:
        g.min_available, g.minimum_said = 1, ""
        return
    want = min(spec.min_count, need)
    g.minimum_said = f"Job spec.scheduling minCount {spec.min_count}"
    if want > len(g.pods):
        wait_for_pods(g, name, want - len(g.pods), f"{len(g.pods)} of the {want} pods its gang needs exist")
    g.min_available = max(1, min(want, len(g.pods)))


def created(obj: dict[str, Any] | None) -> float:
    return timestamp(((obj or {}).get("metadata") or {}).get("creationTimestamp"))


def apply_kueue(g: Group, k: Kueue, jobs: dict[str, dict[str, Any]]) -> None:
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


def apply_plans(g: Group, stale: list[str], contain: Contain) -> None:
    """Members of a gang whose plan names them, not bound yet: they carry the plan's assignment."""
    by_key = {p.key: p for p in g.pods}
    for holder in g.pods:
        text = holder.annotations.get(keys.GANG_PLAN)
        if not text:
            continue
        where = f"pod {holder.key}"
        plan = contain("Pod", {"metadata": holder.meta}, partial(decode_plan, text, where))
        if plan is None:
            stale.append(holder.key)
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
