"""Extended resources served by DRA (KEP-5004; `DRAExtendedResource` is beta and on in 1.36), on a
real API server beside kube-scheduler: a pod asking `nvidia.com/gpu` on nodes whose GPUs only a
DRA driver publishes gets the claim kube-scheduler would make for it, allocated and named in its
status, before its bind. kube-scheduler places its own pod on the same nodes: the two claims are
compared field by field (kube-scheduler is the oracle of their shape), and the devices it
allocated are not given twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_kube import device_classes, dgx_slices, gpu_device, slice_
from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod
from phalanx.k8s.client.kinds import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES
from phalanx.k8s.lab.localcluster import ControlPlane, Unavailable

pytestmark = pytest.mark.e2e
GPU = "nvidia.com/gpu"
ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    try:
        cp = ControlPlane(controller_manager=False).start()
    except Unavailable as e:
        pytest.skip(f"no Kubernetes control plane: {e}")
    cp.start_scheduler()
    yield cp
    cp.stop()


@pytest.fixture
def kube(plane: ControlPlane) -> Iterator[Kube]:
    k = Kube(plane)
    k.cleanup()
    k.delete_all((RESOURCE_CLAIMS, RESOURCE_SLICES, DEVICE_CLASSES))
    for c in device_classes():
        if c["metadata"]["name"] == "gpu.nvidia.com":
            c["spec"]["extendedResourceName"] = GPU
        k.create(c)
    yield k
    k.close()


def bare(kube: Kube, name: str, gpus: int = 8) -> None:
    """A node whose GPUs only DRA publishes: no nvidia.com/gpu in its allocatable."""
    kube.api.create("nodes", node(name, gpus=0, labels={"topology.phalanx.io/rack": "r0"}))
    if gpus == 8:
        kube.create(dgx_slices(name)[0])
    else:
        kube.create(
            slice_(f"{name}-gpu", "gpu.nvidia.com", name, [gpu_device(k, 0, name) for k in range(gpus)])
        )


def asking(name: str, gpus: int, scheduler: str = "phalanx", resource: str = GPU) -> dict[str, Any]:
    p = pod(name, scheduler=scheduler)
    p["spec"]["containers"][0]["resources"]["limits"] = {resource: str(gpus)}  # requests default to it
    return p


def claim_of(kube: Kube, pod_name: str) -> dict[str, Any]:
    status = (kube.pods()[pod_name].get("status") or {}).get("extendedResourceClaimStatus") or {}
    name = status.get("resourceClaimName")
    return (kube.get(RESOURCE_CLAIMS, name, "default") or {}) if name else {}


def shape(kube: Kube, pod_name: str) -> dict[str, Any]:
    """What kube-scheduler and Phalanx must write alike for a pod (names and uids aside)."""
    p = kube.pods()[pod_name]
    c = claim_of(kube, pod_name)
    meta, status = c["metadata"], c.get("status") or {}
    (owner,) = meta["ownerReferences"]
    alloc = status["allocation"]
    (term,) = alloc["nodeSelector"]["nodeSelectorTerms"]
    return {
        "generateName": meta["generateName"].removeprefix(pod_name),
        "annotations": meta.get("annotations"),
        "finalizers": meta.get("finalizers"),
        "owner": {k: v for k, v in owner.items() if k != "uid"} | {"name": owner["name"] == pod_name},
        "owner is the pod": owner["uid"] == p["metadata"]["uid"],
        "requests": c["spec"]["devices"]["requests"],
        "devices": sorted((r["request"], r["driver"], r["pool"]) for r in alloc["devices"]["results"]),
        "on its node": term
        == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [p["spec"]["nodeName"]]}]},
        "reservedFor": [
            {k: v for k, v in r.items() if k != "uid"}
            | {"name": r["name"] == pod_name, "uid": r["uid"] == p["metadata"]["uid"]}
            for r in status["reservedFor"]
        ],
        "mappings": p["status"]["extendedResourceClaimStatus"]["requestMappings"],
    }


def devices_of(kube: Kube, pod_name: str) -> set[str]:
    return {r["device"] for r in claim_of(kube, pod_name)["status"]["allocation"]["devices"]["results"]}


def test_a_pod_asking_nvidia_gpu_gets_the_claim_kube_scheduler_would_make(kube: Kube) -> None:
    bare(kube, "a")
    kube.create(asking("theirs", 3, scheduler="default-scheduler"))
    wait_for("kube-scheduler bound its pod", lambda: kube.node_of("theirs") == "a", timeout=30)
    kube.create(asking("ours", 3))
    with running(kube):
        wait_for("ours bound", lambda: kube.node_of("ours") == "a", timeout=30)
    theirs, ours = shape(kube, "theirs"), shape(kube, "ours")
    assert ours == theirs, f"\nours:   {ours}\ntheirs: {theirs}"
    assert ours["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 3,
    }
    assert len(ours["devices"]) == 3 and ours["on its node"] and ours["owner is the pod"]
    assert not devices_of(kube, "ours") & devices_of(kube, "theirs")  # kube-scheduler's 3 are held


def test_what_does_not_fit_makes_no_claim_and_the_implicit_name_is_served(kube: Kube) -> None:
    bare(kube, "a", gpus=2)
    kube.create(asking("big", 3))
    kube.create(asking("small", 2, resource="deviceclass.resource.kubernetes.io/gpu.nvidia.com"))
    with running(kube):
        wait_for("small bound", lambda: kube.node_of("small") == "a", timeout=30)
        time.sleep(1.0)
        assert not kube.node_of("big")
    assert len(devices_of(kube, "small")) == 2
    made = [c["metadata"]["name"] for c in kube.api.list(RESOURCE_CLAIMS)[0]]
    assert made == [claim_of(kube, "small")["metadata"]["name"]], made  # none left for "big"
    assert (kube.pods()["small"]["status"]["extendedResourceClaimStatus"]["requestMappings"]) == [
        {
            "containerName": "main",
            "resourceName": "deviceclass.resource.kubernetes.io/gpu.nvidia.com",
            "requestName": "container-0-request-1",  # its place among cpu, it, memory
        }
    ]
