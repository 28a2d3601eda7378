"""A victim on its way out keeps what it holds, on a real API server (no kubelets: a pod deleted
with a grace period stays Terminating until the test confirms it gone, as its kubelet would).

Both were found by the full-cluster churn run: a preemptor evicted a victim each cycle while the
first was still terminating, and was then bound onto the GPU a terminating victim still held (the
victim's GPUs were recorded as the node's first free ones, not the ones its annotations name).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod, queue
from test_e2e_lifecycle import _classed, _classes, typed_events

pytestmark = pytest.mark.e2e


def _terminating(kube: Kube) -> list[str]:
    return sorted(n for n, p in kube.pods().items() if p["metadata"].get("deletionTimestamp"))


def _preempted(kube: Kube, uid: str) -> list[str]:
    """The Preempted Events of this very pod (earlier tests' pods of the same name have theirs too)."""
    items = kube.api.request("GET", "/api/v1/namespaces/default/events")["items"]
    mine = [e for e in items if e["involvedObject"].get("uid") == uid]
    return [e["message"] for e in mine if e["reason"] == "Preempted"]


def _gpus(kube: Kube, name: str) -> str:
    p = kube.pods().get(name) or {}
    return str(((p.get("metadata") or {}).get("annotations") or {}).get("phalanx.io/gpu-devices", ""))


def test_a_preemptor_waits_for_its_one_victim_and_evicts_no_more(kube: Kube) -> None:
    _classes(kube)
    kube.api.create("nodes", node("n0", gpus=4))
    for k in range(4):
        kube.create(_classed(pod(f"low-{k}", gpus=1), "e27-low"))
    with running(kube, profile="phalanx-queues") as s:
        wait_for("the low pods bound", lambda: all(kube.node_of(f"low-{k}") for k in range(4)), timeout=20)
        for k in range(4):
            kube.run_pod(f"low-{k}", started_s_ago=600)
        kube.create(_classed(pod("high", gpus=1), "e27-high"))
        gone = wait_for("one victim terminating", lambda: _terminating(kube) or None, timeout=20)
        assert len(gone) == 1, gone
        uid = kube.pods()[gone[0]]["metadata"]["uid"]
        said = wait_for("the victim's Preempted Event", lambda: _preempted(kube, uid) or None, timeout=5)
        assert "preempted by default/high" in said[0], said
        cycles = s.cycles
        wait_for("ten more cycles", lambda: s.cycles >= cycles + 10 or None, timeout=20)
        assert _terminating(kube) == gone, "more victims evicted for one 1-GPU preemptor"
        assert not kube.node_of("high"), "bound while its victim still holds the GPU"
        held = _gpus(kube, gone[0])
        kube.force_delete_pod(gone[0])  # what its kubelet would confirm
        wait_for("the preemptor bound", lambda: kube.node_of("high") == "n0", timeout=20)
        assert _gpus(kube, "high") == held
        time.sleep(1.0)
        assert len(kube.pods()) == 4 and not _terminating(kube)
        assert len(_preempted(kube, uid)) == 1  # written once, with the eviction


def test_a_terminating_pod_keeps_the_gpus_its_annotations_name(kube: Kube) -> None:
    """low-3 (GPU 3) is terminating and low-1 (GPU 1) is gone: the new pod gets GPU 1, never 3."""
    kube.api.create("nodes", node("n0", gpus=4))
    for k in range(4):
        p = pod(f"low-{k}", gpus=1, node="n0", annotations={"phalanx.io/gpu-devices": str(k)})
        kube.create(p)
        kube.run_pod(f"low-{k}", started_s_ago=600)
    kube.force_delete_pod("low-1")
    kube.api.delete("pods", "low-3", "default", grace=300)
    assert _terminating(kube) == ["low-3"]
    with running(kube, profile="phalanx-queues"):
        kube.create(pod("new", gpus=1))
        wait_for("the new pod bound", lambda: kube.node_of("new") == "n0", timeout=20)
        assert _gpus(kube, "new") == "1"
        kube.force_delete_pod("low-3")


BUDGET_2 = {
    "name": "budget-2",
    "tie_break": "name",
    "actions": [{"name": "allocate"}, {"name": "reclaim", "args": {"budget": {"cluster": 2}}}],
    "order": [{"name": "priority"}],
    "admission": [{"name": "quota"}],
    "queue_order": {"name": "fairshare"},
}


def test_a_new_leader_counts_the_evictions_of_the_one_gone_a_second_after_them(
    kube: Kube, tmp_path: Path
) -> None:
    """The attained service (with the repeat guard's memory and the budgets' hour) was saved every
    60 s: a leader killed in between took its evictions with it, and the next one evicted afresh.
    It is now saved within a second of a cycle that evicted."""
    prof = tmp_path / "profile.yaml"
    prof.write_text(yaml.safe_dump(BUDGET_2))
    kube.ensure_namespace("phalanx-system")
    kube.api.create("nodes", node("n0", gpus=8))
    kube.create(queue("qa", 4))
    kube.create(queue("qb", 4))
    for k in range(8):  # qb borrows qa's half
        kube.create(pod(f"b-{k}", gpus=1, annotations={"phalanx.io/queue": "qb"}))
    with running(kube, profile=str(prof)):
        wait_for("qb's pods bound", lambda: all(kube.node_of(f"b-{k}") for k in range(8)), timeout=20)
        for k in range(8):
            kube.run_pod(f"b-{k}", started_s_ago=600)
        for k in range(4):
            kube.create(pod(f"a-{k}", gpus=1, annotations={"phalanx.io/queue": "qa"}))
        gone = wait_for("two reclaimed", lambda: _terminating(kube) if len(_terminating(kube)) >= 2 else None)
        for name in gone:
            kube.force_delete_pod(name)  # what their kubelet would confirm
        time.sleep(1.5)  # the leader saves what it evicted within a second, then is gone
    with running(kube, profile=str(prof)) as heir:
        wait_for("the new leader's first cycles", lambda: (heir.service_loaded and heir.cycles >= 1) or None)
        time.sleep(2.0)  # its first cycles would have reclaimed at once
        assert _terminating(kube) == [], "the new leader's budget forgot the evictions of the last"
        assert sorted(r[1] for r in heir.repeats.recent) == [f"default/{n}" for n in gone]
        # what each eviction lost (its GPU since it started) was saved and read back with it
        assert all(r[3] > 0 for r in heir.repeats.recent), heir.repeats.recent
        bound = sorted(n for n in ("a-0", "a-1", "a-2", "a-3") if kube.node_of(n))
        assert len(bound) == 2, bound


COST_RULE = BUDGET_2 | {
    "name": "cost-rule",
    "actions": [
        {"name": "allocate"},
        {"name": "reclaim", "args": {"owed": "fair", "max_loss_per_gpu": 3600}},
    ],
}


def test_a_reclaim_that_would_lose_more_than_it_gives_is_a_warning_naming_the_loss(
    kube: Kube, tmp_path: Path
) -> None:
    """qa holds its deserved GPU and asks one more (fair-share surplus, qc idle); qb's pods have run
    two hours without a checkpoint: reclaiming one would lose 2 GPU-h for 1 GPU, so nothing is
    evicted and the waiting pod gets a FailedScheduling warning that says so."""
    prof = tmp_path / "profile.yaml"
    prof.write_text(yaml.safe_dump(COST_RULE))
    kube.ensure_namespace("phalanx-system")
    kube.api.create("nodes", node("n0", gpus=6))
    for name, gpus in (("qa", 1), ("qb", 1), ("qc", 4)):
        kube.create(queue(name, gpus))
    kube.create(pod("a-run", gpus=1, annotations={"phalanx.io/queue": "qa"}))
    for k in range(5):
        kube.create(pod(f"b-{k}", gpus=1, annotations={"phalanx.io/queue": "qb"}))
    with running(kube, profile=str(prof)):
        everyone = ["a-run", *(f"b-{k}" for k in range(5))]
        wait_for("the pods bound", lambda: all(kube.node_of(n) for n in everyone), timeout=20)
        for n in everyone:
            kube.run_pod(n, started_s_ago=7200)
        kube.create(pod("a-ask", gpus=1, annotations={"phalanx.io/queue": "qa"}))

        def warned() -> list[str] | None:
            said = [
                m for t, r, m in typed_events(kube, "a-ask") if r == "FailedScheduling" and t == "Warning"
            ]
            return [m for m in said if "would lose" in m] or None

        said = wait_for("the cost warning", warned, timeout=20)
        assert "evicting default/b-0 would lose 2.00 GPU-h for 1 GPU" in said[0], said
        assert "max_loss_per_gpu" in said[0], said
        time.sleep(2.0)  # ten cycles' time at 0.2 s: still nothing evicted
        assert _terminating(kube) == [] and not kube.node_of("a-ask")
