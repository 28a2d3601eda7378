"""Cheap evictions and no thrash (issue 26): the checkpoint window and the repeat guard.

The lost work is the replay's own account (work since the run's last checkpoint, every
300 s from its start), not the scheduler's estimate: the figures below are worked out by hand.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import default_profile_data
from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import CHECKPOINT, REPEAT
from phalanx.core.model import Gpu, Node
from phalanx.core.profile import Profile
from phalanx.core.queues import Queue, QueueTree, ResourceQuota
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import compile_profile
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import replay

HOUR = 3600.0


def queues_profile(reclaim: dict[str, object], preempt: dict[str, object] | None = None) -> Profile:
    """The built-in phalanx-queues without its victim guards, its hysteresis and the reservation's
    wait, then with these reclaim (and preempt) arguments."""
    data = default_profile_data()
    off = {"checkpoint_window": 0, "repeat_window": 0}
    for a in data["actions"]:
        if a["name"] == "reclaim":
            a["args"].update(off | {"margin": 0.0} | reclaim)
        if a["name"] == "preempt":
            a["args"].update(off | (preempt or {}))
        if a["name"] == "reserve":
            a["args"]["min_wait"] = 0
    data["order"][1]["args"]["thresholds"] = [3600, 36000]
    return compile_profile(data, "test profile")


def node(gpus: int) -> list[Node]:
    return [Node("n0", 64_000, 512 * 1024, tuple(Gpu(j, "V100", 16384) for j in range(gpus)))]


def two_teams() -> QueueTree:
    q = {"gpu": ResourceQuota(2000)}
    return QueueTree([Queue("a", quotas=q), Queue("b", quotas=q)])


def evictions(profile: Profile, jobs: list[JobSpec], gpus: int = 4) -> list[dict[str, Any]]:
    log = io.StringIO()
    res = replay(node(gpus), jobs, profile, queues=two_teams(), log=log, check=True)
    assert res.summary()["completed"] == len(jobs)
    return [d for d in map(json.loads, log.getvalue().splitlines()) if d["kind"] == "evict"]


def preemptor(reason: str) -> str:
    m = re.search(r"(?:preempted by|for) (\S+)", reason)
    assert m is not None, reason  # every eviction names the workload it makes room for
    return m.group(1)


def repeats(evicted: list[dict[str, Any]], gpus: dict[str, int], window: float) -> list[object]:
    """Workloads evicted twice within `window` for preemptors of the same shape (GPUs of one task)."""
    last: dict[tuple[str, int], float] = {}
    out = []
    for t, victim, by in sorted(
        {(float(e["t"]), str(e["workload"]), preemptor(str(e["reason"]))) for e in evicted}
    ):
        key = (victim, gpus[by])
        if key in last and t - last[key] < window:
            out.append((victim, by, last[key], t))
        last[key] = t
    return out


def test_reclaim_waits_for_the_victims_checkpoint_and_loses_a_second_of_work() -> None:
    jobs = [
        JobSpec("a1", 0.0, 6000.0, 2, queue="a"),
        JobSpec("a2", 0.0, 6000.0, 2, queue="a"),
        JobSpec("b1", 4300.0, 6000.0, 2, queue="b"),
    ]
    now = replay(node(4), jobs, queues_profile({}), queues=two_teams())
    assert now.summary()["lost_gpu_h_preempt"] == pytest.approx(2 * 100 / HOUR)  # 4,300 - 4,200 s
    waits = replay(node(4), jobs, queues_profile({"checkpoint_window": 30}), queues=two_teams())
    s = waits.summary()
    # b1 waits for the next checkpoint at 4,500 s; the eviction a second later loses 1 s x 2 GPUs
    assert s["evictions"] == 1 and s["lost_gpu_h_preempt"] == pytest.approx(2 * 1 / HOUR)
    b1 = next(j for j in waits.jobs if j.spec.name == "b1")
    assert b1.wait == pytest.approx(201.0)
    victim = next(j for j in waits.jobs if j.evictions)
    assert victim.end == pytest.approx(6000.0 + 1500.0)  # kept 4,500 s of work, 1,500 s left


def test_the_pending_workload_is_told_when_the_checkpoint_comes() -> None:
    profile = queues_profile({"checkpoint_window": 30})
    snap = Snapshot(node(4), queues=two_teams())
    for name in ("a1", "a2"):
        snap.add_workload(JobSpec(name, 0.0, 6000.0, 2, queue="a").workload(300.0))
    run_cycle(snap, profile, 0.0, np.random.default_rng(0), apply=True)
    snap.add_workload(JobSpec("b1", 4300.0, 6000.0, 2, queue="b").workload(300.0))
    result = run_cycle(snap, profile, 4300.0, np.random.default_rng(0))
    assert not result.evictions
    (pending,) = [p for p in result.pending if p.workload == "b1"]
    held = [h for h in pending.holds if h.guard == CHECKPOINT]
    assert held and all(h.until == pytest.approx(4501.0) for h in held)
    assert "just after a checkpoint (window 30 s)" in pending.message
    later = run_cycle(snap, profile, 4501.0, np.random.default_rng(0))
    assert later.evictions and {e.by for e in later.evictions} == {"b1"}


def test_higher_priority_does_not_wait_for_the_checkpoint() -> None:
    jobs = [
        JobSpec("a1", 0.0, 6000.0, 4, queue="a"),
        JobSpec("a2", 4300.0, 600.0, 4, queue="a", priority=100),
    ]
    res = replay(node(4), jobs, queues_profile({}, {"checkpoint_window": 30}), queues=two_teams())
    a2 = next(j for j in res.jobs if j.spec.name == "a2")
    assert a2.wait == 0.0
    assert res.summary()["lost_gpu_h_preempt"] == pytest.approx(4 * 100 / HOUR)


# two queues take turns: queue b reclaims a1 at 5,800 s (for b3), the GPUs go back to queue a,
# and b reclaims a1 again at 7,400 s for b0 of the same shape (found by a search over small traces)
TURNS = [
    ("a0", 1100, 15000, 4),
    ("a1", 1400, 12900, 1),
    ("a2", 1700, 15200, 4),
    ("a3", 5600, 13100, 2),
    ("a4", 6000, 5700, 2),
    ("b0", 7400, 17200, 1),
    ("b1", 6700, 10100, 2),
    ("b2", 5300, 1500, 1),
    ("b3", 5800, 9800, 1),
]


def turns() -> list[JobSpec]:
    return [JobSpec(n, float(t), float(d), g, queue=n[0]) for n, t, d, g in TURNS]


def slicing(repeat: float) -> Profile:
    args = {"min_runtime": 0, "repeat_window": repeat}
    return queues_profile(args, {"by": "order", "quantum": 600, "repeat_window": repeat})


def test_two_queues_taking_turns_are_stopped_by_the_repeat_window() -> None:
    gpus = {n: g for n, _, _, g in TURNS}
    before = repeats(evictions(slicing(0.0), turns()), gpus, HOUR)
    assert ("a1", "b0", 5800.0, 7400.0) in before
    after = evictions(slicing(HOUR), turns())
    assert after and repeats(after, gpus, HOUR) == []


def test_a_repeat_held_eviction_says_so() -> None:
    profile = slicing(HOUR)
    snap = Snapshot(node(4), queues=two_teams())
    snap.add_workload(JobSpec("a1", 0.0, 9000.0, 2, queue="a").workload(300.0))
    snap.add_workload(JobSpec("a0", 0.0, 9000.0, 2, queue="a", preemptible=False).workload(300.0))
    run_cycle(snap, profile, 0.0, np.random.default_rng(0), apply=True)
    snap.add_workload(JobSpec("b1", 100.0, 50.0, 2, queue="b").workload(300.0))
    first = run_cycle(snap, profile, 100.0, np.random.default_rng(0), apply=True)
    assert {(e.workload, e.by) for e in first.evictions} == {("a1", "b1")}
    assert "for b1" in first.evictions[0].reason
    snap.remove_workload("b1")
    run_cycle(snap, profile, 150.0, np.random.default_rng(0), apply=True)  # a1 runs again
    assert snap.workloads["a1"].is_ready
    snap.add_workload(JobSpec("b2", 900.0, 50.0, 2, queue="b").workload(300.0))
    again = run_cycle(snap, profile, 900.0, np.random.default_rng(0))
    assert not again.evictions
    (pending,) = [p for p in again.pending if p.workload == "b2"]
    assert [(h.guard, h.victim) for h in pending.holds] == [(REPEAT, "a1")]
    assert pending.holds[0].until == pytest.approx(100.0 + HOUR)
    assert "evicted for a workload of this shape less than 3600 s ago" in pending.message
    # another shape is not held back by it
    snap.add_workload(JobSpec("b3", 900.0, 50.0, 2, queue="b", cpu_milli=2000).workload(300.0))
    snap.remove_workload("b2")
    other = run_cycle(snap, profile, 900.0, np.random.default_rng(0))
    assert {(e.workload, e.by) for e in other.evictions} == {("a1", "b3")}


jobs_st = st.lists(
    st.tuples(
        st.sampled_from("ab"),
        st.integers(0, 80).map(lambda k: k * 100.0),
        st.integers(10, 200).map(lambda k: k * 100.0),
        st.sampled_from([1, 2, 4]),
    ),
    min_size=3,
    max_size=9,
)


@settings(max_examples=25, deadline=None)
@given(jobs_st)
def test_no_workload_is_evicted_twice_for_one_shape_within_the_window(
    specs: list[tuple[str, float, float, int]],
) -> None:
    jobs = [JobSpec(f"{q}{k}", t, d, g, queue=q) for k, (q, t, d, g) in enumerate(specs)]
    gpus = {j.name: j.gpus for j in jobs}
    assert repeats(evictions(slicing(HOUR), jobs), gpus, HOUR) == []


def test_victims_are_held_until_their_checkpoints_line_up() -> None:
    from phalanx.actions.holds import aligned, as_victim
    from phalanx.core.session import Session

    profile = queues_profile({})
    snap = Snapshot(node(4), queues=two_teams())
    for name, at in (("a1", 0.0), ("a2", 5.0), ("a3", 100.0)):
        snap.add_workload(JobSpec(name, at, 9000.0, 1, queue="a").workload(300.0))
        run_cycle(snap, profile, at, np.random.default_rng(0), apply=True)
    session = Session(snap, profile, 150.0, np.random.default_rng(0))
    a1, a2, a3 = (as_victim(session, snap.workloads[n]) for n in ("a1", "a2", "a3"))
    # checkpoints at 300 / 305 s: both within 10 s of one at 306 s (1 s after a2's)
    assert aligned(150.0, 150.0, [a1, a2], 10.0) == pytest.approx(306.0)
    assert aligned(150.0, 150.0, [a1, a3], 10.0) is None  # 100 s apart: never within 10 s
    # with a 120 s window: at 401 s a1 is 101 s past its checkpoint at 300, a3 1 s past 400
    assert aligned(150.0, 150.0, [a1, a3], 120.0) == pytest.approx(401.0)
    session.close()


def test_a_reported_checkpoint_sets_the_phase_of_the_guard_and_of_the_lost_work() -> None:
    """`Workload.last_checkpoint` (Kubernetes: `phalanx.io/last-checkpoint`): checkpoints count
    from the reported one, not from the bind, for the window and for the work an eviction loses."""
    from dataclasses import replace

    from phalanx.actions.evict import lost_work, since_checkpoint
    from phalanx.core.session import Session

    profile = queues_profile({"checkpoint_window": 30})
    # bind at 0, interval 300: checkpoints at 4,200 and 4,500 by the bind's clock, and b1 comes at 4,300
    for last, now_ago, due in ((None, 100.0, 4501.0), (4290.0, 10.0, None), (4100.0, 200.0, 4401.0)):
        snap = Snapshot(node(4), queues=two_teams())
        for name in ("a1", "a2"):
            w = JobSpec(name, 0.0, 6000.0, 2, queue="a").workload(300.0)
            snap.add_workload(replace(w, last_checkpoint=last))
        run_cycle(snap, profile, 0.0, np.random.default_rng(0), apply=True)
        a1 = snap.workloads["a1"]
        assert since_checkpoint(4300.0, a1) == pytest.approx(now_ago)
        session = Session(snap, profile, 4300.0, np.random.default_rng(0))
        assert lost_work(session, a1, tuple(a1.bound.values())) == pytest.approx(2 * now_ago)
        session.close()
        snap.add_workload(JobSpec("b1", 4300.0, 6000.0, 2, queue="b").workload(300.0))
        result = run_cycle(snap, profile, 4300.0, np.random.default_rng(0))
        if due is None:  # just past the reported checkpoint: reclaimed at once
            assert {e.by for e in result.evictions} == {"b1"}
        else:
            assert not result.evictions
            (pending,) = [p for p in result.pending if p.workload == "b1"]
            held = [h.until for h in pending.holds if h.guard == CHECKPOINT]
            assert held and all(u == pytest.approx(due) for u in held), (last, held)


def test_a_reported_checkpoint_from_before_the_run_or_far_in_the_future_is_not_believed() -> None:
    """Bound at 0, interval 300, now 4,300 s: by the bind's clock 100 s since a checkpoint."""
    from dataclasses import replace

    from phalanx.actions.evict import REPORT_SKEW_S, lost_work, since_checkpoint
    from phalanx.core.session import Session

    profile = queues_profile({})
    cases = (
        (-50.0, 100.0),  # before the bind: from an earlier run, the bind counts
        (4300.0 + REPORT_SKEW_S / 2, 0.0),  # a little ahead (clocks differ): now
        (4300.0 + 9 * HOUR, 100.0),  # hours ahead (local time written as UTC): not believed
        (100.0, 0.0),  # long overdue: taken to checkpoint every interval since (4,300 = 100 + 14 x 300)
    )
    for last, ago in cases:
        snap = Snapshot(node(4))
        snap.add_workload(replace(JobSpec("a1", 0.0, 6000.0, 2).workload(300.0), last_checkpoint=last))
        run_cycle(snap, profile, 0.0, np.random.default_rng(0), apply=True)
        a1 = snap.workloads["a1"]
        assert since_checkpoint(4300.0, a1) == pytest.approx(ago), last
        session = Session(snap, profile, 4300.0, np.random.default_rng(0))
        assert lost_work(session, a1, tuple(a1.bound.values())) == pytest.approx(2 * ago), last
        session.close()
