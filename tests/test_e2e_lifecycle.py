"""What the user is told follows real pod lifecycles (issue 27), on a real API server.

There are no kubelets here: a pod "runs" or "completes" because the test patches its status phase
through the API, as a kubelet would report it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from builders import default_profile_data, time_slicing_data
from e2e_kube import Kube, phalanx, running, wait_for
from kube_objects import node, pod, pod_group
from phalanx.k8s.client.kinds import Kind
from phalanx.k8s.decide.insight import wall
from phalanx.k8s.read.pods import timestamp

pytestmark = pytest.mark.e2e
POD_GROUPS = Kind("scheduling.phalanx.io", "v1alpha1", "podgroups", True, "PodGroup")
GROUP = "phalanx.io/pod-group"


def member(name: str, group: str, **kw: Any) -> dict[str, Any]:
    return pod(name, gpus=1, annotations={GROUP: group}, **kw)


def group_seen(s: Any, name: str, ns: str = "default") -> None:
    """Wait until the scheduler's cache holds PodGroup `name`. Its watch is not the pods' watch, and
    under load a member pod can arrive first: the pods present then set the minimum (a known race
    of the product, docs/kubernetes.md "Known limits"), which is not what these tests are about."""
    wait_for(
        f"the scheduler to see PodGroup {ns}/{name}",
        lambda: any(
            (o.get("metadata") or {}).get("name") == name and (o.get("metadata") or {}).get("namespace") == ns
            for o in s.store.items(POD_GROUPS.key)
        ),
        timeout=20,
    )


def finish(kube: Kube, name: str, phase: str = "Succeeded") -> None:
    """Play the kubelet: the pod's containers ended."""
    kube.api.patch_status("pods", name, "default", {"phase": phase})


def status(kube: Kube, name: str) -> dict[str, Any]:
    return (kube.get(POD_GROUPS, name, "default") or {}).get("status") or {}


def condition(kube: Kube, name: str, kind: str) -> dict[str, Any]:
    return next((c for c in status(kube, name).get("conditions") or [] if c.get("type") == kind), {})


def typed_events(kube: Kube, name: str) -> list[tuple[str, str, str]]:
    """Events of this pod, not of an earlier test's pod of the same name (Events outlive pods)."""
    uid = ((kube.api.get_pod("default", name) or {}).get("metadata") or {}).get("uid")
    items = kube.api.request("GET", "/api/v1/namespaces/default/events")["items"]
    return [
        (e["type"], e["reason"], e["message"])
        for e in items
        if e["involvedObject"].get("name") == name and e["involvedObject"].get("uid") == uid
    ]


def status_cli(kube: Kube, *args: str) -> str:
    p = phalanx(
        "status", "--kubeconfig", str(kube.cp.kubeconfig), *args, env={**os.environ, "COLUMNS": "400"}
    )
    out = p.communicate(timeout=90)[0]
    assert p.returncode == 0, out
    return out


def test_a_gang_with_a_succeeded_member_reads_as_running_in_its_status_and_phalanx_status(kube: Kube) -> None:
    kube.api.create("nodes", node("n0", gpus=2))
    kube.create(pod_group("train", 2))
    for k in range(2):
        kube.create(member(f"train-{k}", "train"))
    with running(kube, profile="phalanx-queues") as s:
        wait_for("the gang bound", lambda: all(kube.node_of(f"train-{k}") for k in range(2)), timeout=20)
        kube.run_pod("train-0")
        kube.run_pod("train-1")
        finish(kube, "train-1")  # one member completed; the other runs on
        wait_for(
            "the Running condition counts the member that ended",
            lambda: (
                "1 running, 1 ended (1 succeeded), 0 waiting"
                in condition(kube, "train", "Running").get("message", "")
            ),
            timeout=20,
        )
        s.explainer.flush()
        time.sleep(1.0)  # a few more cycles: nothing may turn it back
        st = status(kube, "train")
        assert st["phase"] == "Running", st
        assert condition(kube, "train", "Scheduled")["status"] == "True"
        assert condition(kube, "train", "Scheduled")["reason"] == "Scheduled"
        assert condition(kube, "train", "Running")["status"] == "True"
        assert not [e for e in typed_events(kube, "train-0") if e[0] == "Warning"]
    out = status_cli(kube, "--profile", "phalanx-queues")
    gangs, _, pending = out.partition("Pending workloads")
    assert "default/train" in gangs and "Running" in gangs and "1 running, 1 ended (1 succeeded)" in gangs, (
        out
    )
    assert "default/train" not in pending, out


def test_a_gang_whose_pods_are_still_being_created_gets_no_warning(kube: Kube) -> None:
    kube.api.create("nodes", node("n0", gpus=2))
    with running(kube) as s:
        kube.create(pod_group("race", 2))
        group_seen(s, "race")
        kube.create(member("race-0", "race"))
        said = wait_for(
            "waiting for the second pod",
            lambda: [e for e in typed_events(kube, "race-0") if e[1] == "WaitingForPods"],
            timeout=20,
        )
        assert said[0][0] == "Normal" and "waiting for 1 more pod" in said[0][2], said
        wait_for(
            "the PodGroup waits for pods",
            lambda: condition(kube, "race", "Scheduled").get("reason") == "WaitingForPods",
        )
        assert status(kube, "race")["phase"] == "Pending"
        kube.create(member("race-1", "race"))
        wait_for("the gang bound", lambda: all(kube.node_of(f"race-{k}") for k in range(2)), timeout=20)
        s.explainer.flush()
        wait_for(
            "the PodGroup scheduled", lambda: condition(kube, "race", "Scheduled").get("status") == "True"
        )
    warnings = [e for k in range(2) for e in typed_events(kube, f"race-{k}") if e[0] == "Warning"]
    assert not warnings, warnings


def _classes(kube: Kube) -> None:
    for name, value in (("e27-low", 100), ("e27-high", 1000)):
        kube.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )


def _classed(p: dict[str, Any], priority_class: str) -> dict[str, Any]:
    del p["spec"]["priority"]  # the priority comes from the class
    p["spec"]["priorityClassName"] = priority_class
    return p


def _profile(tmp_path: Path, min_runtime: float) -> str:
    """The default profile, preempting by priority only after `min_runtime` (the default before issue 27)."""
    prof = default_profile_data()
    prof["name"] = "phalanx-queues-min-runtime"
    for action in prof["actions"]:
        if action["name"] == "preempt":
            action["args"]["min_runtime"] = min_runtime
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(prof))
    return str(path)


def test_a_preemption_held_back_by_min_runtime_names_it_and_when_it_ends(kube: Kube, tmp_path: Path) -> None:
    _classes(kube)
    kube.api.create("nodes", node("n0", gpus=2))
    for k in range(2):
        kube.create(_classed(pod(f"low-{k}", gpus=1), "e27-low"))
    prof = _profile(tmp_path, 600)
    with running(kube, profile=prof) as s:
        wait_for("the low pods bound", lambda: all(kube.node_of(f"low-{k}") for k in range(2)), timeout=20)
        at = time.time() - 60  # a minute into their 10-minute minimum runtime, both the same second
        for k in range(2):
            kube.run_pod(f"low-{k}", started_at=at)
        started = max(timestamp(kube.pods()[f"low-{k}"]["status"]["startTime"]) for k in range(2))
        kube.create(pod_group("train", 2))
        group_seen(s, "train")
        for k in range(2):
            kube.create(_classed(member(f"train-{k}", "train"), "e27-high"))

        def said() -> str:
            return " ".join(m for _, r, m in typed_events(kube, "train-0") if r == "FailedScheduling")

        text = wait_for("the gang told why it waits", lambda: "min_runtime" in said() and said(), timeout=30)
        # the status is written after the Event (its own writer): under load, a moment later
        wait_for(
            "the PodGroup's Scheduled condition says why",
            lambda: "min_runtime 600 s" in condition(kube, "train", "Scheduled").get("message", ""),
            timeout=30,
        )
    assert (
        "preempt: min_runtime 600 s protects default/low-0 (priority 100), default/low-1 (priority 100) "
        f"until {wall(started + 600)}; they may be preempted then"
    ) in text, text
    assert (
        "expected to start around" in text
        and "when default/low-0, default/low-1 may be preempted (forecast)" in text
    )
    assert "does not fit even when everything running has ended" not in text
    assert not any(kube.pods()[f"low-{k}"]["metadata"].get("deletionTimestamp") for k in range(2))
    out = status_cli(kube, "--profile", prof)
    assert "min_runtime 600 s protects default/low-0" in out and "may be preempted" in out, out


def test_the_default_preempts_at_once_and_the_gang_waits_for_its_victims_to_terminate(kube: Kube) -> None:
    _classes(kube)
    kube.api.create("nodes", node("n0", gpus=2))
    for k in range(2):
        kube.create(_classed(pod(f"low-{k}", gpus=1), "e27-low"))
    with running(kube, profile="phalanx-queues") as s:
        wait_for("the low pods bound", lambda: all(kube.node_of(f"low-{k}") for k in range(2)), timeout=20)
        for k in range(2):
            kube.run_pod(f"low-{k}", started_s_ago=60)  # a minute old: priority does not wait (issue 27)
        kube.create(pod_group("train", 2))
        group_seen(s, "train")
        for k in range(2):
            kube.create(_classed(member(f"train-{k}", "train"), "e27-high"))
        try:
            wait_for(
                "the victims terminating",
                lambda: all(kube.pods()[f"low-{k}"]["metadata"].get("deletionTimestamp") for k in range(2)),
                timeout=20,
            )
        except AssertionError as e:  # once under load: say what the scheduler and the pods said
            pods = kube.pods()
            seen = {
                n: (p["spec"].get("nodeName"), p["metadata"].get("deletionTimestamp"))
                for n, p in pods.items()
            }
            said = {f"train-{k}": typed_events(kube, f"train-{k}") for k in range(2)}
            raise AssertionError(f"{e}; pods (node, deleting): {seen}; events: {said}") from None

        def said() -> str:
            return " ".join(m for _, r, m in typed_events(kube, "train-0") if r == "FailedScheduling")

        def waited_for() -> set[str]:
            """The victims named in a 'waits for ... to terminate (grace period until T)' clause: one
            clause for both, or one each when the API server's clock gave their evictions ends a
            second apart (two requests that straddle a second)."""
            found = re.findall(r"waits for ([^()]+?) to terminate \(grace period until ", said())
            return {n.strip() for names in found for n in names.split(",")}

        wait_for(
            "the gang told it waits for both victims' grace periods",
            lambda: waited_for() == {"default/low-0", "default/low-1"} or None,
            timeout=20,
        )
        text = said()
        # the forecast names the victims whose grace period ends last: both, or the later one when
        # the API server's clock gave their evictions ends a second apart
        ends: dict[str, list[str]] = {}
        for names, until in re.findall(
            r"waits for ([^()]+?) to terminate \(grace period until ([^)]+)\)", text
        ):
            ends.setdefault(until, []).extend(n.strip() for n in names.split(","))
        secs = {
            u: sum(int(x) * f for x, f in zip(u.split()[0].split(":"), (3600, 60, 1), strict=True))
            for u in ends
        }
        if max(secs.values()) - min(secs.values()) > 43200:  # the two ends straddle midnight
            secs = {u: t + 86400 if t < 43200 else t for u, t in secs.items()}
        last = sorted(ends[max(secs, key=lambda u: secs[u])])
        verb = "have" if len(last) > 1 else "has"
        assert f"when {', '.join(last)} {verb} terminated (forecast)" in text, text
        assert "does not fit even when everything running has ended" not in text, text
        assert any(r == "Preempting" for _, r, _ in typed_events(kube, "train-0"))
        for k in range(2):
            kube.force_delete_pod(f"low-{k}")  # what their kubelet would confirm
        wait_for("the gang bound", lambda: all(kube.node_of(f"train-{k}") for k in range(2)), timeout=20)


def test_a_preemption_refused_by_a_disruption_budget_is_told_to_the_preemptor(kube: Kube) -> None:
    _classes(kube)
    kube.api.create("nodes", node("n0", gpus=1))
    kube.create(_classed(pod("low", gpus=1, labels={"app": "low"}), "e27-low"))
    kube.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep-low", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "low"}}},
        }
    )
    with running(kube, profile="phalanx-queues"):
        wait_for("low bound", lambda: kube.node_of("low"), timeout=20)
        kube.run_pod("low")
        kube.create(_classed(pod("high", gpus=1), "e27-high"))

        def said() -> str:
            return " ".join(m for _, r, m in typed_events(kube, "high") if r == "FailedScheduling")

        text = wait_for("the preemptor told", lambda: "was refused" in said() and said(), timeout=30)
    assert "preempt: the eviction of default/low was refused: Cannot evict pod" in text, text
    assert "disruption budget" in text and "no known end" in text, text
    assert not kube.node_of("high")


def _time_slicing(tmp_path: Path) -> str:
    """The default with LAS time-slicing after a 4 h quantum (the default before restarts counted)."""
    path = tmp_path / "slicing.yaml"
    path.write_text(yaml.safe_dump(time_slicing_data()))
    return str(path)


def test_time_slicing_waits_for_the_checkpoint_the_job_reports(kube: Kube, tmp_path: Path) -> None:
    """Time-slicing evicts a long job of a higher LAS level only just after a checkpoint. By
    its bind's clock (started 6.5 h ago, checkpoints every hour) the next one is 30 minutes away;
    once the job reports one (`phalanx.io/last-checkpoint`) whose next is due in seconds, the
    watch brings the annotation in and the job is evicted then."""
    kube.api.create("nodes", node("n0", gpus=2))
    every = {"phalanx.io/checkpoint-interval": "3600"}
    kube.create(pod("old", gpus=2, annotations=every))
    with running(kube, profile=_time_slicing(tmp_path)):
        wait_for("old bound", lambda: kube.node_of("old"), timeout=20)
        started = time.time() - 6.5 * 3600  # 13 GPU-hours: past the first LAS level, past the 4 h quantum
        kube.run_pod("old", started_at=started)
        kube.create(pod("new", gpus=2))

        def said() -> str:
            return " ".join(m for _, r, m in typed_events(kube, "new") if r == "FailedScheduling")

        text = wait_for("new told it waits for a checkpoint", lambda: "checkpoint" in said() and said(), 30)
        assert "just after a checkpoint (window 10 s)" in text, text
        assert not kube.pods()["old"]["metadata"].get("deletionTimestamp")
        reported = time.time() - 3600 + 3  # the next checkpoint by the report: 3 s from now
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(reported))
        kube.api.patch_pod_annotations("default", "old", {"phalanx.io/last-checkpoint": at})
        wait_for(
            "old evicted just after its reported checkpoint",
            lambda: kube.pods()["old"]["metadata"].get("deletionTimestamp"),
            timeout=30,
        )
        events = wait_for(
            "the Preempted Event", lambda: [m for _, r, m in typed_events(kube, "old") if r == "Preempted"]
        )
    assert any("default/new" in m for m in events), events
