"""A gang's status follows its pods' lives (issue 27), against the in-process fake API server: members
that ended count as members that ran, pods still being created are waited for without a Warning,
and a preemptor whose victims cannot go yet is told why."""

from __future__ import annotations

import copy
import time

from fakeapi import FakeApi
from kube_objects import pod, pod_group
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.decide.insight import wall
from phalanx.k8s.read.pods import timestamp
from phalanx.k8s.view.board import build
from phalanx.k8s.view.status import collect
from test_k8s_adapter import OURS, cluster, events, fake, pods_of, scheduler, step

__all__ = ["fake"]  # the fixture
CREATED = "2026-11-29T10:00:00Z"  # what the fake server stamps on objects


def members(fake: FakeApi, name: str, k: int, gpus: int = 1) -> None:
    for i in range(k):
        fake.put(pod(f"{name}-{i}", gpus=gpus, annotations={"phalanx.io/pod-group": name}))


def play(fake: FakeApi, name: str, phase: str) -> None:
    """Play the kubelet: the pod's containers run, or it ended."""
    p = copy.deepcopy(pods_of(fake)[name])
    p["status"] = {"phase": phase, "startTime": CREATED}
    fake.put(p)


def status_of(fake: FakeApi, name: str) -> dict:
    return (fake.get(OURS, "podgroups", name, "default") or {}).get("status") or {}


def conditions(fake: FakeApi, name: str) -> dict[str, dict]:
    return {c["type"]: c for c in status_of(fake, name).get("conditions", [])}


def kinds(fake: FakeApi, name: str) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in fake.all("v1", "events") if e["involvedObject"]["name"] == name]


def test_a_gang_with_a_finished_member_reads_as_running_in_its_status_phalanx_status_and_the_dashboard(fake):
    cluster(fake, 1, gpus=2)
    fake.put(pod_group("train", 2))
    members(fake, "train", 2)
    s = scheduler(fake, profile="phalanx-queues")
    assert sorted(step(s, fake).outcome.bound) == ["default/train-0", "default/train-1"]
    st = status_of(fake, "train")
    assert st["phase"] == "Scheduled" and st["starting"] == 2  # bound; no kubelet said they run yet
    play(fake, "train-0", "Running")
    play(fake, "train-1", "Succeeded")  # one member completed, the other runs on
    report = step(s, fake)
    st = status_of(fake, "train")
    assert st["phase"] == "Running"
    assert (st["running"], st["succeeded"], st["failed"], st["waiting"]) == (1, 1, 0, 0)
    cond = conditions(fake, "train")
    assert cond["Scheduled"]["status"] == "True" and cond["Scheduled"]["reason"] == "Scheduled"
    assert cond["Running"]["status"] == "True"
    assert cond["Running"]["message"] == "1 running, 1 ended (1 succeeded), 0 waiting; minMember 2"
    assert not report.world.blocked and not report.result.pending
    assert not [e for e in kinds(fake, "train-0") if e[0] == "Warning"]
    # phalanx status: a gang, running; not a pending workload
    view = collect(s.api, AdapterConfig(profile="phalanx-queues"))
    assert {
        "workload": "default/train",
        "phase": "Running",
        "members": cond["Running"]["message"],
    } in view.gangs
    assert not [r for r in view.pending if r["workload"] == "default/train"]
    # the dashboard says the same
    _, details = build(report.world, report.result, {}, 0.0, "pool")
    assert details["workload/default/train"]["phase"] == "Running"
    assert details["workload/default/train"]["members"] == cond["Running"]["message"]
    # a replacement for the finished member is placed (the gang needs only what is left)
    fake.put(pod("train-2", gpus=1, annotations={"phalanx.io/pod-group": "train"}))
    assert step(s, fake).outcome.bound == ["default/train-2"]
    # every member ended: the gang succeeded, or failed when too few succeeded
    play(fake, "train-0", "Succeeded")
    play(fake, "train-2", "Failed")
    step(s, fake)
    assert status_of(fake, "train")["phase"] == "Succeeded"  # 2 of minMember 2 succeeded
    play(fake, "train-0", "Failed")
    step(s, fake)
    st = status_of(fake, "train")
    assert st["phase"] == "Failed" and (st["succeeded"], st["failed"]) == (1, 2)
    assert conditions(fake, "train")["Running"]["reason"] == "Failed"
    s.stop()


def test_a_gang_whose_pods_are_still_being_created_waits_for_them_without_a_warning(fake):
    cluster(fake, 1, gpus=2)
    fake.put(pod_group("train", 2))
    members(fake, "train", 1)  # the PodGroup exists a moment before its second pod
    now = [timestamp(CREATED) + 5]
    s = scheduler(fake, clock=lambda: now[0])
    report = step(s, fake)
    assert not report.outcome.bound
    assert kinds(fake, "train-0") == [("Normal", "WaitingForPods")]
    (said,) = [m for r, m in events(fake, "train-0")]
    assert said.startswith("PodGroup default/train: waiting for 1 more pod: minMember 2 exceeds the 1 pod(s)")
    st = status_of(fake, "train")
    assert st["phase"] == "Pending" and st["waiting"] == 1
    assert conditions(fake, "train")["Scheduled"]["reason"] == "WaitingForPods"
    assert "not created yet" in conditions(fake, "train")["Running"]["message"]
    members(fake, "train", 2)
    assert len(step(s, fake).outcome.bound) == 2
    assert conditions(fake, "train")["Scheduled"]["status"] == "True"
    assert not [e for e in kinds(fake, "train-0") + kinds(fake, "train-1") if e[0] == "Warning"]
    s.stop()


def test_a_gang_still_short_after_the_creation_grace_gets_a_warning(fake):
    cluster(fake, 1, gpus=2)
    fake.put(pod_group("train", 3))
    members(fake, "train", 1)
    s = scheduler(fake, clock=lambda: timestamp(CREATED) + 3600)
    step(s, fake)
    assert kinds(fake, "train-0") == [("Warning", "WaitingForPods")]
    assert "check minMember" in events(fake, "train-0")[0][1]
    s.stop()


def test_a_crd_that_knows_only_pending_and_running_still_gets_the_status(fake):
    cluster(fake, 1, gpus=2)
    fake.put(pod_group("train", 2))
    members(fake, "train", 2)
    fake.fail("PATCH", r"/podgroups/train/status", status=422, times=1)  # phase "Scheduled" unknown
    s = scheduler(fake)
    step(s, fake)
    st = status_of(fake, "train")
    assert st["phase"] == "Running" and s.explainer.legacy_phases  # said in its two words
    assert conditions(fake, "train")["Scheduled"]["status"] == "True"
    s.stop()


def test_a_preemptor_whose_eviction_is_refused_is_told_so(fake):
    cluster(fake, 1, gpus=1)
    fake.put(pod("low", gpus=1))
    s = scheduler(fake, profile="phalanx-queues")
    assert step(s, fake).outcome.bound == ["default/low"]
    fake.put(pod("high", gpus=1, priority=100))
    fake.fail("POST", r"/pods/low/eviction", status=429, times=4)  # a PodDisruptionBudget says no
    report = step(s, fake)
    assert report.outcome.not_evicted == ["default/low"]
    said = dict(events(fake, "high"))["FailedScheduling"]
    assert said.startswith("preempting: preempt: the eviction of default/low was refused")
    assert "no known end" in said
    report = step(s, fake)  # evicted now: it waits for the victim to terminate
    assert report.outcome.evicted == ["default/low"]
    assert "waits for default/low to terminate" in dict(events(fake, "high"))["Preempting"]
    s.stop()


def test_a_victim_terminating_is_what_the_preemptor_waits_for_with_its_grace_period(fake):
    cluster(fake, 1, gpus=2)
    for k in range(2):
        fake.put(pod(f"low-{k}", gpus=1))
    s = scheduler(fake, profile="phalanx-queues")
    assert len(step(s, fake).outcome.bound) == 2
    ends = int(time.time()) + 30
    for k in range(2):  # evicted by someone, going away with a grace period (no kubelet here)
        p = copy.deepcopy(pods_of(fake)[f"low-{k}"])
        p["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ends))
        fake.put(p)
    fake.put(pod_group("train", 2))
    members(fake, "train", 2, gpus=1)
    report = step(s, fake)
    pend = report.result.pending_for("default/train")
    assert pend is not None and {h.victim for h in pend.holds} == {"default/low-0", "default/low-1"}
    said = dict(events(fake, "train-0"))["FailedScheduling"]
    assert f"waits for default/low-0, default/low-1 to terminate (grace period until {wall(ends)})" in said
    assert "does not fit even when everything running has ended" not in said
    assert "expected to start now, when default/low-0, default/low-1 have terminated (forecast)" in said
    s.stop()


def test_an_unknown_podgroup_of_no_pods_waits_for_them(fake):
    cluster(fake, 1)
    fake.put(pod_group("empty", 2))
    s = scheduler(fake)
    step(s, fake)
    st = status_of(fake, "empty")
    assert st["phase"] == "Pending"
    assert (
        conditions(fake, "empty")["Scheduled"]["message"]
        == "PodGroup default/empty: waiting for 2 more pod(s)"
    )
    s.stop()


def test_status_help_says_it_shows_gangs_and_the_start_forecast():
    from typer.testing import CliRunner

    from phalanx.cli.main import app

    r = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["status", "--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.replace("│", " ").split())
    assert "start forecast" in text and "gangs with their phase" in text
