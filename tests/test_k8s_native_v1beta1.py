"""The Workload API as Kubernetes 1.37 publishes it (scheduling.k8s.io/v1beta1 PodGroup,
v1alpha3 CompositePodGroup; field names from the published Go types, kubernetes/api master of
2026-07): disruptionMode as a union, `workloadRef`, `preemptionPolicy`, a mutable `minCount`,
CompositePodGroup trees as multi-level gangs, and the conditions written back per version."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kube_objects import node, pod
from phalanx.core.cycle import run_cycle
from phalanx.core.errors import SpecError
from phalanx.k8s.act.native_status import NativeStatus, scheduled_type
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read import native
from phalanx.k8s.read.world import build_world
from phalanx.profiles import load_profile

CFG = AdapterConfig()
RACK = "topology.phalanx.io/rack"
BETA = "scheduling.k8s.io/v1beta1"


def group(
    name: str, min_count: int | None, parent: str = "", workload: str = "", **spec: Any
) -> dict[str, Any]:
    policy = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    body: dict[str, Any] = {"schedulingPolicy": policy, **spec}
    if parent:
        body["parentCompositePodGroupName"] = parent
    if workload:
        body["workloadRef"] = {"workloadName": workload, "templateName": name}
    return {
        "apiVersion": BETA,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": body,
    }


def composite(name: str, min_groups: int | None, parent: str = "", **spec: Any) -> dict[str, Any]:
    policy = {"gang": {"minGroupCount": min_groups}} if min_groups is not None else {"basic": {}}
    body: dict[str, Any] = {"schedulingPolicy": policy, "workloadRef": {"workloadName": "w"}, **spec}
    if parent:
        body["parentCompositePodGroupName"] = parent
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha3",
        "kind": "CompositePodGroup",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-c-{name}"},
        "spec": body,
    }


def member(name: str, pg: str, gpus: int = 4, **kw: Any) -> dict[str, Any]:
    p = pod(name, gpus=gpus, **kw)
    p["spec"]["schedulingGroup"] = {"podGroupName": pg}
    return p


def world(pods: list[dict[str, Any]], groups: list[dict[str, Any]], n: int = 4, now: float = 0.0):
    nodes = [node(f"n{i}", gpus=4, labels={RACK: f"r{i // 2}"}) for i in range(n)]
    return build_world(nodes, pods, groups, [], CFG, now=now)


LATER = 4e9  # long after the pods were made: their minimum run time is over


def preempting(w):
    return run_cycle(w.snapshot, load_profile("phalanx-queues"), LATER, np.random.default_rng(0))


def cycle(w):
    return run_cycle(w.snapshot, load_profile("phalanx"), 0.0, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("mode", "whole"),
    [
        ({"all": {}}, True),
        ({"single": {}}, False),
        ("All", True),
        ("Single", False),
        ("PodGroup", True),
        (None, False),
    ],
)
def test_disruption_mode_reads_the_union_of_1_37_and_the_string_of_1_36(mode: Any, whole: bool) -> None:
    spec = {} if mode is None else {"disruptionMode": mode}
    assert native.disrupted_whole(spec, "PodGroup default/g") is whole


@pytest.mark.parametrize("mode", [{"all": {}, "single": {}}, {"some": {}}, "Whole", 3])
def test_a_disruption_mode_it_cannot_read_names_the_field(mode: Any) -> None:
    with pytest.raises(SpecError, match=r"PodGroup default/g: spec.disruptionMode"):
        native.disrupted_whole({"disruptionMode": mode}, "PodGroup default/g")


def test_a_1_37_gang_with_disruption_mode_all_is_placed_whole_and_preempted_whole() -> None:
    pods = [member(f"p{i}", "g", gpus=4) for i in range(2)]
    w = world(
        pods, [group("g", 2, disruptionMode={"all": {}}, schedulingConstraints={"topology": [{"key": RACK}]})]
    )
    wl = w.snapshot.workloads["default/g"].workload
    assert (
        wl.preempt_whole and wl.min_available == 2 and wl.topology is not None and wl.topology.level == "rack"
    )
    r = cycle(w)
    nodes = {b.node for b in r.binds}
    assert len(r.binds) == 2 and nodes in ({"n0", "n1"}, {"n2", "n3"})  # one rack


def test_preemption_policy_never_places_in_free_room_only() -> None:
    low = [pod(f"low{i}", gpus=4, priority=0, node=f"n{i}") for i in range(2)]
    high = [member("h0", "g", gpus=4, priority=100)]
    never = group("g", 1, preemptionPolicy="Never")
    w = world(low + high, [never], n=2, now=LATER)
    assert not w.snapshot.workloads["default/g"].workload.preempts
    r = preempting(w)
    assert r.evictions == [] and r.binds == []
    w = world(low + high, [group("g", 1)], n=2, now=LATER)  # the same gang without it preempts
    r = preempting(w)
    assert r.evictions and r.evictions[0].reason.startswith("preempted by default/g")


def test_a_pod_whose_priority_class_says_never_preempts_nobody() -> None:
    low = [pod(f"low{i}", gpus=4, priority=0, node=f"n{i}") for i in range(2)]
    high = pod("high", gpus=4, priority=100)
    high["spec"]["preemptionPolicy"] = "Never"
    w = world([*low, high], [], n=2, now=LATER)
    assert not w.snapshot.workloads["default/high"].workload.preempts
    assert preempting(w).evictions == []
    del high["spec"]["preemptionPolicy"]
    assert preempting(world([*low, high], [], n=2, now=LATER)).evictions


def test_a_bad_preemption_policy_keeps_the_gang_waiting_and_says_why() -> None:
    w = world([member("p0", "g")], [group("g", 1, preemptionPolicy="Sometimes")])
    assert "spec.preemptionPolicy" in " ".join(w.blocked["default/g"])


def test_min_count_changed_on_the_object_is_read_the_next_cycle() -> None:
    pods = [member(f"p{i}", "g") for i in range(3)]
    assert "minCount 4 exceeds the 3 pod(s)" in world(pods, [group("g", 4)]).blocked["default/g"][0]
    w = world(pods, [group("g", 3)])  # an elastic gang's minCount lowered (mutable from 1.37)
    assert w.snapshot.workloads["default/g"].workload.min_available == 3


def tree(min_groups: int = 2, **root: Any) -> list[dict[str, Any]]:
    """A CompositePodGroup of two PodGroups (prefill, decode), each of two 4-GPU pods in one rack."""
    rack = {"schedulingConstraints": {"topology": [{"key": RACK}]}}
    return [
        composite("serve", min_groups, **root),
        group("prefill", 2, parent="serve", workload="w", **rack),
        group("decode", 2, parent="serve", workload="w", **rack),
    ]


def tree_pods() -> list[dict[str, Any]]:
    return [member(f"{g}-{i}", g) for g in ("prefill", "decode") for i in range(2)]


def test_a_composite_pod_group_is_one_multi_level_gang_each_group_in_one_rack() -> None:
    w = world(tree_pods(), tree())
    entry = w.snapshot.workloads["default/CompositePodGroup/serve"]
    wl = entry.workload
    assert sorted(sg.name for sg in wl.subgroups) == ["decode", "prefill"]
    assert all(sg.topology is not None and sg.topology.level == "rack" for sg in wl.subgroups)
    r = cycle(w)
    assert len(r.binds) == 4
    racks = {
        g: {int(b.node[1:]) // 2 for b in r.binds if b.task.split("/")[1].startswith(g)}
        for g in ("prefill", "decode")
    }
    assert all(len(v) == 1 for v in racks.values())


def test_a_composite_tree_that_does_not_fit_whole_places_nothing() -> None:
    w = world(tree_pods(), tree(), n=3)  # one rack and a half: decode or prefill, not both
    r = cycle(w)
    assert r.binds == []
    assert r.pending_for("default/CompositePodGroup/serve") is not None


def test_a_composite_waits_for_a_group_whose_pods_are_not_made_yet() -> None:
    pods = [p for p in tree_pods() if p["metadata"]["name"].startswith("prefill")]
    w = world(pods, tree())
    said = " ".join(w.blocked["default/CompositePodGroup/serve"])
    assert "PodGroup default/decode: waiting for 2 more pods" in said


def test_a_composite_asking_more_groups_than_it_has_waits_and_fewer_is_refused() -> None:
    w = world(tree_pods(), tree(min_groups=3))
    assert "waiting for 1 more group(s) (minGroupCount 3)" in " ".join(
        w.blocked["default/CompositePodGroup/serve"]
    )
    w = world(tree_pods(), tree(min_groups=1))
    said = " ".join(w.blocked["default/CompositePodGroup/serve"])
    assert "minGroupCount: 1 of the 2 groups" in said and "set it to 2" in said


def test_a_group_whose_parent_is_missing_waits_and_a_cycle_is_refused() -> None:
    w = world(tree_pods(), tree()[1:])  # the CompositePodGroup not made yet
    assert "CompositePodGroup default/serve does not exist yet" in " ".join(w.blocked["default/prefill"])
    loop = [composite("a", 1, parent="b"), composite("b", 1, parent="a"), group("prefill", 2, parent="a")]
    w = world([p for p in tree_pods() if "prefill" in p["metadata"]["name"]], loop)
    assert "the parents form a cycle" in " ".join(w.blocked["default/prefill"])


def test_a_basic_composite_leaves_its_groups_their_own_gangs() -> None:
    w = world(tree_pods(), tree(min_groups=None))
    assert {"default/prefill", "default/decode"} <= set(w.snapshot.workloads)


def test_a_composite_and_a_pod_group_of_one_name_do_not_clash() -> None:
    groups = [composite("x", 1), group("x", 2, parent="x")]
    w = world([member("x-0", "x"), member("x-1", "x")], groups)
    assert "default/CompositePodGroup/x" in w.snapshot.workloads


def test_conditions_follow_the_version_and_initially_scheduled_stays_true() -> None:
    assert (
        scheduled_type({"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup"})
        == "PodGroupScheduled"
    )
    assert scheduled_type({"apiVersion": BETA, "kind": "PodGroup"}) == "PodGroupInitiallyScheduled"
    assert scheduled_type({"kind": "CompositePodGroup"}) == "CompositePodGroupInitiallyScheduled"
    patched: list[tuple[str, str, dict[str, Any]]] = []

    class Api:
        def patch_status(self, kind: str, name: str, ns: str, body: dict[str, Any]) -> None:
            patched.append((kind, name, body))

    status = NativeStatus(Api(), lambda what, fn, **_: fn() or True)  # type: ignore[arg-type]
    w = world(tree_pods(), tree())
    r = cycle(w)
    bound = {b.task for b in r.binds}
    status.write(w, {}, bound, r)
    written = {(k, n): {c["type"]: c["status"] for c in b["conditions"]} for k, n, b in patched}
    assert written[(f"{BETA}/podgroups", "prefill")]["PodGroupInitiallyScheduled"] == "True"
    assert (
        written[("scheduling.k8s.io/v1alpha3/compositepodgroups", "serve")][
            "CompositePodGroupInitiallyScheduled"
        ]
        == "True"
    )
    # its pods gone back to waiting (preempted, say): the condition stays True
    patched.clear()
    w2 = world(tree_pods(), tree())
    status.write(w2, {"default/CompositePodGroup/serve": ("False", "Unschedulable", "no room")}, set(), None)
    for _, _, body in patched:
        assert all(
            c["status"] == "True" for c in body["conditions"] if c["type"].endswith("InitiallyScheduled")
        )


# A Job's spec.scheduling (batch/v1, 1.37 alpha, gate WorkloadWithJob): JobSchedulingConfiguration
# {schedulingPolicy, schedulingConstraints, disruptionMode, resourceClaims} of the published types


def job_world(scheduling: Any, pods: int = 4, parallelism: int = 4, n: int = 4):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"parallelism": parallelism, "scheduling": scheduling},
        "status": {},
    }
    ps = [pod(f"t{i}", gpus=4, owner=("Job", "train")) for i in range(pods)]
    nodes = [node(f"n{i}", gpus=4, labels={RACK: f"r{i // 2}"}) for i in range(n)]
    return build_world(nodes, ps, [], [], CFG, 0.0, jobs={"default/train": job})


JOB = "default/Job/train"


def test_a_jobs_gang_policy_sets_its_minimum_and_one_rack() -> None:
    w = job_world(
        {
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "schedulingConstraints": {"topology": [{"key": RACK}]},
        }
    )
    wl = w.snapshot.workloads[JOB].workload
    assert (
        wl.min_available == 2
        and wl.topology is not None
        and wl.topology.level == "rack"
        and wl.topology.required
    )


def test_a_jobs_gang_without_min_count_is_its_parallelism_and_waits_for_its_pods() -> None:
    w = job_world({"schedulingPolicy": {"gang": {}}, "disruptionMode": {"all": {}}}, pods=3)
    assert JOB not in w.snapshot.workloads
    assert "1 more pod" in " ".join(w.blocked[JOB]) and "3 of the 4 pods its gang needs" in " ".join(
        w.blocked[JOB]
    )
    w = job_world({"schedulingPolicy": {"gang": {}}, "disruptionMode": {"all": {}}})
    wl = w.snapshot.workloads[JOB].workload
    assert wl.min_available == 4 and wl.preempt_whole


def test_a_basic_job_places_its_pods_one_by_one() -> None:
    for sched in ({"schedulingPolicy": {"basic": {}}}, {}):
        w = job_world(sched, pods=3, n=2)  # 3 pods of 4 GPUs on 2 nodes: two run, not none
        assert w.snapshot.workloads[JOB].workload.min_available == 1
        assert len(cycle(w).binds) == 2


@pytest.mark.parametrize(
    ("sched", "where"),
    [
        ({"schedulingPolicy": {"gang": {"minCount": 0}}}, "spec.scheduling.schedulingPolicy.gang.minCount"),
        ({"schedulingPolicy": {"gang": {}}, "disruptionMode": "Whole"}, "spec.scheduling.disruptionMode"),
        (
            {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": "nowhere"}]}},
            "spec.scheduling.schedulingConstraints.topology[0].key",
        ),
        (
            {"resourceClaims": [{"name": "nic", "resourceClaimTemplateName": "nic"}]},
            "spec.scheduling.resourceClaims",
        ),
        ("gang", "spec.scheduling"),
    ],
)
def test_a_job_scheduling_field_it_cannot_honour_keeps_the_job_waiting_and_names_the_field(
    sched: Any, where: str
) -> None:
    w = job_world(sched)
    assert JOB not in w.snapshot.workloads
    said = " ".join(w.blocked[JOB])
    assert f"Job default/train: {where}:" in said, said


def test_pods_linked_to_the_podgroup_the_job_controller_made_follow_the_podgroup() -> None:
    job = {
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"parallelism": 4, "scheduling": {"schedulingPolicy": {"gang": {}}}},
    }
    ps = [member(f"t{i}", "train-pg", owner=("Job", "train")) for i in range(2)]
    nodes = [node(f"n{i}", gpus=4) for i in range(4)]
    w = build_world(nodes, ps, [group("train-pg", 2)], [], CFG, 0.0, jobs={"default/train": job})
    assert w.snapshot.workloads["default/train-pg"].workload.min_available == 2
