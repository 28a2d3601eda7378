"""Kubernetes-native gangs (scheduling.k8s.io PodGroup) and subgroups of ours and KAI's, as read
into the world the core sees: minimums, topology keys, priority, disruption mode, multi-level."""

from __future__ import annotations

from typing import Any

import numpy as np

from kube_objects import node, pod, pod_group
from phalanx.core.cycle import run_cycle
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read import native
from phalanx.k8s.read.lifecycle import gang_status
from phalanx.k8s.read.world import build_world
from phalanx.profiles import load_profile

CFG = AdapterConfig()
RACK = "topology.phalanx.io/rack"


def native_group(name: str, min_count: int | None, workload: str = "", template: str = "", **spec: Any):
    policy = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    body: dict[str, Any] = {"schedulingPolicy": policy, **spec}
    if workload:
        body["podGroupTemplateRef"] = {
            "workload": {"workloadName": workload, "podGroupTemplateName": template}
        }
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": body,
    }


def member(name: str, group: str, gpus: int = 4, **kw: Any) -> dict[str, Any]:
    p = pod(name, gpus=gpus, **kw)
    p["spec"]["schedulingGroup"] = {"podGroupName": group}
    return p


def nodes(n: int = 2) -> list[dict[str, Any]]:
    return [node(f"n{i}", gpus=4, labels={RACK: f"r{i}"}) for i in range(n)]


def world(pods, groups, n: int = 2):
    return build_world(nodes(n), pods, groups, [], CFG, now=0.0)


def cycle(w):
    return run_cycle(w.snapshot, load_profile("phalanx"), 0.0, np.random.default_rng(0))


def test_native_gang_that_cannot_fit_binds_nothing():
    pods = [member(f"p{i}", "g") for i in range(3)]
    w = world(pods, [native_group("g", 3)])
    entry = w.snapshot.workloads["default/g"]
    assert entry.workload.gang_size == 3
    r = cycle(w)
    assert r.binds == [] and "2 of 3 placed" in r.pending_for("default/g").message


def test_native_gang_waits_for_min_count_pods_and_for_its_podgroup():
    w = world([member("p0", "g")], [native_group("g", 2)])
    assert "minCount 2 exceeds the 1 pod(s)" in w.blocked["default/g"][0]
    w = world([member("p0", "late")], [])
    assert "does not exist yet" in w.blocked["default/late"][0]


def test_native_spec_fields_priority_disruption_topology():
    g = native_group(
        "g",
        2,
        priority=1000,
        disruptionMode="PodGroup",
        schedulingConstraints={"topology": [{"key": RACK}]},
    )
    w = world([member("p0", "g", gpus=2), member("p1", "g", gpus=2)], [g])
    wl = w.snapshot.workloads["default/g"].workload
    assert (wl.priority, wl.preempt_whole, wl.topology.level, wl.topology.required) == (
        1000,
        True,
        "rack",
        True,
    )
    binds = cycle(w).binds
    assert len(binds) == 2 and len({b.node for b in binds}) == 1  # one rack


def test_native_basic_policy_places_pods_one_by_one():
    pods = [member(f"p{i}", "g") for i in range(3)]
    w = world(pods, [native_group("g", None)])
    assert len(cycle(w).binds) == 2  # no gang: what fits runs


def test_unknown_topology_key_says_what_is_wrong():
    bad = native_group("g", 1, schedulingConstraints={"topology": [{"key": "example.com/pod"}]})
    w = world([member("p0", "g")], [bad])
    assert "example.com/pod" in w.blocked["default/g"][0] and "rack=" in w.blocked["default/g"][0]


def test_a_pods_claims_that_match_its_podgroups_are_the_groups():
    pg = native_group(
        "g",
        2,
        resourceClaims=[
            {"name": "net", "resourceClaimName": "shared-nic"},
            {"name": "imex", "resourceClaimTemplateName": "channel"},
        ],
    )
    p = member("p0", "g")
    p["spec"]["resourceClaims"] = [
        {"name": "net", "resourceClaimName": "shared-nic"},
        {"name": "imex", "resourceClaimTemplateName": "channel"},
        {"name": "own", "resourceClaimTemplateName": "channel"},  # same template, another name: its own
    ]
    assert native.group_claims(p, pg) == {"net": "shared-nic", "imex": ""}  # made from the template later
    pg["status"] = {"resourceClaimStatuses": [{"name": "imex", "resourceClaimName": "g-imex-x1"}]}
    assert native.group_claims(p, pg) == {"net": "shared-nic", "imex": "g-imex-x1"}
    assert native.reference(pg) == {
        "apiGroup": "scheduling.k8s.io",
        "resource": "podgroups",
        "name": "g",
        "uid": "uid-g",
    }


def test_podgroups_of_one_workload_from_two_templates_are_one_multi_level_gang():
    groups = [
        native_group("prefill", 1, "serve", "prefill", schedulingConstraints={"topology": [{"key": RACK}]}),
        native_group("decode", 2, "serve", "decode"),
    ]
    pods = [member("pf0", "prefill"), member("dc0", "decode"), member("dc1", "decode")]
    w = world(pods, groups)  # 3 pods x 4 GPUs on 2 nodes x 4 GPUs: decode fits, the whole does not
    entry = w.snapshot.workloads["default/Workload/serve"]
    assert sorted(sg.name for sg in entry.workload.subgroups) == ["decode", "prefill"]
    assert "default/prefill" not in w.pod_groups  # the gang speaks for its PodGroups
    r = cycle(w)
    assert r.binds == []
    w = world(pods[:1] + pods[1:2], [groups[0], native_group("decode", 1, "serve", "decode")])
    assert len(cycle(w).binds) == 2


def test_podgroups_of_one_template_stay_separate_gangs():
    groups = [native_group(f"rep{i}", 1, "lws", "group") for i in range(2)]
    w = world([member("a", "rep0"), member("b", "rep1")], groups)
    assert {"default/rep0", "default/rep1"} <= set(w.snapshot.workloads)


def test_our_podgroup_subgroups_and_kai_subgroups():
    ours = pod_group(
        "pg",
        3,
        subGroups=[
            {"name": "prefill", "minMember": 1, "topology": {"level": "rack", "required": True}},
            {"name": "decode", "minMember": 2},
        ],
    )
    sub = "phalanx.io/subgroup"
    pods = [
        pod("a", gpus=4, labels={"phalanx.io/pod-group": "pg", sub: "prefill"}),
        pod("b", gpus=4, labels={"phalanx.io/pod-group": "pg", sub: "decode"}),
    ]
    w = world(pods, [ours])
    assert "1 more pod in subgroup decode" in w.blocked["default/pg"][0]
    kai = pod_group(
        "k",
        2,
        api="scheduling.run.ai/v2alpha2",
        subgroups=[
            {"name": "top", "topologyConstraint": {"requiredTopologyLevel": RACK}},
            {
                "name": "a",
                "minMember": 1,
                "parent": "top",
                "topologyConstraint": {"requiredTopologyLevel": RACK},
            },
            {"name": "b", "minMember": 1, "parent": "top"},
        ],
    )
    lab = "kai.scheduler/subgroup-name"
    pods = [
        pod("x", gpus=4, annotations={"pod-group-name": "k"}, labels={lab: "a"}),
        pod("y", gpus=4, annotations={"pod-group-name": "k"}, labels={lab: "b"}),
    ]
    w = world(pods, [kai])
    subs = {sg.name: sg for sg in w.snapshot.workloads["default/k"].workload.subgroups}
    assert set(subs) == {"a", "b"} and subs["a"].topology.level == "rack"
    assert len(cycle(w).binds) == 2
    stray = pod("z", gpus=1, annotations={"pod-group-name": "k"}, labels={lab: "nope"})
    w = world([*pods, stray], [kai])
    assert "names no subgroup" in w.blocked["default/k"][0]


def test_disruption_mode_podgroup_is_preempted_whole_pod_mode_only_beyond_its_minimum():
    profile = load_profile("phalanx-queues")
    taken = {}
    for mode in ("Pod", "PodGroup"):
        lows = [member(f"low-{i}", "low", gpus=2, node="n0") for i in range(2)]
        for p in lows:
            p["status"] = {"phase": "Running", "startTime": "2026-11-29T09:00:00Z"}
        high = member("high-0", "high", gpus=2, priority=1000)
        groups = [native_group("low", 1, disruptionMode=mode), native_group("high", 1)]
        w = build_world([node("n0", gpus=4)], [*lows, high], groups, [], CFG, now=1.8e9)
        r = run_cycle(w.snapshot, profile, 1.8e9, np.random.default_rng(0))
        assert [b.task for b in r.binds] == ["default/high-0"]
        taken[mode] = sorted(e.task for e in r.evictions)
    assert taken == {"Pod": ["default/low-0"], "PodGroup": ["default/low-0", "default/low-1"]}


def test_volcano_subgroup_policy_splits_pods_by_label_keys():
    vc = pod_group(
        "v",
        4,
        api="scheduling.volcano.sh/v1beta1",
        subGroupPolicy=[
            {
                "name": "workers",
                "subGroupSize": 2,
                "minSubGroups": 2,
                "labelSelector": {"matchLabels": {"role": "worker"}},
                "matchLabelKeys": ["replica"],
            }
        ],
    )
    ann = {"scheduling.k8s.io/group-name": "v"}
    pods = [
        pod(f"w{r}{i}", gpus=2, annotations=ann, labels={"role": "worker", "replica": str(r)})
        for r in range(2)
        for i in range(2)
    ]
    w = world(pods, [vc])
    subs = {sg.name: sg.min_available for sg in w.snapshot.workloads["default/v"].workload.subgroups}
    assert subs == {"workers/0": 2, "workers/1": 2}
    assert len(cycle(w).binds) == 4
    w = world(pods[:3], [vc])  # replica 1 has one pod of its two
    assert "1 more pod in subgroup workers/1" in w.blocked["default/v"][0]
    vc["spec"]["subGroupPolicy"][0]["minSubGroups"] = 1
    w = world(pods, [vc])
    assert "Phalanx places every subgroup" in w.blocked["default/v"][0]


def test_a_native_podgroup_without_pods_yet_shows_its_min_count():
    w = world([], [native_group("empty", 3)])
    st = gang_status(w, "default/empty")
    assert st is not None and (st.phase, st.min_member, st.missing) == ("Pending", 3, 3)
