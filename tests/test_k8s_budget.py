"""Eviction budgets through the Kubernetes driver (in-process fake API server: the fake deletes an
evicted pod at once, as a kubelet that confirms fast would): the cycle's start forecasts once
emptied the hour the budget counts, so a budget of 2 let an eviction through every cycle."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from fakeapi import FakeApi
from kube_objects import node, pod, queue
from test_k8s_adapter import fake, pods_of, scheduler, step

__all__ = ["fake"]  # the fixture

PROFILE = {
    "name": "budget-2",
    "tie_break": "name",
    "actions": [
        {"name": "allocate"},
        {"name": "reclaim", "args": {"budget": {"cluster": 2}}},
    ],
    "order": [{"name": "priority"}],
    "admission": [{"name": "quota"}],
    "queue_order": {"name": "fairshare"},
}


def test_a_cluster_budget_of_two_lets_two_evictions_through_and_no_more(
    fake: FakeApi, tmp_path: Path
) -> None:
    prof = tmp_path / "profile.yaml"
    prof.write_text(yaml.safe_dump(PROFILE))
    fake.put(node("n0", gpus=8))
    fake.put(queue("qa", gpu_quota=4))
    fake.put(queue("qb", gpu_quota=4))
    for k in range(8):  # qb borrows qa's half
        fake.put(pod(f"b-{k}", gpus=1, annotations={"phalanx.io/queue": "qb"}))
    s = scheduler(fake, profile=str(prof))
    assert len(step(s, fake).outcome.bound) == 8
    for k in range(8):
        p = copy.deepcopy(pods_of(fake)[f"b-{k}"])
        p["status"] = {"phase": "Running", "startTime": "2026-11-29T10:00:00Z"}
        fake.put(p)
    for k in range(4):
        fake.put(pod(f"a-{k}", gpus=1, annotations={"phalanx.io/queue": "qa"}))
    evicted: list[str] = []
    for _ in range(6):
        evicted += step(s, fake).outcome.evicted
    assert len(evicted) == 2, evicted
    assert [r[1] for r in s.repeats.recent] == evicted
    s.stop()
