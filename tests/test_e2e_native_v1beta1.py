"""The Workload API as 1.37 shapes it, on a real (v1.36.2) API server.

There is no 1.37 control plane here. A 1.36 server cannot serve `scheduling.k8s.io/v1beta1` as a
CRD beside its own group (its `scheduling.k8s.io/v1` PriorityClasses own every path under the
group: the CRD is Established and listed in discovery, yet every request answers 404, tried
2026-12-05). With that built-in version off (`--runtime-config=scheduling.k8s.io/v1=false`, the
Priority admission plugin off with it) the server routes CRDs of the group: PodGroup and Workload
in v1beta1 (stored) and v1alpha3, CompositePodGroup in v1alpha3, untyped, as 1.37 names them.
`GenericWorkload` stays on so that pods keep `spec.schedulingGroup`; its two admission plugins
are off, and v1alpha2 is served by the same CRDs because the server's own v1alpha2 informers must
list something before `/readyz` passes (they log that a 1.37-shaped object does not decode into
v1alpha2; nothing reads them). What this checks is Phalanx against 1.37's shapes, conditions and
discovery on a real server; what a 1.37 server validates or defaults is not checked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod
from phalanx.k8s.client.kinds import Kind
from phalanx.k8s.lab.localcluster import ControlPlane, Unavailable

pytestmark = pytest.mark.e2e

GROUP = "scheduling.k8s.io"
PODGROUPS = Kind(GROUP, "v1beta1", "podgroups", True, "PodGroup")
COMPOSITES = Kind(GROUP, "v1alpha3", "compositepodgroups", True, "CompositePodGroup")
RACK = "topology.phalanx.io/rack"


def crd(plural: str, kind: str, versions: tuple[str, ...]) -> dict[str, Any]:
    """An untyped CRD of a 1.37 kind (the first version stored, the others served as is)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            # a *.k8s.io group needs it; the KEP that made the API
            "annotations": {
                "api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/4671"
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": v,
                    "served": True,
                    "storage": v == versions[0],
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
                for v in versions
            ],
        },
    }


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    try:
        cp = ControlPlane(
            controller_manager=False,  # its workload controllers would want the built-in v1alpha2
            apiserver_args=(
                "--feature-gates=GenericWorkload=true",
                f"--runtime-config={GROUP}/v1=false",
                "--disable-admission-plugins=TaintNodesByCondition,ServiceAccount,Priority,"
                "PodGroupWorkloadExists,PodGroupProtection",
            ),
            early_crds=(
                crd("podgroups", "PodGroup", ("v1beta1", "v1alpha3", "v1alpha2")),
                crd("workloads", "Workload", ("v1beta1", "v1alpha3", "v1alpha2")),
                crd("compositepodgroups", "CompositePodGroup", ("v1alpha3",)),
            ),
        ).start()
    except Unavailable as e:
        pytest.skip(f"no Kubernetes control plane: {e}")
    yield cp
    cp.stop()


@pytest.fixture
def kube(plane: ControlPlane) -> Iterator[Kube]:
    k = Kube(plane)
    k.delete_all(
        (PODGROUPS, COMPOSITES, Kind("", "v1", "pods", True, "Pod"), Kind("", "v1", "nodes", False, "Node"))
    )
    wait_for("a clean cluster", lambda: not k.api.list("pods")[0] and not k.api.list(PODGROUPS)[0])
    yield k
    k.close()


def group(kube: Kube, name: str, min_count: int, parent: str = "", **spec: Any) -> None:
    body: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}, **spec}
    if parent:
        body["parentCompositePodGroupName"] = parent
        body["workloadRef"] = {"workloadName": parent, "templateName": name}
    obj = {"apiVersion": f"{GROUP}/v1beta1", "kind": "PodGroup", "metadata": {"name": name}, "spec": body}
    kube.api.create(PODGROUPS, obj, "default")


def composite(kube: Kube, name: str, min_groups: int) -> None:
    obj = {
        "apiVersion": f"{GROUP}/v1alpha3",
        "kind": "CompositePodGroup",
        "metadata": {"name": name},
        "spec": {
            "schedulingPolicy": {"gang": {"minGroupCount": min_groups}},
            "workloadRef": {"workloadName": name},
        },
    }
    kube.api.create(COMPOSITES, obj, "default")


def member(kube: Kube, name: str, pg: str, gpus: int = 4, priority: int = 0) -> None:
    p = pod(name, gpus=gpus, priority=priority)
    p["spec"]["schedulingGroup"] = {"podGroupName": pg}
    kube.create(p)


def condition(kube: Kube, kind: Kind, name: str, ctype: str) -> dict[str, Any]:
    obj = kube.get(kind, name, "default") or {}
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def status_is(kube: Kube, kind: Kind, name: str, ctype: str, want: str) -> dict[str, Any] | bool:
    c = condition(kube, kind, name, ctype)
    return c.get("status") == want and c


def bound(kube: Kube, names: list[str]) -> list[str]:
    return [n for n in names if kube.node_of(n)]


def nodes(kube: Kube, racks: list[str], first: int = 0) -> None:
    for i, r in enumerate(racks, first):
        kube.api.create("nodes", node(f"n{i}", gpus=4, labels={RACK: r}))


def test_the_server_routes_the_1_37_versions_and_keeps_the_pod_link(kube: Kube) -> None:
    served = {k.key for k in (PODGROUPS, COMPOSITES)} & kube.api.served((PODGROUPS, COMPOSITES))
    assert served == {PODGROUPS.key, COMPOSITES.key}
    group(kube, "g", 1)
    member(kube, "g-0", "g")
    assert (kube.pods()["g-0"]["spec"].get("schedulingGroup") or {}).get("podGroupName") == "g"


def test_a_1_37_gang_with_disruption_mode_all_binds_whole_or_not_at_all(kube: Kube) -> None:
    nodes(kube, ["r0", "r0"])
    group(kube, "big", 3, disruptionMode={"all": {}})
    names = [f"big-{i}" for i in range(3)]
    for n in names:
        member(kube, n, "big")
    with running(kube):
        c = wait_for(
            "PodGroupInitiallyScheduled False",
            lambda: status_is(kube, PODGROUPS, "big", "PodGroupInitiallyScheduled", "False"),
        )
        assert isinstance(c, dict) and c["reason"] == "Unschedulable" and "2 of 3 placed" in c["message"], c
        time.sleep(1.0)
        assert bound(kube, names) == []
        assert not condition(kube, PODGROUPS, "big", "PodGroupScheduled")  # 1.36's name, not on a v1beta1
        nodes(kube, ["r1"], first=2)
        wait_for("all bound", lambda: bound(kube, names) == names)
        c = wait_for(
            "PodGroupInitiallyScheduled True",
            lambda: status_is(kube, PODGROUPS, "big", "PodGroupInitiallyScheduled", "True"),
        )


def test_a_composite_of_two_groups_each_in_one_rack_is_placed_whole_or_not_at_all(kube: Kube) -> None:
    nodes(kube, ["r0", "r0", "r1"])  # group a fits r0; group b has one node of r1
    composite(kube, "train", 2)
    one_rack = {"topology": [{"key": RACK}]}
    for g in ("train-a", "train-b"):
        group(kube, g, 2, parent="train", schedulingConstraints=one_rack)
    names = {g: [f"{g}-0", f"{g}-1"] for g in ("train-a", "train-b")}
    for g, members in names.items():
        for n in members:
            member(kube, n, g)
    everyone = names["train-a"] + names["train-b"]
    with running(kube):
        wait_for(
            "the tree unschedulable",
            lambda: status_is(kube, COMPOSITES, "train", "CompositePodGroupInitiallyScheduled", "False"),
        )
        for g in names:
            c = wait_for(
                f"{g} unschedulable",
                lambda g=g: status_is(kube, PODGROUPS, g, "PodGroupInitiallyScheduled", "False"),
            )
            assert isinstance(c, dict) and c["reason"] == "Unschedulable", c
        time.sleep(1.0)
        assert bound(kube, everyone) == []  # group a alone would fit: not placed without b
        nodes(kube, ["r1"], first=3)
        wait_for("all bound", lambda: bound(kube, everyone) == everyone)
        racks = {"n0": "r0", "n1": "r0", "n2": "r1", "n3": "r1"}
        for members in names.values():
            assert len({racks[kube.node_of(n)] for n in members}) == 1, members
        wait_for(
            "every level scheduled",
            lambda: (
                status_is(kube, COMPOSITES, "train", "CompositePodGroupInitiallyScheduled", "True")
                and all(status_is(kube, PODGROUPS, g, "PodGroupInitiallyScheduled", "True") for g in names)
            ),
        )


def test_disruption_mode_all_is_preempted_whole_and_says_so(kube: Kube) -> None:
    nodes(kube, ["r0"])
    group(kube, "low", 1, disruptionMode={"all": {}}, priority=0)
    for n in ("low-0", "low-1"):
        member(kube, n, "low", gpus=2)
    with running(kube, profile="phalanx-queues"):
        wait_for("low bound", lambda: bound(kube, ["low-0", "low-1"]) == ["low-0", "low-1"])
        for n in ("low-0", "low-1"):
            kube.run_pod(n)
        group(kube, "high", 1, priority=1000)
        member(kube, "high-0", "high", gpus=2, priority=1000)
        gone: set[str] = set()

        wait_for("the preemptor bound", lambda: kube.terminate(gone) or kube.node_of("high-0") == "n0")
        assert gone == {"low-0", "low-1"}  # minCount 1 with {single: {}} would let one go
        c = wait_for(
            "DisruptionTarget", lambda: status_is(kube, PODGROUPS, "low", "DisruptionTarget", "True")
        )
        assert isinstance(c, dict) and c["reason"] == "PreemptionByScheduler", c
