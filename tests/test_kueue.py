"""Kueue's objects, field by field, on the setups Kueue's documentation uses to explain them."""

from __future__ import annotations

from typing import Any

import yaml

from kube_objects import node, pod
from phalanx.core.queues import CPU, GPU, MEM
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.kueue import Kueue, decide, parse, unhonoured
from phalanx.k8s.read.queues import build_tree
from phalanx.k8s.read.world import build_world

V = "kueue.x-k8s.io/v1beta2"


def cq(
    name: str, cohort: str = "", flavors: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": [], "flavors": flavors or []}],
    }
    if cohort:
        body["cohortName"] = cohort
    body.update(spec)
    return {"apiVersion": V, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": body}


def flavor(name: str, **resources: Any) -> dict[str, Any]:
    out = []
    for res, v in resources.items():
        r = {"name": res.replace("_", "/").replace("nvidia/com", "nvidia.com")}
        r.update(v if isinstance(v, dict) else {"nominalQuota": v})
        out.append(r)
    return {"name": name, "resources": out}


def objs(**kinds: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {
        k: kinds.get(k, []) for k in ("ClusterQueue", "LocalQueue", "ResourceFlavor", "Cohort", "Workload")
    }


def tree_of(k: Kueue):  # type: ignore[no-untyped-def]
    tree, problems = build_tree([], "default", k.queue_specs)
    assert tree is not None, problems
    return tree


def test_borrowing_limit_and_cohort_as_in_kueues_docs() -> None:
    """Kueue's "BorrowingLimit" example: team-a-cq (9 CPUs, may borrow 1) and team-b-cq (12) share
    cohort team-ab; team-a can reach 10 CPUs, team-b 21."""
    a = cq(
        "team-a-cq",
        "team-ab",
        [flavor("default-flavor", cpu={"nominalQuota": 9, "borrowingLimit": 1}, memory="36Gi")],
    )
    b = cq("team-b-cq", "team-ab", [flavor("default-flavor", cpu=12, memory="48Gi")])
    k = parse(objs(ClusterQueue=[a, b]), "migrate")
    tree = tree_of(k)
    assert tree.queues["team-a-cq"].parent == "team-ab" and tree.queues["team-b-cq"].parent == "team-ab"
    assert tree.deserved["team-a-cq"][CPU] == 9000 and tree.deserved["team-a-cq"][MEM] == 36 * 1024
    assert tree.ceiling("team-a-cq")[CPU] == 10_000  # nominal + borrowingLimit
    assert tree.deserved["team-b-cq"][CPU] == 12_000
    assert k.unhonoured == [] and unhonoured([a, b]) == []


def test_lending_limit_and_no_cohort() -> None:
    """lendingLimit keeps part of the quota home; a ClusterQueue outside any cohort cannot borrow."""
    lender = cq("team-b-cq", "team-ab", [flavor("f", nvidia_com_gpu={"nominalQuota": 8, "lendingLimit": 2})])
    alone = cq("solo-cq", flavors=[flavor("f", nvidia_com_gpu=4)])
    tree = tree_of(parse(objs(ClusterQueue=[lender, alone]), "migrate"))
    assert tree.deserved["team-b-cq"][GPU] == 8000 and tree.lend["team-b-cq"][GPU] == 2000
    assert tree.ceiling("solo-cq")[GPU] == 4000  # its limit is its quota


def test_flavors_sum_per_resource_and_what_is_not_honoured_is_listed() -> None:
    """Kueue's two-flavor example shape (spot, on-demand), with GPUs: quotas add up per resource."""
    two = cq(
        "cluster-queue",
        flavors=[flavor("spot", cpu=9, nvidia_com_gpu=50), flavor("on-demand", cpu=18, nvidia_com_gpu=100)],
        preemption={"withinClusterQueue": "LowerOrNewerEqualPriority"},
        stopPolicy="Hold",
    )
    k = parse(objs(ClusterQueue=[two]), "migrate")
    tree = tree_of(k)
    assert tree.deserved["cluster-queue"][GPU] == 150_000 and tree.deserved["cluster-queue"][CPU] == 27_000
    assert k.cq_flavors["cluster-queue"] == ("spot", "on-demand")
    (line,) = unhonoured([two])
    assert "per-flavor quotas" in line and "withinClusterQueue=LowerOrNewerEqualPriority" in line
    assert "stopPolicy" in line


def test_hierarchical_cohorts_nest_and_fair_sharing_weight_is_the_over_quota_weight() -> None:
    org = {"apiVersion": V, "kind": "Cohort", "metadata": {"name": "org"}, "spec": {}}
    research = {
        "apiVersion": V,
        "kind": "Cohort",
        "metadata": {"name": "research"},
        "spec": {"parentName": "org"},
    }
    q = cq("vision-cq", "research", [flavor("f", nvidia_com_gpu=16)], fairSharing={"weight": "2"})
    tree = tree_of(parse(objs(ClusterQueue=[q], Cohort=[org, research]), "migrate"))
    assert tree.ancestors("vision-cq")[:3] == ["vision-cq", "research", "org"]
    assert tree.queues["vision-cq"].quotas["gpu"].over_quota_weight == 2.0


def test_bad_objects_are_named_and_the_rest_is_read() -> None:
    bad = cq("broken-cq", flavors=[flavor("f", nvidia_com_gpu="lots")])
    good = cq("good-cq", flavors=[flavor("f", nvidia_com_gpu=4)])
    lq = {"apiVersion": V, "kind": "LocalQueue", "metadata": {"name": "q", "namespace": "t"}, "spec": {}}
    rf = {
        "apiVersion": V,
        "kind": "ResourceFlavor",
        "metadata": {"name": "odd"},
        "spec": {"nodeLabels": ["x"]},
    }
    k = parse(objs(ClusterQueue=[bad, good], LocalQueue=[lq], ResourceFlavor=[rf]), "migrate")
    assert (
        "nominalQuota" in k.problems["ClusterQueue broken-cq"]
        and "lots" in k.problems["ClusterQueue broken-cq"]
    )
    assert "spec.clusterQueue" in k.problems["LocalQueue t/q"]
    assert "nodeLabels" in k.problems["ResourceFlavor odd"]
    assert "good-cq" in tree_of(k).queues


def _setup(mode: str, admitted: bool | None = None) -> Kueue:
    rf = {
        "apiVersion": V,
        "kind": "ResourceFlavor",
        "metadata": {"name": "h100"},
        "spec": {"nodeLabels": {"pool": "h100"}},
    }
    q = cq("team-cq", flavors=[flavor("h100", nvidia_com_gpu=4)])
    lq = {
        "apiVersion": V,
        "kind": "LocalQueue",
        "metadata": {"name": "team-q", "namespace": "default"},
        "spec": {"clusterQueue": "team-cq"},
    }
    wls = []
    if admitted is not None:
        status: dict[str, Any] = {"conditions": [{"type": "QuotaReserved", "status": "False"}]}
        if admitted:
            status = {
                "admission": {
                    "clusterQueue": "team-cq",
                    "podSetAssignments": [
                        {"name": "main", "flavors": {"nvidia.com/gpu": "h100"}, "count": 2}
                    ],
                },
                "conditions": [
                    {"type": "QuotaReserved", "status": "True"},
                    {"type": "Admitted", "status": "True"},
                ],
            }
        wls.append(
            {
                "apiVersion": V,
                "kind": "Workload",
                "metadata": {
                    "name": "job-train-1a2b3",
                    "namespace": "default",
                    "ownerReferences": [{"kind": "Job", "name": "train", "uid": "u"}],
                },
                "spec": {"queueName": "team-q"},
                "status": status,
            }
        )
    return parse(objs(ClusterQueue=[q], LocalQueue=[lq], ResourceFlavor=[rf], Workload=wls), mode)


def test_decisions_per_mode() -> None:
    owners = [("Job", "train")]
    mig = decide(_setup("migrate"), "default", owners, "team-q", "")
    assert mig.queue == "team-cq" and not mig.exempt and not mig.problem
    assert [[(r.key, r.values) for r in t] for t in mig.terms] == [[("pool", ("h100",))]]
    assert (
        "LocalQueue default/nope does not exist"
        in decide(_setup("migrate"), "default", owners, "nope", "").problem
    )
    wait = decide(_setup("coexist", admitted=False), "default", owners, "team-q", "")
    assert "waiting for Kueue to admit Workload default/job-train-1a2b3" in wait.problem
    go = decide(_setup("coexist", admitted=True), "default", owners, "team-q", "")
    assert go.exempt and not go.problem and go.queue is None and go.terms
    race = decide(_setup("coexist"), "default", owners, "team-q", "")
    assert "waiting for Kueue to make and admit its Workload" in race.problem
    off = decide(_setup("off"), "default", owners, "team-q", "")
    assert "--kueue=migrate" in off.problem


def test_world_places_under_the_cluster_queue_on_its_flavors_nodes() -> None:
    """Migration through the adapter: the Job's pods join team-cq and may use only pool=h100 nodes."""
    k = _setup("migrate")
    nodes = [node("h", gpus=8, labels={"pool": "h100"}), node("a", gpus=8, labels={"pool": "a100"})]
    pods = [pod(f"train-{i}", gpus=2, owner=("Job", "train")) for i in range(2)]
    job = {
        "metadata": {
            "name": "train",
            "namespace": "default",
            "labels": {"kueue.x-k8s.io/queue-name": "team-q"},
        },
        "spec": {"parallelism": 2, "completions": 2},
    }
    w = build_world(
        nodes, pods, [], [], AdapterConfig(kueue="migrate"), 0.0, kueue=k, jobs={"default/train": job}
    )
    (entry,) = w.snapshot.workloads.values()
    assert entry.workload.queue == "team-cq" and entry.workload.gang_size == 2
    assert w.tree is not None and w.tree.deserved["team-cq"][GPU] == 4000
    req = entry.workload.podsets[0].request
    assert [[(r.key, r.values) for r in t] for t in req.node_affinity] == [[("pool", ("h100",))]]


def test_a_pod_whose_job_the_watch_has_not_delivered_waits_for_it() -> None:
    """Seen in the full e2e suite: a Job's first pod arrived before the Job and was placed alone,
    outside its gang and its LocalQueue's flavors. Within the creation grace it now waits."""
    k = _setup("migrate")
    nodes = [node("h", gpus=8, labels={"pool": "h100"}), node("a", gpus=8, labels={"pool": "a100"})]
    pods = [pod("more-0", gpus=2, owner=("Job", "more"))]
    cfg = AdapterConfig(kueue="migrate")
    created = pods[0].get("metadata", {}).get("creationTimestamp")
    from phalanx.k8s.read.pods import timestamp

    now = timestamp(created) + 1.0 if created else cfg.gang_creation_grace_s / 2
    w = build_world(nodes, pods, [], [], cfg, now, kueue=k, jobs={})
    assert not w.snapshot.workloads
    assert "not seen yet" in " ".join(next(iter(w.blocked.values())))
    # Jobs not watched at all (None): nothing to wait for, as before
    w = build_world(nodes, pods, [], [], cfg, now, kueue=k, jobs=None)
    assert len(w.snapshot.workloads) == 1


def test_real_kueue_doc_yaml_reads() -> None:
    """The single-ClusterQueue setup as Kueue's quick start writes it (v1beta2, no GPUs)."""
    docs = list(
        yaml.safe_load_all(
            """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default-flavor}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: cluster-queue}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: 9}
      - {name: memory, nominalQuota: 36Gi}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {namespace: default, name: user-queue}
spec: {clusterQueue: cluster-queue}
"""
        )
    )
    by: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        by.setdefault(d["kind"], []).append(d)
    k = parse(objs(**by), "migrate")
    assert k.local_queues == {("default", "user-queue"): "cluster-queue"} and not k.problems
    tree = tree_of(k)
    assert tree.deserved["cluster-queue"][CPU] == 9000 and tree.ceiling("cluster-queue")[CPU] == 9000
    assert k.node_terms(("default-flavor",)) == ()  # a flavor without node labels: every node


def test_v1beta1_cohort_field_is_read_too() -> None:
    """Where only v1beta1 is served a ClusterQueue names its cohort in `spec.cohort`."""
    old = cq("team-a-cq", flavors=[flavor("f", nvidia_com_gpu=2)]) | {"apiVersion": "kueue.x-k8s.io/v1beta1"}
    old["spec"]["cohort"] = "team-ab"
    tree = tree_of(parse(objs(ClusterQueue=[old]), "migrate"))
    assert tree.queues["team-a-cq"].parent == "team-ab"
