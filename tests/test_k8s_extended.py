"""Extended resources served by DRA (KEP-5004), read: which DeviceClass serves a resource name,
the claim kube-scheduler's rules make of a pod's containers, and where a device plugin wins."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dra_kube import device_classes, dgx_slices
from kube_objects import node, pod
from phalanx.core.cycle import run_cycle
from phalanx.core.errors import SpecError
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read import extended
from phalanx.k8s.read.claims import DraObjects
from phalanx.k8s.read.patch import _has_claims
from phalanx.k8s.read.world import build_world
from phalanx.profiles import load_profile

GPU = "nvidia.com/gpu"


def cls(name: str, ext: str = "", created: str = "2026-12-01T00:00:00Z") -> dict[str, Any]:
    spec = {"extendedResourceName": ext} if ext else {}
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def test_a_class_serves_its_name_and_its_implicit_one_newest_then_smaller_name_wins() -> None:
    served = extended.served_names(
        [
            cls("old", GPU, "2026-01-01T00:00:00Z"),
            cls("new-b", GPU, "2026-06-01T00:00:00Z"),
            cls("new-a", GPU, "2026-06-01T00:00:00Z"),
            cls("plain"),
        ]
    )
    assert served[GPU] == "new-a"
    assert served[extended.IMPLICIT + "old"] == "old" and served[extended.IMPLICIT + "plain"] == "plain"
    assert "plain" not in served


def two_containers() -> dict[str, Any]:
    p = pod("p")
    p["spec"]["containers"] = [
        {"name": "a", "resources": {"limits": {GPU: "2", "example.com/fpga": "1"}, "requests": {"cpu": "1"}}},
        {"name": "b", "resources": {"requests": {GPU: "1", "memory": "1Gi"}}},
    ]
    return p


def test_one_request_per_container_and_resource_named_by_its_place_among_the_sorted_names() -> None:
    served = {GPU: "gpu.nvidia.com", "example.com/fpga": "fpga"}
    ask = extended.extended_ask(two_containers(), served, set(), "pod default/p")
    assert ask is not None
    # container a: cpu, example.com/fpga, nvidia.com/gpu; container b: memory, nvidia.com/gpu
    assert [
        (r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"])
        for r in ask.spec["devices"]["requests"]
    ] == [
        ("container-0-request-1", "fpga", 1),
        ("container-0-request-2", "gpu.nvidia.com", 2),
        ("container-1-request-1", "gpu.nvidia.com", 1),
    ]
    assert [m["requestName"] for m in ask.mappings] == [
        "container-0-request-1",
        "container-0-request-2",
        "container-1-request-1",
    ]
    assert ask.resources == {GPU, "example.com/fpga"}


def test_a_resource_a_node_advertises_stays_the_device_plugins() -> None:
    served = {GPU: "gpu.nvidia.com", "example.com/fpga": "fpga"}
    ask = extended.extended_ask(two_containers(), served, {GPU}, "pod default/p")
    assert ask is not None and ask.resources == {"example.com/fpga"}
    assert extended.extended_ask(two_containers(), {}, set(), "pod default/p") is None


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        ({"containers": [{"name": "a", "resources": {"limits": {GPU: "two"}}}]}, f"resources {GPU}"),
        (
            {"initContainers": [{"name": "i", "resources": {"limits": {GPU: "1"}}}], "containers": []},
            f"initContainers[0] resources {GPU}",
        ),
    ],
)
def test_what_cannot_be_asked_that_way_names_the_container_and_resource(patch: dict, where: str) -> None:
    p = pod("p")
    p["spec"].update(patch)
    with pytest.raises(SpecError, match=f"pod default/p: {where}".replace("[", r"\[").replace("]", r"\]")):
        extended.extended_ask(p, {GPU: "gpu.nvidia.com"}, set(), "pod default/p")


def dra_world(pods: list[dict[str, Any]], advertised: bool = False):
    classes = device_classes()
    classes[0]["spec"]["extendedResourceName"] = GPU
    nodes = [node("a", gpus=8 if advertised else 0)]
    dra = DraObjects(classes=classes, slices=dgx_slices("a"))
    return build_world(nodes, pods, [], [], AdapterConfig(), 0.0, dra=dra)


def asking(name: str, gpus: int) -> dict[str, Any]:
    p = pod(name)
    p["spec"]["containers"][0]["resources"]["limits"] = {GPU: str(gpus)}
    return p


def test_a_pod_asking_gpus_on_a_dra_cluster_is_placed_with_a_claim_to_make() -> None:
    w = dra_world([asking("p", 3)])
    key = extended.pending_key("default", "p")
    assert set(w.extended_claims) == {key}
    r = run_cycle(w.snapshot, load_profile("phalanx"), 0.0, np.random.default_rng(0))
    (b,) = r.binds
    (ca,) = b.claims
    assert (
        ca.claim == key
        and len(ca.results) == 3
        and {x.request for x in ca.results} == {"container-0-request-2"}
    )


def test_where_a_node_advertises_the_gpus_no_claim_is_made() -> None:
    w = dra_world([asking("p", 3)], advertised=True)
    assert w.extended_claims == {}


def test_a_pod_asking_more_than_any_node_has_waits_without_a_claim_written() -> None:
    r = run_cycle(
        dra_world([asking("p", 9)]).snapshot, load_profile("phalanx"), 0.0, np.random.default_rng(0)
    )
    assert r.binds == []


def test_the_change_feed_rebuilds_a_world_with_such_a_pod() -> None:
    assert _has_claims(asking("p", 1), frozenset({GPU}))
    assert not _has_claims(asking("p", 1), frozenset())
    assert not _has_claims(pod("p"), frozenset({GPU}))


def test_a_claim_an_earlier_failed_bind_left_is_reused_not_made_again() -> None:
    p = asking("p", 2)
    left = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "p-extended-resources-x1",
            "namespace": "default",
            "annotations": {extended.ANNOTATION: "true"},
            "ownerReferences": [
                {"kind": "Pod", "name": "p", "uid": p["metadata"]["uid"], "controller": True}
            ],
        },
        "spec": {"devices": {"requests": []}},
    }
    other = {
        **left,
        "metadata": {
            **left["metadata"],
            "name": "q-x",
            "ownerReferences": [{"kind": "Pod", "uid": "u", "controller": True}],
        },
    }
    classes = device_classes()
    classes[0]["spec"]["extendedResourceName"] = GPU
    dra = DraObjects(classes=classes, slices=dgx_slices("a"), claims=[other, left])
    w = build_world([node("a", gpus=0)], [p], [], [], AdapterConfig(), 0.0, dra=dra)
    assert w.extended_claims[extended.pending_key("default", "p")].existing == "p-extended-resources-x1"
