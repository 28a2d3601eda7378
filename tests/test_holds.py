"""Guards that hold back a preemption or reclaim are named, with the time each ends, and the forecast
uses them (issue 27): min_runtime, quantum, not preemptible, victims still terminating."""

from __future__ import annotations

import numpy as np

from builders import Scenario, make_node, make_workload
from phalanx.actions import holds as holds_module
from phalanx.actions.whatif import fits_now_if
from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import MIN_RUNTIME, NOT_PREEMPTIBLE, QUANTUM, TERMINATING
from phalanx.core.forecast import forecast
from phalanx.core.queues import Queue, QueueTree, ResourceQuota
from phalanx.core.snapshot import ForeignUsage, Snapshot
from phalanx.profiles import compile_profile, load_profile


def preempting(min_runtime: float = 600.0, **args: object) -> object:
    return compile_profile(
        {
            "name": "p",
            "tie_break": "name",
            "actions": [
                {"name": "allocate"},
                {"name": "preempt", "args": {"min_runtime": min_runtime, **args}},
            ],
            "order": [{"name": "priority"}],
        }
    )


def node(gpus: int = 2):
    return make_node("n").cpu(64).memory("256Gi").gpus(gpus).build()


def filled(prof, *low, gpus: int = 2) -> Scenario:
    """`low` running from t=1 on a node of `gpus` GPUs, each of one GPU."""
    sc = Scenario([node(gpus)], [], profile=prof)
    for w in low:
        sc.add(w)
    sc.cycle()
    assert all(sc.bound(w.name) == 1 for w in low)
    return sc


def low(name: str, **kw: object):
    b = make_workload(name).podset("p", gpu=1).priority(100)
    for k, v in kw.items():
        b = getattr(b, k)(v)
    return b.build()


def gang(name: str = "train", tasks: int = 2, priority: int = 1000, created: float = 100.0):
    return make_workload(name).podset("p", tasks, gpu=1).priority(priority).created(created).build()


def test_min_runtime_is_named_with_the_victims_and_when_it_ends_and_the_forecast_starts_then():
    """The case of the issue: priority-1000 gang, two priority-100 victims not 10 minutes old."""
    prof = preempting(600)
    sc = filled(prof, low("low-0"), low("low-1"))
    sc.clock = 99.0
    sc.add(gang())
    r = sc.cycle()  # t = 100
    assert not r.evictions
    p = r.pending_for("train")
    assert p is not None
    assert {(h.guard, h.victim, h.until) for h in p.holds} == {
        (MIN_RUNTIME, "low-0", 601.0),
        (MIN_RUNTIME, "low-1", 601.0),
    }
    assert (
        "preempt: min_runtime 600 s protects low-0 (priority 100), low-1 (priority 100) until t=601 s; "
        "they may be preempted then"
    ) in p.message
    # no run-time estimates at all: the guard's end is what is known
    f = forecast(sc.snapshot, prof, sc.clock)
    assert f.starts == {"train": 601.0}
    assert f.because["train"] == "when low-0, low-1 may be preempted"
    # and at t=601 the scheduler does what the forecast said
    sc.clock = 600.0
    r = sc.cycle()
    assert sorted(e.workload for e in r.evictions) == ["low-0", "low-1"] and sc.bound("train") == 2
    assert {e.by for e in r.evictions} == {"train"}


def test_the_later_guard_wins_and_a_guard_that_frees_nothing_useful_is_not_named():
    prof = preempting(600)
    sc = filled(prof, low("low-0"), gpus=2)  # one GPU free
    sc.clock = 299.0
    sc.add(low("low-1"))
    sc.cycle()  # t = 300: low-1 starts later, so it is protected until 900
    sc.add(gang(tasks=2, created=300.0))
    r = sc.cycle()
    p = r.pending_for("train")
    assert p is not None and {h.until for h in p.holds} == {601.0, 900.0}
    f = forecast(sc.snapshot, prof, sc.clock)
    assert f.starts == {"train": 900.0} and f.because["train"] == "when low-1 may be preempted"
    # one task of 1 GPU: one victim is enough, the one whose guard ends first
    sc2 = filled(prof, low("low-0"), low("low-1"))
    sc2.add(gang("one", tasks=1))
    p2 = sc2.cycle().pending_for("one")
    assert p2 is not None and len(p2.holds) == 1 and p2.holds[0].guard == MIN_RUNTIME
    # "fits now if" names a victim the scheduler holds back only with the guard and its end
    (said,) = fits_now_if(sc2.snapshot, prof, sc2.clock, "one")
    assert said == (
        f"fits now if workload {p2.holds[0].victim} (priority 100) is preempted, "
        "which the profile's preempt holds back (min_runtime until t=601 s)"
    )


def test_the_quantum_of_time_slicing_is_named_and_forecast():
    prof = compile_profile(
        {
            "name": "slices",
            "tie_break": "name",
            "actions": [
                {"name": "allocate"},
                {
                    "name": "preempt",
                    "args": {"by": "order", "quantum": 1000, "order_victims": "checkpointed"},
                },
            ],
            "order": [{"name": "priority"}, {"name": "las", "args": {"thresholds": [100]}}],
        }
    )
    sc = filled(prof, low("long", checkpoints=60))
    sc.snapshot.workloads["long"].attained = 500.0  # above the first LAS level: the newcomer is ahead of it
    sc.clock = 199.0
    sc.add(make_workload("short").podset("p", 2, gpu=1).priority(100).created(199).build())
    p = sc.cycle().pending_for("short")
    assert p is not None
    (h,) = p.holds
    assert (h.guard, h.victim, h.until, h.limit) == (QUANTUM, "long", 1001.0, 1000.0)
    assert "the time slice (quantum 1000 s) protects long (priority 100) until t=1,001 s" in p.message


def test_a_victim_that_is_not_preemptible_is_named_with_its_expected_end():
    prof = preempting(0)
    sc = filled(prof, low("keep", preemptible=False, runtime=3600), low("keep-2", preemptible=False))
    sc.add(gang())
    p = sc.cycle().pending_for("train")
    assert p is not None
    by = {h.victim: h for h in p.holds}
    assert by["keep"].guard == NOT_PREEMPTIBLE and by["keep"].until == 3601.0
    assert by["keep-2"].until is None
    assert "keep (priority 100) is not preemptible; expected to end around t=3,601 s" in p.message
    assert "keep-2 (priority 100) is not preemptible; no known end (no run-time estimate)" in p.message
    # a victim without an estimate never ends in the forecast: it says so rather than guess
    f = forecast(sc.snapshot, prof, sc.clock)
    assert "train" not in f.starts and "keep-2" in f.unknown["train"]


def test_reclaim_names_its_minimum_runtime():
    gpu = {"gpu": ResourceQuota(1000)}
    tree = QueueTree([Queue("a", quotas=dict(gpu)), Queue("b", quotas=dict(gpu))])
    prof = compile_profile(
        {
            "name": "r",
            "tie_break": "name",
            "actions": [{"name": "allocate"}, {"name": "reclaim", "args": {"min_runtime": 3600}}],
            "order": [{"name": "priority"}],
            "admission": [{"name": "quota"}],
            "queue_order": {"name": "fairshare"},
        }
    )
    sc = Scenario([node(2)], [], profile=prof)
    sc.snapshot = Snapshot(sc.nodes, queues=tree)
    for k in range(2):
        sc.add(make_workload(f"b-{k}").podset("p", gpu=1).queue("b").build())
    sc.cycle()  # b borrows a's GPU
    sc.add(make_workload("a-0").podset("p", gpu=1).queue("a").created(5).build())
    p = sc.cycle().pending_for("a-0")
    assert p is not None
    (h,) = p.holds
    assert (h.action, h.guard, h.until) == ("reclaim", MIN_RUNTIME, 3601.0)
    assert h.victim in ("b-0", "b-1") and "(queue b)" in p.message and "may be reclaimed then" in p.message
    f = forecast(sc.snapshot, prof, sc.clock)
    assert f.starts == {"a-0": 3601.0} and "may be reclaimed" in f.because["a-0"]


def test_victims_still_terminating_are_waited_for_and_the_forecast_never_says_it_does_not_fit():
    """The issue's second half: the victims were just preempted and still terminate (the adapter
    counts them as usage that is going away); the gang fits the empty cluster twice over."""
    prof = load_profile("phalanx-queues")
    s = Snapshot([make_node("n0").cpu(64).memory("256Gi").gpus(4).build()])
    for k, ends in enumerate((1030.0, 990.0)):  # one inside its grace period, one past it
        s.add_foreign(ForeignUsage("n0", 1000, 1024, (2 * k, 2 * k + 1), 1000, f"default/low-{k}", ends))
    s.add_workload(make_workload("default/train4").podset("p", 4, gpu=1).created(1000).build())
    r = run_cycle(s, prof, 1000.0, np.random.default_rng(0), apply=True)
    p = r.pending_for("default/train4")
    assert p is not None
    assert {(h.guard, h.victim, h.until) for h in p.holds} == {
        (TERMINATING, "default/low-0", 1030.0),
        (TERMINATING, "default/low-1", 990.0),
    }
    assert "waits for default/low-0 to terminate (grace period until t=1,030 s)" in p.message
    f = forecast(s, prof, 1000.0)
    assert f.starts["default/train4"] == 1030.0
    assert f.because["default/train4"] == "when default/low-0 has terminated"
    assert "does not fit" not in " ".join(f.unknown.values())
    assert s.foreign_gpu_milli == 4000 and len(s.leaving) == 2  # the forecast left the snapshot as it was


def test_a_workload_that_never_starts_is_told_why_from_its_last_try():
    prof = load_profile("phalanx")
    s = Snapshot([make_node("n0").cpu(64).memory("256Gi").gpus(4).build()])
    s.add_foreign(ForeignUsage("n0", 0, 0, (0, 1), 1000, "other/pod"))  # another scheduler's, no end
    s.add_workload(make_workload("fits-empty").podset("p", 4, gpu=1).build())
    s.add_workload(make_workload("too-big").podset("p", 8, gpu=1).build())
    run_cycle(s, prof, 0.0, np.random.default_rng(0), apply=True)
    f = forecast(s, prof, 0.0)
    assert f.unknown["fits-empty"].startswith(
        "does not start while pods Phalanx does not schedule hold 2 GPU(s), which it cannot see end: "
    )
    # without the foreign pod, "does not fit" is said only of what does not fit the empty cluster
    e = Snapshot([make_node("n0").cpu(64).memory("256Gi").gpus(4).build()])
    e.add_workload(make_workload("too-big").podset("p", 8, gpu=1).build())
    run_cycle(e, prof, 0.0, np.random.default_rng(0), apply=True)
    g = forecast(e, prof, 0.0)
    assert g.unknown["too-big"].startswith(
        "does not fit even when everything running has ended: 8 tasks of 1 GPU each, all at once: "
    )


def test_working_out_holds_changes_no_decision(monkeypatch):
    def run() -> list[object]:
        prof = preempting(50)
        sc = filled(prof, low("low-0"), low("low-1"), low("low-2"), gpus=3)
        log = []
        for t in range(20):
            if t % 4 == 0:
                sc.add(gang(f"g{t}", tasks=1 + t % 3, priority=1000 + t, created=float(t)))
            r = sc.cycle()
            log.append(([(b.task, b.node, b.gpus) for b in r.binds], sorted(e.task for e in r.evictions)))
            sc.clock += 9.0
        return log

    with_holds = run()
    monkeypatch.setattr(holds_module, "MAX_PER_CYCLE", 0)
    assert run() == with_holds
    assert any(evicted for _, evicted in with_holds)
