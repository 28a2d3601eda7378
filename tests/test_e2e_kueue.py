"""Kueue users on a real control plane (Kueue's CRDs installed, no Kueue controller: the test plays it).

Migration: a Kueue-labelled 2-pod Job is placed as a gang under its ClusterQueue's quota, on the
nodes of its flavor, and the next one waits naming the ClusterQueue. Coexistence: a Job whose
Workload Kueue has not admitted is never placed, even unsuspended; once the test writes the
admission, it is placed on the admitted flavor's nodes, and Phalanx's own quota does not count
it a second time. A bad Kueue object is named and never stops the cycle.
"""

from __future__ import annotations

from typing import Any

import pytest

from e2e_kube import JOBS, Kube, running, wait_for
from kube_objects import node, queue
from phalanx.k8s.client.kinds import KUEUE
from phalanx.k8s.view.status import collect

pytestmark = pytest.mark.e2e
V = "kueue.x-k8s.io/v1beta2"


def _setup(kube: Kube, gpus: int = 4) -> None:
    kube.dialects("kueue")
    kube.api.create("nodes", node("h", gpus=8, labels={"pool": "h100"}))
    kube.api.create("nodes", node("a", gpus=8, labels={"pool": "a100"}))
    kube.create(
        {
            "apiVersion": V,
            "kind": "ResourceFlavor",
            "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {"pool": "h100"}},
        }
    )
    flavors = [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]
    spec = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": flavors}],
    }
    kube.create({"apiVersion": V, "kind": "ClusterQueue", "metadata": {"name": "team-cq"}, "spec": spec})
    kube.create(
        {
            "apiVersion": V,
            "kind": "LocalQueue",
            "metadata": {"name": "team-q", "namespace": "default"},
            "spec": {"clusterQueue": "team-cq"},
        }
    )


def _job(name: str, suspend: bool = False) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "busybox",
        "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "1"}},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "labels": {"kueue.x-k8s.io/queue-name": "team-q"}},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "suspend": suspend,
            "template": {
                "spec": {"schedulerName": "phalanx", "restartPolicy": "Never", "containers": [container]}
            },
        },
    }


def _pods_of(kube: Kube, job: str) -> dict[str, dict[str, Any]]:
    return {n: p for n, p in kube.pods().items() if p["metadata"].get("labels", {}).get("job-name") == job}


def _nodes_of(kube: Kube, job: str) -> list[str]:
    return sorted(str(p["spec"].get("nodeName") or "") for p in _pods_of(kube, job).values())


def test_migration_places_a_kueue_job_as_a_gang_under_its_cluster_queue(kube: Kube) -> None:
    _setup(kube)
    with running(kube, profile="phalanx-queues", kueue="migrate"):
        kube.create(_job("train"))
        wait_for(
            "train's 2 pods bound, both on the h100 node",
            lambda: _nodes_of(kube, "train") == ["h", "h"],
            timeout=40,
        )
        kube.create(_job("more"))
        wait_for("more's pods exist", lambda: len(_pods_of(kube, "more")) == 2, timeout=30)

        def told() -> bool:
            return any("team-cq" in msg for p in _pods_of(kube, "more") for _, msg in kube.events(p))

        wait_for("more told it waits on team-cq's quota", told, timeout=30)
        assert _nodes_of(kube, "more") == [
            "",
            "",
        ]  # 4 GPUs of quota, all used by train; 6 free GPUs elsewhere
        st = collect(kube.api, _cfg("migrate"))
        assert any(q["queue"] == "team-cq" and q["deserved_gpu"] == 4 for q in st.queues)


def _cfg(mode: str):  # type: ignore[no-untyped-def]
    from phalanx.k8s.config import AdapterConfig

    return AdapterConfig(profile="phalanx-queues", kueue=mode)


def _workload(kube: Kube, job: dict[str, Any]) -> dict[str, Any]:
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    body = {
        "apiVersion": V,
        "kind": "Workload",
        "metadata": {
            "name": f"job-{job['metadata']['name']}-x1",
            "namespace": "default",
            "ownerReferences": [owner],
        },
        "spec": {
            "queueName": "team-q",
            "podSets": [{"name": "main", "count": 2, "template": job["spec"]["template"]}],
        },
    }
    return kube.create(body)


def test_coexistence_places_only_what_kueue_admitted_on_the_admitted_flavor(kube: Kube) -> None:
    _setup(kube)
    # a Phalanx queue of one GPU for these pods: Kueue's admission must not be checked against it again
    kube.create(queue("default", gpu_quota=1) | {"spec": {"resources": {"gpu": {"quota": 1, "limit": 1}}}})
    with running(kube, profile="phalanx-queues", kueue="coexist"):
        job = kube.create(_job("train", suspend=True))
        wl = _workload(kube, job)
        # a race Kueue should not lose: the Job runs before its Workload is admitted
        kube.api.patch(JOBS, "train", "default", {"spec": {"suspend": False}})
        wait_for("train's pods exist", lambda: len(_pods_of(kube, "train")) == 2, timeout=30)

        def told() -> bool:
            return any(
                "waiting for Kueue to admit Workload" in msg
                for p in _pods_of(kube, "train")
                for _, msg in kube.events(p)
            )

        wait_for("the pods told they wait for Kueue", told, timeout=30)
        assert _nodes_of(kube, "train") == ["", ""]
        admission = {
            "admission": {
                "clusterQueue": "team-cq",
                "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "h100"}, "count": 2}],
            },
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "True",
                    "reason": "QuotaReserved",
                    "message": "",
                    "lastTransitionTime": "2026-11-30T00:00:00Z",
                },
                {
                    "type": "Admitted",
                    "status": "True",
                    "reason": "Admitted",
                    "message": "",
                    "lastTransitionTime": "2026-11-30T00:00:00Z",
                },
            ],
        }
        kube.api.patch(
            KUEUE["Workload"][0], wl["metadata"]["name"], "default", {"status": admission}, "status"
        )
        wait_for(
            "train placed on the admitted flavor's node",
            lambda: _nodes_of(kube, "train") == ["h", "h"],
            timeout=40,
        )


def test_a_bad_kueue_object_is_named_and_the_rest_is_scheduled(kube: Kube) -> None:
    _setup(kube)
    broken = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [
                    {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "lots"}]}
                ],
            }
        ],
    }
    kube.create({"apiVersion": V, "kind": "ClusterQueue", "metadata": {"name": "broken-cq"}, "spec": broken})
    with running(kube, profile="phalanx-queues", kueue="migrate"):
        kube.create(_job("train"))
        wait_for("train bound despite broken-cq", lambda: _nodes_of(kube, "train") == ["h", "h"], timeout=40)
    st = collect(kube.api, _cfg("migrate"))
    assert any(p.startswith("ClusterQueue broken-cq:") and "lots" in p for p in st.problems), st.problems
