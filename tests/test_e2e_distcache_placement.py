"""Placement by the distributed dataset cache, through the Kubernetes driver on a real API server.

Nodes are plain Node objects (no kubelet); a Dataset with `spec.cache: distributed` gets the status
`phalanx distcache` would write (set here); the pods carry the hostPath volume the webhook gives a pod
reading a distributed Dataset (`phalanx-distcache`). The scheduler reads which nodes may run such
a pod from the label `phalanx.io/distcache=true`, and where the chunks are from the Dataset's
`status.distributed.servers`, mapped to nodes by their addresses.
"""

from __future__ import annotations

from typing import Any

import pytest

from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod, pod_group
from phalanx.k8s import keys
from phalanx.k8s.client.kinds import DATASETS

pytestmark = pytest.mark.e2e
CACHE = {keys.DISTCACHE_NODE: "true"}


def cache_node(name: str, ip: str, rack: str = "r1", gpus: int = 8, cache: bool = True) -> dict[str, Any]:
    labels = {"topology.phalanx.io/rack": rack, "topology.phalanx.io/spine": "s1"} | (CACHE if cache else {})
    obj = node(name, gpus=gpus, labels=labels)
    obj["status"]["addresses"] = [{"type": "InternalIP", "address": ip}]
    return obj


def reader(name: str, gpus: int, **kw: Any) -> dict[str, Any]:
    """A pod reading Dataset `laion` as the webhook leaves it: the dataset's folder in the mount."""
    p = pod(name, gpus=gpus, **({"annotations": {keys.DATASET: "laion"}} | kw))
    p["spec"]["volumes"] = [
        {
            "name": keys.DISTCACHE_VOLUME,
            "hostPath": {"path": "/var/lib/phalanx/distcache/fs/default/laion", "type": "Directory"},
        }
    ]
    return p


def dataset(kube: Kube, status: dict[str, Any]) -> None:
    kube.apply(
        {
            "apiVersion": "scheduling.phalanx.io/v1alpha1",
            "kind": "Dataset",
            "metadata": {"name": "laion", "namespace": "default"},
            "spec": {"source": "s3://datasets/laion", "cache": "distributed", "readiness": "readThrough"},
        }
    )
    kube.api.patch(DATASETS, "laion", "default", {"status": {"distributed": status}}, sub="status")


def told(kube: Kube, name: str, text: str, reason: str = "FailedScheduling") -> str:
    return str(
        wait_for(
            f"{name} told {text!r}",
            lambda: next((m for r, m in kube.events(name) if r == reason and text in m), ""),
            timeout=20,
        )
    )


def test_only_on_cache_nodes_and_waits_with_the_reason(kube: Kube) -> None:
    # packing alone prefers the fuller node "plain" (2 GPUs), which runs no mount
    kube.api.create("nodes", cache_node("plain", "10.0.0.1", gpus=2, cache=False))
    kube.api.create("nodes", cache_node("cache-1", "10.0.0.2", gpus=4))
    dataset(kube, {"state": "ready", "servers": {"10.0.0.2:8080": 1 << 30}})
    kube.create(reader("first", gpus=4))
    with running(kube):
        wait_for("first bound", lambda: kube.node_of("first") != "", timeout=20)
        assert kube.node_of("first") == "cache-1"
        kube.create(reader("second", gpus=1))
        msg = told(kube, "second", "is cached distributed")
        assert kube.node_of("second") == ""
    assert "gpu: insufficient free GPU (1 GPU) on 1 node" in msg, msg  # the node with the mount
    assert (
        "dataset-mount: dataset default/laion is cached distributed; no room on the 1 node(s) that run its "
        "mount, and no mount on 1 node" in msg
    ), msg


def test_gang_goes_to_the_rack_holding_the_chunks(kube: Kube) -> None:
    # rack r1 sorts first and is as good by capacity: the chunks are in r2
    for k, (name, rack) in enumerate((("a1", "r1"), ("a2", "r1"), ("b1", "r2"), ("b2", "r2"))):
        kube.api.create("nodes", cache_node(name, f"10.0.1.{k + 1}", rack=rack))
    dataset(kube, {"state": "ready", "servers": {"10.0.1.3:8080": 3 << 30, "10.0.1.4:8080": 2 << 30}})
    kube.create(pod_group("train", 2))
    for k in range(2):
        kube.create(
            reader(f"train-{k}", gpus=8, annotations={keys.DATASET: "laion", keys.POD_GROUP: "train"})
        )
    with running(kube, "phalanx-queues"):
        wait_for("gang bound", lambda: all(kube.node_of(f"train-{k}") for k in range(2)), timeout=20)
    assert {kube.node_of(f"train-{k}") for k in range(2)} == {"b1", "b2"}


def test_failed_dataset_holds_its_pod_with_the_datasets_reason(kube: Kube) -> None:
    kube.api.create("nodes", cache_node("cache-1", "10.0.2.1"))
    dataset(kube, {"state": "failed", "reason": "no objects under s3://datasets/laion"})
    kube.create(reader("lone", gpus=1))
    with running(kube):
        # held by the driver before the core (as a gang with a problem is): an Unschedulable Event
        msg = told(kube, "lone", "caching it failed", reason="Unschedulable")
        assert kube.node_of("lone") == ""
        # the Dataset recovers: the pod is placed
        kube.api.patch(
            DATASETS, "laion", "default", {"status": {"distributed": {"state": "ready"}}}, sub="status"
        )
        wait_for("lone bound", lambda: kube.node_of("lone") != "", timeout=20)
    assert "dataset default/laion is cached distributed and caching it failed: no objects under" in msg, msg
