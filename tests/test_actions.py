"""Allocate order, backfill, optional tasks and the statement machinery."""

import numpy as np
import pytest

from builders import Scenario, make_node, make_workload
from phalanx.actions.allocate import Allocate
from phalanx.actions.backfill import Backfill
from phalanx.core.cycle import run_cycle
from phalanx.core.profile import Profile
from phalanx.core.session import Session
from phalanx.core.snapshot import Allocation, Snapshot
from phalanx.core.statement import Statement
from phalanx.plugins.order import PriorityOrder


def test_priority_then_age_order():
    nodes = [make_node("n").gpus(1).build()]
    wl = [
        make_workload("old-low").podset("p", gpu=1).created(0).build(),
        make_workload("new-high").podset("p", gpu=1).priority(5).created(9).build(),
        make_workload("new-low").podset("p", gpu=1).created(5).build(),
    ]
    sc = Scenario(nodes, wl)
    sc.run()
    assert sc.bound("new-high") == 1 and sc.bound("old-low") == 0


def test_strict_fifo_blocks_the_queue_and_backfill_fills_what_fits_now():
    nodes = [make_node("n").gpus(2).build()]
    wl = [
        make_workload("head").podset("p", gpu=4).created(0).build(),
        make_workload("small").podset("p", gpu=1).created(1).build(),
    ]
    strict = Profile("strict", [Allocate(strict_fifo=True)], order=[PriorityOrder()])
    sc = Scenario(nodes, wl, profile=strict)
    last = sc.run()
    assert sc.bound("small") == 0
    assert "waiting behind the head of queue" in last.pending_for("small").message
    with_backfill = Profile(
        "strict+backfill", [Allocate(strict_fifo=True), Backfill()], order=[PriorityOrder()]
    )
    sc = Scenario(nodes, wl, profile=with_backfill)
    sc.run()
    assert sc.bound("small") == 1 and sc.bound("head") == 0


def test_optional_tasks_beyond_min_available_are_added_when_room():
    nodes = [make_node("n").gpus(3).build()]
    sc = Scenario(nodes, [make_workload("elastic").podset("p", 5, gpu=1).min_available(2).build()])
    last = sc.run()
    assert sc.bound("elastic") == 3
    assert "optional task" in last.pending_for("elastic").message


def test_queues_take_turns():
    nodes = [make_node("n").gpus(4).build()]
    wl = [make_workload(f"a{k}").podset("p", gpu=1).queue("team-a").created(k).build() for k in range(4)]
    wl += [
        make_workload(f"b{k}").podset("p", gpu=1).queue("team-b").created(k + 10).build() for k in range(4)
    ]
    sc = Scenario(nodes, wl)
    sc.run()
    a = sum(sc.bound(f"a{k}") for k in range(4))
    b = sum(sc.bound(f"b{k}") for k in range(4))
    assert (a, b) == (2, 2)


def test_run_cycle_leaves_the_snapshot_unchanged():
    nodes = [make_node(f"n{k}").gpus(2).build() for k in range(2)]
    snap = Snapshot(nodes, [make_workload("w").podset("p", 3, gpu=1).build()])
    before = snap.cluster.gpu_milli_free.copy()
    sc = Scenario(nodes, [])
    result = run_cycle(snap, sc.prof, 1.0, np.random.default_rng(0))
    assert len(result.binds) == 3
    assert (snap.cluster.gpu_milli_free == before).all()
    assert not snap.allocations


def test_statement_checkpoint_rollback_commit_discard():
    nodes = [make_node("n").gpus(4).build()]
    snap = Snapshot(nodes, [make_workload("w").podset("p", 3, gpu=1).build()])
    sc = Scenario(nodes, [])
    session = Session(snap, sc.prof, 0.0, np.random.default_rng(0))
    tasks = snap.workloads["w"].tasks
    st = session.statement()
    session.place(tasks[0], st)
    cp = st.checkpoint()
    session.place(tasks[1], st)
    session.place(tasks[2], st)
    assert snap.cluster.gpu_whole_free[0] == 1
    st.rollback(cp)
    assert snap.cluster.gpu_whole_free[0] == 3 and len(snap.allocations) == 1
    st.commit()
    with pytest.raises(RuntimeError):
        st.allocate(Allocation(tasks[1], 0, snap.allocations[tasks[0].name].devices, 0, 0))
    st2 = session.statement()
    session.place(tasks[1], st2)
    st2.discard()
    assert len(snap.allocations) == 1
    assert len(session.result().binds) == 1
    session.close()
    assert not snap.allocations and snap.cluster.gpu_whole_free[0] == 4


def test_statement_evict_and_undo():
    nodes = [make_node("n").gpus(1).build()]
    snap = Snapshot(nodes, [make_workload("w").podset("p", gpu=1).build()])
    sc = Scenario(nodes, [])
    session = Session(snap, sc.prof, 0.0, np.random.default_rng(0))
    st = session.statement()
    alloc = session.place(snap.workloads["w"].tasks[0], st)
    st.commit()
    st2 = Statement(snap)
    st2.evict(alloc, "test")
    assert snap.cluster.gpu_whole_free[0] == 1
    st2.discard()
    assert snap.cluster.gpu_whole_free[0] == 0


def test_capacity_gate_still_places_what_fits_and_keeps_reasons():
    nodes = [make_node("n").gpus(3).build()]
    wl = [make_workload(f"w{k}").podset("p", gpu=1).created(k).build() for k in range(10)]
    wl.append(make_workload("big").podset("p", gpu=4).created(0.5).build())
    sc = Scenario(nodes, wl)
    sc.run()
    assert [sc.bound(f"w{k}") for k in range(10)] == [1, 1, 1] + [0] * 7
    assert sc.snapshot.workloads["w9"].last_pending is not None
    assert "not enough GPUs" in sc.snapshot.workloads["big"].last_pending.message
    sc.complete("w1")
    sc.run()
    assert sc.bound("w3") == 1 and sc.bound("w4") == 0
    # a new arrival is looked at in its first cycle even when nothing fits
    sc.add(make_workload("late").podset("p", gpu=1).created(99).build())
    last = sc.cycle()
    assert last.pending_for("late") is not None
