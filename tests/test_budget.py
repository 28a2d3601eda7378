"""Eviction budgets (issue 40): at most N workloads of a queue, or M in the cluster, evicted an hour;
what a budget holds back is named with the time it frees, and the cycle after that time evicts."""

from __future__ import annotations

import json

import pytest

from builders import Scenario, make_node, make_workload, two_queues
from builders import reclaiming as reclaim_with
from phalanx.actions.budget import Budget
from phalanx.core.decisions import CLUSTER_BUDGET, CLUSTER_GPU_BUDGET, QUEUE_BUDGET, QUEUE_GPU_BUDGET
from phalanx.core.profile import Profile
from phalanx.profiles import compile_profile


def reclaiming(budget: dict[str, float], restart_s: float = 0.0) -> Profile:
    return reclaim_with({"budget": budget} | ({"restart_s": restart_s} if restart_s else {}))


def borrowed(prof: Profile, gang: int = 0, checkpoints: float = 0.0) -> Scenario:
    """Queue b runs 4 one-GPU jobs on 4 GPUs, 2 of them a's deserved share (checkpointing every
    `checkpoints` seconds); a then asks for 2: two one-GPU jobs, or one gang of `gang` tasks."""
    sc = two_queues(4, prof)
    for k in range(4):
        sc.add(make_workload(f"b-{k}").podset("p", gpu=1).queue("b").checkpoints(checkpoints).build())
    sc.cycle()
    assert sum(sc.bound(f"b-{k}") for k in range(4)) == 4
    if gang:
        sc.add(make_workload("a-gang").podset("p", gang, gpu=1).queue("a").build())
        return sc
    for k in range(2):
        sc.add(make_workload(f"a-{k}").podset("p", gpu=1).queue("a").created(5 + k).build())
    return sc


def evicted(result: object) -> set[str]:
    return {e.workload for e in result.evictions}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("budget", "guard"), [({"queue": 1}, QUEUE_BUDGET), ({"cluster": 1}, CLUSTER_BUDGET)]
)
def test_a_spent_budget_holds_the_next_eviction_for_an_hour_and_says_so(budget: dict[str, int], guard: str):
    prof = reclaiming(budget)
    sc = borrowed(prof)
    r = sc.cycle()
    first = sc.clock
    assert len(evicted(r)) == 1 and sc.bound("a-0") == 1  # one reclaimed: the budget's one an hour
    r = sc.cycle()  # a-1's turn (alike workloads take turns, one a cycle)
    assert not evicted(r)
    p = r.pending_for("a-1")
    assert p is not None and p.holds
    assert {h.guard for h in p.holds} == {guard}
    assert {h.until for h in p.holds} == {first + 3600.0}  # the first eviction ages out an hour later
    # nobody may be evicted (the cluster's budget, or that of b, the one queue over its share): one
    # hold, no what-if, no victim named
    assert [h.victim for h in p.holds] == [""], p.holds
    said = (
        "reclaim: the eviction budgets (1 an hour each) of queues b are spent until t="
        if guard == QUEUE_BUDGET
        else "reclaim: the cluster's eviction budget (1 an hour) is spent until t="
    )
    assert said in p.message, p.message
    assert r.wake is not None and r.wake.at == first + 3600.0  # the cycle looks again then
    sc.clock = first + 1800.0  # half an hour on: still held
    assert not evicted(sc.cycle())
    sc.clock = first + 3599.0  # the next cycle runs at the hour: the next eviction happens
    r = sc.cycle()
    assert len(evicted(r)) == 1 and sc.bound("a-1") == 1


def test_without_a_budget_the_next_cycle_reclaims_again():
    sc = borrowed(reclaiming({}))
    assert len(evicted(sc.cycle())) == 1
    assert len(evicted(sc.cycle())) == 1 and sc.bound("a-0") == sc.bound("a-1") == 1


def test_one_preemptor_needing_more_victims_than_the_budget_leaves_takes_none():
    """A gang of 2 needs two victims of queue b; the budget allows one: it evicts nobody."""
    sc = borrowed(reclaiming({"queue": 1}), gang=2)
    r = sc.cycle()
    assert not evicted(r)
    p = r.pending_for("a-gang")
    assert p is not None


def test_priority_preempts_past_the_budget_and_still_counts():
    """Priority preempts at once (a promise to inference): no budget holds it; its evictions count."""
    prof = compile_profile(
        {
            "name": "p",
            "tie_break": "name",
            "actions": [{"name": "allocate"}, {"name": "preempt", "args": {"budget": {"queue": 1}}}],
            "order": [{"name": "priority"}],
        }
    )
    node = make_node("n").cpu(64).memory("256Gi").gpus(2).build()
    sc = Scenario([node], [], profile=prof)
    for k in range(2):
        sc.add(make_workload(f"low-{k}").podset("p", gpu=1).priority(100).build())
    sc.cycle()
    sc.add(make_workload("high").podset("p", 2, gpu=1).priority(1000).build())
    r = sc.cycle()
    assert evicted(r) == {"low-0", "low-1"} and sc.bound("high") == 2
    assert [r[1] for r in sc.snapshot.recent_evictions(sc.clock)] == ["low-0", "low-1"]


def test_a_wrong_budget_is_refused_with_what_is_wrong():
    assert Budget.parse({"queue": 6, "cluster": 30}) == Budget(6, 30)
    assert Budget.parse({"cluster_gpu_hours": 1.5, "queue_gpu_hours": 2}) == Budget(0, 0, 2.0, 1.5)
    assert not Budget.parse(None).on and Budget.parse({"queue_gpu_hours": 1}).by_cost
    for bad, says in (
        ({"queues": 1}, "unknown key 'queues'"),
        ({"cluster_gpu_hours": -1}, "budget.cluster_gpu_hours must be a number of GPU-hours"),
        ({"queue_gpu_hours": "5"}, "budget.queue_gpu_hours must be a number of GPU-hours"),
        ({"queue_gpu_hours": float("nan")}, "budget.queue_gpu_hours must be a number of GPU-hours"),
        ({"queue": -1}, "budget.queue must be a whole number"),
        ({"cluster": 1.5}, "budget.cluster must be a whole number"),
        ({"queue": True}, "budget.queue must be a whole number"),
        ([1], "budget must be a mapping"),
    ):
        with pytest.raises(ValueError, match=says):
            Budget.parse(bad)  # type: ignore[arg-type]


def test_the_hour_is_read_back_from_the_memory_a_restarted_scheduler_lends():
    """The adapter saves `evicted_for` (who was evicted when) across restarts and lends it to each
    cycle's snapshot: a new leader's budget counts the evictions its predecessor made."""
    prof = reclaiming({"queue": 1})
    sc = borrowed(prof)
    sc.snapshot.evicted_for = {
        "b-3": {("some", "shape"): sc.clock - 600.0},
        "b-2": {("x",): sc.clock - 4000.0},
    }
    sc.snapshot.seed_recent(sc.clock)
    assert [(w, q) for _, w, q, _ in sc.snapshot.recent_evictions(sc.clock)] == [
        ("b-3", "b")
    ]  # b-2's is too old
    r = sc.cycle()
    assert not evicted(r)
    p = r.pending_for("a-0")
    assert p is not None and {h.until for h in p.holds} == {sc.clock - 1 - 600.0 + 3600.0}


def test_the_hour_is_the_driver_s_own_record_and_outlives_snapshots_and_the_evicted_workloads():
    """Found on a full cluster under churn (633 reclaims in 30 min against 100 an hour): the hour was
    the snapshot's, so each snapshot built anew started it empty, and an eviction whose workload had
    gone (a Job's pod remade under another name) was never read back. The driver now keeps the
    record, lends it to each snapshot, and saves it across leaders as (when, workload, queue)."""

    from phalanx.k8s.loop.repeat_memory import RepeatMemory, recent_from_saved
    from phalanx.k8s.loop.service import AttainedService

    prof = reclaiming({"cluster": 1})
    repeats = RepeatMemory()
    sc = borrowed(prof)
    sc.snapshot.lend_recent(repeats.recent)
    assert len(evicted(sc.cycle())) == 1
    assert len(repeats.recent) == 1  # the cycle's eviction went to the driver's record
    # a snapshot built anew in which the evicted workload is gone: the hour still counts it
    q = repeats.recent[0][2]
    later = borrowed(prof)
    repeats.recent[0] = (later.clock - 60.0, "b-gone", q, 0.0)
    later.snapshot.lend_recent(repeats.recent)
    r = later.cycle()
    assert not evicted(r)
    p = r.pending_for("a-0")
    assert p is not None and {h.guard for h in p.holds} == {CLUSTER_BUDGET}
    # saved with the attained service and read back by a new leader
    svc = AttainedService()
    svc.recent = repeats.recent_saved(later.clock)
    back = AttainedService()
    back.load(json.loads(json.dumps(svc.to_dict())))
    heir = RepeatMemory()
    heir.read_back({}, back.recent)
    assert list(heir.recent) == list(repeats.recent)
    assert heir.recent_saved(later.clock + 3600.0) == []  # an hour later it no longer counts
    # a record saved before costs were kept reads with none; a cost that is not a number is refused
    assert recent_from_saved(
        [[1.0, "w", "q"], ["x", "w", "q"], [2.0, 3, "q"], "junk", [3.0, "v", "q", 7.5], [4.0, "u", "q", "x"]]
    ) == [(1.0, "w", "q", 0.0), (3.0, "v", "q", 7.5)]
    assert recent_from_saved({"not": "a list"}) == []


def test_reading_the_hour_at_a_later_clock_leaves_it_as_it_was():
    """A forecast plays the cycle at later clocks on the driver's own snapshot: reading the hour
    there pruned it, and the next cycle's budget found it empty."""
    sc = borrowed(reclaiming({"cluster": 1}))
    assert len(evicted(sc.cycle())) == 1
    assert sc.snapshot.recent_evictions(sc.clock + 7200.0) == []
    assert len(sc.snapshot.recent_evictions(sc.clock)) == 1


@pytest.mark.parametrize(
    ("budget", "guard"),
    [({"queue_gpu_hours": 1.5}, QUEUE_GPU_BUDGET), ({"cluster_gpu_hours": 1.5}, CLUSTER_GPU_BUDGET)],
)
def test_a_gpu_hour_budget_counts_what_each_eviction_loses(budget: dict[str, float], guard: str):
    """Restarts of an hour's GPU time each (restart_s 3600 on one GPU) under a budget of 1.5 GPU-hours
    lost an hour: the first eviction (1 GPU-h and 1 GPU-s of work) fits, the second would take the
    hour to 2: held until the first ages out, and said in GPU-hours. The victims checkpoint every
    10 s, so an hour later the next one still loses little work."""
    sc = borrowed(reclaiming(budget, restart_s=3600.0), checkpoints=10.0)
    r = sc.cycle()
    first = sc.clock
    assert len(evicted(r)) == 1 and sc.bound("a-0") == 1
    assert {e.cost for e in r.evictions} == {3600.0 + 1.0}  # the restart and the second it ran
    assert [c for *_, c in sc.snapshot.recent_evictions(sc.clock)] == [3601.0]
    r = sc.cycle()
    assert not evicted(r)
    p = r.pending_for("a-1")
    assert p is not None and {h.guard for h in p.holds} == {guard}
    assert {h.until for h in p.holds} == {first + 3600.0}
    assert "GPU-hour budget" in p.message and "1.5 GPU-h lost an hour" in p.message, p.message
    assert r.wake is not None and r.wake.at == first + 3600.0
    sc.clock = first + 3599.0
    r = sc.cycle()
    assert len(evicted(r)) == 1 and sc.bound("a-1") == 1


def test_a_victim_that_alone_loses_more_than_the_budget_is_never_evicted_under_it():
    """2 GPU-hours of restart against a budget of 1.5 an hour: no eviction, and the reason says the
    victim alone would lose more than the budget, with no end (nothing that waits frees it)."""
    sc = borrowed(reclaiming({"queue_gpu_hours": 1.5}, restart_s=7200.0))
    r = sc.cycle()
    assert not evicted(r)
    p = r.pending_for("a-0")
    assert p is not None and p.holds and {h.guard for h in p.holds} == {QUEUE_GPU_BUDGET}
    assert {h.until for h in p.holds} == {None}
    assert "would lose more than that alone" in p.message, p.message
    sc.clock += 7200.0
    assert not evicted(sc.cycle())  # still: the longer it runs, the more it would lose


def test_without_checkpoints_a_victim_outgrows_a_gpu_hour_budget():
    """A victim that never checkpoints loses its whole run: once that passes the budget it is held
    for good (priority still preempts it), and the reason says why."""
    sc = borrowed(reclaiming({"queue_gpu_hours": 1.0}))
    sc.clock += 3600.0  # b's jobs have run an hour: each would lose 1 GPU-h and a little more
    r = sc.cycle()
    assert not evicted(r)
    p = r.pending_for("a-0")
    assert p is not None and "would lose more than that alone" in p.message, p.message


def test_an_eviction_budget_in_counts_ignores_costs_and_a_gpu_hour_one_ignores_counts():
    """Ten cheap evictions fit 1 GPU-hour; a count budget of 10 lets ten costly ones through."""
    cheap = borrowed(reclaiming({"cluster_gpu_hours": 1.0}))  # 1 GPU-s of lost work each
    assert len(evicted(cheap.cycle())) == 1 and len(evicted(cheap.cycle())) == 1
    costly = borrowed(reclaiming({"cluster": 10}, restart_s=36000.0))
    assert len(evicted(costly.cycle())) == 1 and len(evicted(costly.cycle())) == 1
