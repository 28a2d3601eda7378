"""The core's wake-up (issue 34): a cycle says when the clock alone may change its answer, and the
rank changes it keeps across cycles equal the ones worked out from every running workload."""

from __future__ import annotations

import numpy as np
import pytest

from builders import Scenario, make_node, make_workload
from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import MIN_RUNTIME
from phalanx.core.snapshot import Snapshot
from phalanx.core.traits import change_forecasts
from phalanx.core.wake import RankWakes
from phalanx.k8s.read.world import serve
from phalanx.profiles import compile_profile, load_profile
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import replay


def profile(actions: list[dict], order: list[dict] | None = None):
    return compile_profile(
        {"name": "w", "tie_break": "name", "actions": actions, "order": order or [{"name": "priority"}]}
    )


def node(gpus: int = 2):
    return make_node("n").cpu(64).memory("256Gi").gpus(gpus).build()


def one_gpu(name: str, priority: int = 100, created: float = 0.0):
    return make_workload(name).podset("p", gpu=1).priority(priority).created(created).build()


def test_a_guard_s_end_is_the_wake_and_the_cycle_then_preempts():
    prof = profile([{"name": "allocate"}, {"name": "preempt", "args": {"min_runtime": 600}}])
    sc = Scenario([node(1)], [one_gpu("low")], profile=prof)
    first = sc.cycle()  # t = 1: low runs
    assert first.binds and first.wake is None  # nothing waits
    sc.add(one_gpu("high", priority=1000, created=50.0))
    sc.clock = 99.0
    r = sc.cycle()  # t = 100
    assert not r.evictions and r.wake is not None
    assert r.wake.at == 601.0 and MIN_RUNTIME in r.wake.why and "low" in r.wake.why
    sc.clock = r.wake.at - 1
    assert [e.workload for e in sc.cycle().evictions] == ["low"]


def test_work_that_waits_for_capacity_has_no_wake():
    sc = Scenario([node(2)], [make_workload("big").podset("p", 4, gpu=1).build()], profile="phalanx")
    r = sc.cycle()
    assert r.pending and r.wake is None


def test_reserve_min_wait_wakes_when_the_head_has_waited():
    prof = profile([{"name": "reserve", "args": {"min_gpus": 2, "min_wait": 300}}, {"name": "allocate"}])
    sc = Scenario([node(2)], [one_gpu("small")], profile=prof)
    sc.cycle()
    sc.add(make_workload("big").podset("p", 2, gpu=1).created(10.0).build())
    r = sc.cycle()
    assert r.wake is not None and r.wake.at == 310.0 and "min_wait" in r.wake.why
    sc.clock = 400.0
    assert sc.cycle().wake is None  # waited long enough: the reservation is made, no clock left


def test_a_las_level_crossing_wakes_only_while_something_waits():
    prof = profile([{"name": "allocate"}], order=[{"name": "las", "args": {"thresholds": [100.0]}}])
    sc = Scenario([node(1)], [one_gpu("run")], profile=prof)
    sc.cycle()
    sc.snapshot.advance(1.0)
    sc.snapshot.advance(41.0)  # 40 GPU-seconds received
    sc.clock = 40.0
    assert sc.cycle().wake is None  # t = 41, nothing waits: a rank change moves nothing
    sc.add(one_gpu("wait"))
    r = sc.cycle()  # t = 42: 60 GPU-seconds to the level at 100
    assert r.wake is not None and r.wake.at == pytest.approx(102.0) and "run" in r.wake.why


@pytest.mark.parametrize("seed", range(8))
def test_kept_rank_changes_equal_a_scratch_look_at_every_running_workload(seed: int):
    """The adapter's way: runs read from the snapshot's clock (`serve`), binds and evictions between
    cycles, service added by the driver; the kept heap says what a new one built from scratch says."""
    rng = np.random.default_rng(seed)
    prof = load_profile("las")
    forecasts = change_forecasts(prof.order)
    nodes = [make_node(f"n{i}").cpu(64).memory("256Gi").gpus(4).build() for i in range(4)]
    snap = Snapshot(nodes, [make_workload("never").podset("p", 8, gpu=4).build()])  # always waits
    now, made, ranked = 0.0, 0, 0
    for _ in range(40):
        now += float(rng.integers(1, 4000))
        for _ in range(int(rng.integers(0, 4))):
            gpus = int(rng.integers(1, 3))
            snap.add_workload(make_workload(f"w{made}").podset("p", gpu=gpus).created(now).build())
            made += 1
        if rng.random() < 0.3 and snap.running:
            snap.remove_workload(str(rng.choice(sorted(snap.running))))
        if rng.random() < 0.3 and snap.running:
            name = str(rng.choice(sorted(snap.running)))
            snap.workloads[name].attained_base += float(rng.integers(1, 3000))  # an earlier run's
            snap.ranks_moved.add(name)
        serve(snap, now)
        result = run_cycle(snap, prof, now, rng, apply=True)
        want = RankWakes().earliest(snap, forecasts, now)  # from every running workload
        if want is None:
            assert result.wake is None or "rank" not in result.wake.why
        else:
            assert result.wake is not None and result.wake.at <= want[0] + 1e-6
            if "rank" in result.wake.why:
                assert result.wake.at == pytest.approx(want[0], rel=1e-9)
                ranked += 1
        serve(snap, now)  # this cycle's binds start their runs on the clock
    assert made > 20 and ranked > 10 and snap.rank_wakes is not None
    assert snap.rank_wakes.epoch == snap.service_epoch == 0  # kept the whole time, never rebuilt


def test_service_a_driver_adds_moves_the_kept_rank_change():
    """A driver that adds an earlier run's service says so (`ranks_moved`): that run now crosses first."""
    prof = load_profile("las")  # levels at 3600 and 36000 GPU-seconds
    forecasts = change_forecasts(prof.order)
    snap = Snapshot([make_node("n").cpu(64).memory("256Gi").gpus(4).build()], [one_gpu("a"), one_gpu("b")])
    run_cycle(snap, prof, 0.0, np.random.default_rng(0), apply=True)
    serve(snap, 10.0)  # both run since t=0 on the snapshot's clock
    kept = RankWakes()
    assert kept.earliest(snap, forecasts, 10.0) == (pytest.approx(3600.0), "a")  # a tie: the first pushed
    serve(snap, 100.0)
    snap.workloads["b"].attained_base += 3000.0
    snap.ranks_moved.add("b")
    assert kept.earliest(snap, forecasts, 100.0) == (pytest.approx(600.0), "b")  # 3100 received by t=100
    assert RankWakes().earliest(snap, forecasts, 100.0) == (pytest.approx(600.0), "b")


def test_the_replay_cycles_at_a_guard_s_end_not_at_the_next_unrelated_event():
    """SRTF with min_runtime 60: a short job that arrives at t=5 behind a long one preempts it at
    t=60 (the long one's min_runtime ends), as the adapter's loop would; before the core's wake-up
    the replay waited for the next arrival or completion (here: t=1000)."""
    nodes = [make_node("n").cpu(64).memory("256Gi").gpus(1).build()]
    jobs = [JobSpec("long", 0.0, 1000.0, 1), JobSpec("short", 5.0, 10.0, 1)]
    out = replay(nodes, jobs, load_profile("srtf"))
    starts = {r.spec.name: r.start for r in out.jobs}
    assert starts == {"long": 0.0, "short": 60.0}
    assert out.evicted_tasks == 1
