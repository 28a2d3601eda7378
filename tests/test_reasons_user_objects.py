"""Pending reasons speak in the user's objects (issue 39): what was asked (pods, GPUs each, the
minimum as the user wrote it), what is free and where, before any detail of the try. A flat gang
of any dialect is never called multi-level nor said to have a subgroup; a real multi-level gang
names its subgroups as its user named them.

Each world: one node of 4 GPUs, 2 of them taken by a running pod, and a gang of 4 pods of 1 GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kube_objects import node, pod, pod_group
from phalanx.core.cycle import run_cycle
from phalanx.k8s import keys
from phalanx.k8s.act.explain import describe
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.world import build_world
from phalanx.profiles import load_profile

CFG = AdapterConfig()
FREE = "2 GPUs free on 1 node in the cluster"


def busy() -> dict[str, Any]:
    p = pod("busy", gpus=2, node="n0")
    p["status"] = {"phase": "Running", "startTime": "2026-11-29T09:00:00Z"}
    return p


def reason(
    pods: list[dict[str, Any]],
    groups: list[dict[str, Any]],
    name: str,
    jobs: dict[str, dict[str, Any]] | None = None,
) -> str:
    """The text an Event, the PodGroup's condition and the dashboard carry for `name`."""
    w = build_world([node("n0", gpus=4)], [busy(), *pods], groups, [], CFG, now=0.0, jobs=jobs)
    assert name in w.snapshot.workloads, w.blocked
    r = run_cycle(w.snapshot, load_profile("phalanx"), 0.0, np.random.default_rng(0))
    assert not [b for b in r.binds if b.workload == name]
    p = r.pending_for(name)
    assert p is not None
    return describe(p)


def flat(text: str, asked: str) -> None:
    assert "multi-level" not in text and "subgroup" not in text.lower(), text
    assert text.startswith(asked + ": " + FREE), text  # what was asked, what is free: first
    assert "2 of 4 placed" in text, text


def native_group(name: str, min_count: int, workload: str = "", template: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    if workload:
        spec["podGroupTemplateRef"] = {
            "workload": {"workloadName": workload, "podGroupTemplateName": template}
        }
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": spec,
    }


def native_member(name: str, group: str, gpus: int = 1) -> dict[str, Any]:
    p = pod(name, gpus=gpus)
    p["spec"]["schedulingGroup"] = {"podGroupName": group}
    return p


@pytest.mark.parametrize(
    ("api", "key"),
    [
        ("scheduling.volcano.sh/v1beta1", "scheduling.k8s.io/group-name"),  # no subGroupPolicy
        ("scheduling.run.ai/v2alpha2", "pod-group-name"),  # KAI, no subgroups
        (f"{keys.GROUP}/{keys.VERSION}", keys.POD_GROUP),  # ours, no subGroups
    ],
)
def test_a_flat_podgroup_says_what_it_asks_and_what_is_free(api: str, key: str) -> None:
    pods = [pod(f"p{i}", gpus=1, annotations={key: "pg"}) for i in range(4)]
    text = reason(pods, [pod_group("pg", 4, api=api)], "default/pg")
    flat(text, "4 pods of 1 GPU each, all at once (minMember 4)")


def test_the_issue_39_volcano_podgroup_is_not_a_multi_level_gang() -> None:
    pods = [pod(f"p{i}", gpus=1, annotations={"scheduling.k8s.io/group-name": "pg"}) for i in range(4)]
    text = reason(pods, [pod_group("pg", 4, api="scheduling.volcano.sh/v1beta1")], "default/pg")
    # decided as the flat gang it is, so told as KAI's and ours are, the plugin that said no included
    assert text == (
        f"4 pods of 1 GPU each, all at once (minMember 4): {FREE}; 2 of 4 placed; "
        "gpu: insufficient free GPU (1 GPU) on 1 node(s)"
    )
    assert "not in a subGroupPolicy" not in text


def test_a_native_workload_api_podgroup_says_its_min_count() -> None:
    pods = [native_member(f"p{i}", "g") for i in range(4)]
    flat(reason(pods, [native_group("g", 4)], "default/g"), "4 pods of 1 GPU each, all at once (minCount 4)")


def test_a_kueue_pod_group_says_its_total_count() -> None:
    labels = {"kueue.x-k8s.io/pod-group-name": "kg"}
    ann = {keys.KUEUE_GROUP_TOTAL: "4"}
    pods = [pod(f"p{i}", gpus=1, labels=labels, annotations=ann) for i in range(4)]
    text = reason(pods, [], "default/kg")
    flat(text, f"4 pods of 1 GPU each, all at once ({keys.KUEUE_GROUP_TOTAL} 4)")


def test_a_jobs_pods_say_its_parallelism() -> None:
    job = {"metadata": {"name": "train", "namespace": "default"}, "spec": {"parallelism": 4}, "status": {}}
    pods = [pod(f"p{i}", gpus=1, owner=("Job", "train")) for i in range(4)]
    text = reason(pods, [], "default/Job/train", jobs={"default/train": job})
    flat(text, "4 pods of 1 GPU each, all at once (Job parallelism 4)")


def test_a_gang_by_owner_or_by_annotation_says_its_pods() -> None:
    pods = [pod(f"p{i}", gpus=1, owner=("JobSet", "js")) for i in range(4)]
    text = reason(pods, [], "default/JobSet/js")
    flat(text, "4 pods of 1 GPU each, all at once")
    ann = {keys.MIN_AVAILABLE: "4"}
    pods = [pod(f"p{i}", gpus=1, owner=("JobSet", "js"), annotations=ann) for i in range(4)]
    flat(reason(pods, [], "default/JobSet/js"), f"4 pods of 1 GPU each, all at once ({keys.MIN_AVAILABLE} 4)")


def test_one_pod_says_what_it_asks_and_what_is_free() -> None:
    text = reason([pod("big", gpus=4)], [], "default/big")
    assert text.startswith(f"1 pod of 4 GPUs: {FREE}"), text
    assert "multi-level" not in text and "gang" not in text, text


def test_a_volcano_subgroup_policy_names_the_users_subgroup() -> None:
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
        pod(f"w{r}{i}", gpus=1, annotations=ann, labels={"role": "worker", "replica": str(r)})
        for r in range(2)
        for i in range(2)
    ]
    text = reason(pods, [vc], "default/v")
    head = "4 pods of 1 GPU each, all at once (minMember 4), in 2 subgroups (workers/0, workers/1)"
    assert text.startswith(f"{head}: {FREE}; multi-level gang: subgroup workers/"), text


def test_pods_outside_a_subgroup_policy_are_said_as_what_they_are() -> None:
    vc = pod_group(
        "v",
        3,
        api="scheduling.volcano.sh/v1beta1",
        subGroupPolicy=[
            {"name": "workers", "subGroupSize": 2, "labelSelector": {"matchLabels": {"role": "w"}}}
        ],
    )
    ann = {"scheduling.k8s.io/group-name": "v"}
    pods = [pod(f"w{i}", gpus=1, annotations=ann, labels={"role": "w"}) for i in range(2)]
    pods.append(pod("x", gpus=3, annotations=ann))  # in no entry; the most GPUs, tried first
    text = reason(pods, [vc], "default/v")
    head = "1 pod of 3 GPUs and 2 pods of 1 GPU each, all at once (minMember 3), in 1 subgroup (workers)"
    assert text.startswith(f"{head}: {FREE}; multi-level gang: the pods no subGroupPolicy entry selects"), (
        text
    )
    assert "not in a subGroupPolicy" not in text and "subgroup (pods" not in text, text


def test_our_podgroup_and_kais_name_their_subgroups() -> None:
    sub = "phalanx.io/subgroup"
    ours = pod_group(
        "pg", 4, subGroups=[{"name": "prefill", "minMember": 2}, {"name": "decode", "minMember": 2}]
    )
    pods = [
        pod(f"{role}{i}", gpus=1, labels={keys.POD_GROUP: "pg", sub: role})
        for role in ("prefill", "decode")
        for i in range(2)
    ]
    text = reason(pods, [ours], "default/pg")
    assert text.startswith(
        f"4 pods of 1 GPU each, all at once (minMember 4), in 2 subgroups (prefill, decode): {FREE}"
    )
    assert (
        "subgroup decode (min 2) does not fit" in text or "subgroup prefill (min 2) does not fit" in text
    ), text
    kai = pod_group(
        "k",
        4,
        api="scheduling.run.ai/v2alpha2",
        subgroups=[{"name": "leader", "minMember": 1}, {"name": "workers", "minMember": 3}],
    )
    lab = "kai.scheduler/subgroup-name"
    pods = [pod("l0", gpus=1, annotations={"pod-group-name": "k"}, labels={lab: "leader"})]
    pods += [
        pod(f"w{i}", gpus=1, annotations={"pod-group-name": "k"}, labels={lab: "workers"}) for i in range(3)
    ]
    text = reason(pods, [kai], "default/k")
    assert text.startswith(
        f"4 pods of 1 GPU each, all at once (minMember 4), in 2 subgroups (leader, workers): {FREE}"
    )
    assert "subgroup workers (min 3) does not fit" in text, text


def test_a_native_workload_of_two_podgroups_names_them() -> None:
    groups = [native_group("prefill", 2, "serve", "prefill"), native_group("decode", 2, "serve", "decode")]
    pods = [native_member(f"pf{i}", "prefill") for i in range(2)] + [
        native_member(f"dc{i}", "decode") for i in range(2)
    ]
    text = reason(pods, groups, "default/Workload/serve")
    assert text.startswith(
        f"4 pods of 1 GPU each, all at once (minCount 2+2), in 2 subgroups (decode, prefill): {FREE}"
    )
    assert "subgroup decode (min 2)" in text or "subgroup prefill (min 2)" in text, text
