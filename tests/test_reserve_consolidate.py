"""Reservation with backfill, consolidation of scattered capacity, and LAS / SRTF orders."""

from builders import Scenario, make_node, make_workload
from phalanx.profiles import compile_profile


def profile(actions, filters=(), order=("priority",), scorer="binpack"):
    return compile_profile(
        {
            "name": "p",
            "tie_break": "name",
            "actions": [a if isinstance(a, dict) else {"name": a} for a in actions],
            "order": [o if isinstance(o, dict) else {"name": o} for o in order],
            "scorers": [{"name": scorer}],
            "filters": [{"name": f} for f in filters],
        }
    )


def nodes(n, gpus=4):
    return [make_node(f"n{i}").cpu(64).memory("512Gi").gpus(gpus).build() for i in range(n)]


def stream(sc):
    """8 one-GPU jobs end one per cycle and a new 8-second one arrives each cycle; a 2 x 4-GPU gang waits.

    Returns the clock when the gang was placed, or None.
    """
    for k in range(8):
        sc.add(make_workload(f"s{k}").podset("p", gpu=1).runtime(k + 1).created(k).build())
    sc.cycle()
    sc.add(make_workload("big").podset("p", 2, gpu=4).runtime(100).created(100).build())
    for k in range(8, 40):
        for name, e in list(sc.snapshot.running.items()):
            since = min(a.since for a in e.bound.values())
            if name != "big" and sc.clock + 1 >= since + (e.workload.estimated_runtime or 0):
                sc.complete(name)
        sc.add(make_workload(f"s{k}").podset("p", gpu=1).runtime(8).created(100 + k).build())
        sc.cycle()
        if sc.bound("big") == 2:
            return sc.clock
    return None


def test_without_reservation_a_stream_of_small_jobs_starves_the_big_gang():
    sc = Scenario(nodes(2), profile=profile(["allocate", "backfill"]))
    assert stream(sc) is None


def test_reservation_lets_the_big_gang_start_once_the_running_jobs_end():
    sc = Scenario(nodes(2), profile=profile(["reserve", "allocate", "backfill"], filters=["reservation"]))
    placed = stream(sc)
    assert placed is not None and placed <= 10  # the last of the first jobs ends at t=9


def test_reserved_nodes_are_backfilled_by_jobs_that_end_before_the_gang_is_due():
    reserve = {"name": "reserve", "args": {"min_gpus": 4}}
    sc = Scenario(nodes(1), profile=profile([reserve, "allocate", "backfill"], filters=["reservation"]))
    sc.add(make_workload("run").podset("p", gpu=2).runtime(50).build())
    sc.cycle()
    sc.add(make_workload("big").podset("p", gpu=4).created(1).build())
    sc.add(make_workload("short").podset("p", gpu=1).runtime(10).created(2).build())
    sc.add(make_workload("long").podset("p", gpu=1).runtime(500).created(3).build())
    sc.add(make_workload("unknown").podset("p", gpu=1).created(4).build())
    sc.cycle()
    assert sc.bound("short") == 1
    assert sc.bound("long") == 0 and sc.bound("unknown") == 0
    reasons = " ".join(r.message for r in sc.pending("long").reasons)
    assert "reserved for big" in reasons


def test_consolidation_moves_restartable_tasks_so_a_gang_fits():
    sc = Scenario(nodes(2), profile=profile(["allocate"], scorer="spread"))
    for k in range(4):
        sc.add(make_workload(f"j{k}").podset("p", gpu=1).created(k).build())
    sc.run()
    per_node = sorted(len(sc.snapshot.on_node[i]) for i in range(2))
    assert per_node == [2, 2]  # scattered: 4 GPUs free, but no node with 4
    sc.add(make_workload("gang").podset("p", gpu=4).created(10).build())
    sc.prof = profile(["allocate"])
    sc.run()
    assert sc.bound("gang") == 0
    sc.prof = profile(["allocate", {"name": "consolidate", "args": {"max_moves": 2}}])
    result = sc.cycle()
    assert sc.bound("gang") == 1
    assert len(result.evictions) == 2 and all("make room for gang" in e.reason for e in result.evictions)
    assert all(sc.bound(f"j{k}") == 1 for k in range(4))  # every moved task found a new place


def test_consolidation_never_moves_non_preemptible_tasks_or_evicts_without_a_fit():
    sc = Scenario(nodes(2), profile=profile(["allocate"], scorer="spread"))
    for k in range(4):
        sc.add(make_workload(f"j{k}").podset("p", gpu=1).preemptible(k < 2).created(k).build())
    sc.run()
    sc.add(make_workload("gang").podset("p", gpu=4).created(10).build())
    sc.prof = profile(["allocate", {"name": "consolidate", "args": {"max_moves": 4}}])
    result = sc.run()
    assert not sc.snapshot.workloads["j2"].workload.preemptible
    assert {a.task.workload for a in sc.snapshot.on_node[0].values()} == {"j0", "j2"}
    # each node holds one pinned task: no node can be emptied, so nothing is moved
    assert not result.evictions and sc.bound("gang") == 0


def test_consolidation_moves_a_share_so_its_gpu_frees_up_for_a_whole_gpu_task():
    sc = Scenario(nodes(3, gpus=1), profile=profile(["allocate"], scorer="spread"))
    sc.add(make_workload("small").podset("p", fraction=0.3).created(0).build())
    sc.add(make_workload("half").podset("p", fraction=0.5).created(1).build())
    sc.add(make_workload("pinned").podset("p", fraction=0.4).preemptible(False).created(2).build())
    sc.run()
    assert sorted(len(sc.snapshot.on_node[i]) for i in range(3)) == [1, 1, 1]  # 1.2 GPUs used on 3
    sc.add(make_workload("whole").podset("p", gpu=1).created(10).build())
    sc.prof = profile(["allocate", {"name": "consolidate", "args": {"max_moves": 1}}])
    result = sc.cycle()
    assert sc.bound("whole") == 1
    # one move: a share into another GPU's hole, leaving its own GPU whole (the pinned one stays)
    assert [e.workload for e in result.evictions] == ["small"] or [e.workload for e in result.evictions] == [
        "half"
    ]
    node_of = {a.task.workload: a.node for a in sc.snapshot.allocations.values()}
    assert node_of["whole"] not in {node_of["small"], node_of["half"], node_of["pinned"]}
    assert sc.bound("small") == 1 and sc.bound("half") == 1


def test_consolidation_does_not_swap_a_task_for_one_of_its_own_shape():
    sc = Scenario(nodes(1, gpus=1), profile=profile(["allocate"]))
    sc.add(make_workload("a").podset("p", fraction=0.6).created(0).build())
    sc.run()
    sc.add(make_workload("b").podset("p", fraction=0.6).created(1).build())
    sc.prof = profile(["allocate", {"name": "consolidate", "args": {"max_moves": 4}}])
    result = sc.cycle()
    assert not result.evictions and sc.bound("b") == 0


def test_las_orders_by_attained_service_level_and_preempts_across_levels():
    las = {"name": "las", "args": {"thresholds": [100]}}
    prof = profile(["allocate", {"name": "preempt", "args": {"by": "order"}}], order=[las])
    sc = Scenario(nodes(1), profile=prof)
    sc.snapshot.advance(0.0)
    sc.add(make_workload("old").podset("p", gpu=4).created(0).build())
    sc.cycle()
    sc.snapshot.advance(50.0)  # 4 GPUs x 50 s = 200 GPU-s: above the threshold
    assert sc.snapshot.workloads["old"].attained == 200.0
    sc.add(make_workload("new").podset("p", gpu=2).created(5).build())
    result = sc.cycle()
    assert [e.workload for e in result.evictions] == ["old"] and sc.bound("new") == 1
    sc.add(make_workload("newer").podset("p", gpu=4).created(6).build())
    result = sc.cycle()
    # same level as "new": age gives no right to preempt
    assert not result.evictions and sc.bound("newer") == 0


def test_las_time_slices_only_checkpointing_workloads_when_asked_but_priority_still_preempts():
    las = {"name": "las", "args": {"thresholds": [100]}}
    preempt = {"name": "preempt", "args": {"by": "order", "order_victims": "checkpointed"}}
    prof = profile(["allocate", preempt], order=["priority", las])
    sc = Scenario(nodes(1), profile=prof)
    sc.snapshot.advance(0.0)
    sc.add(make_workload("plain").podset("p", gpu=2).created(0).build())
    sc.add(make_workload("saver").podset("p", gpu=2).checkpoints(300).created(1).build())
    sc.cycle()
    sc.snapshot.advance(50.0)  # both past the threshold: level 1
    sc.add(make_workload("new").podset("p", gpu=2).preemptible(False).created(5).build())
    result = sc.cycle()
    # a lower level outranks both, but only the one that checkpoints may lose its GPUs to it
    assert [e.workload for e in result.evictions] == ["saver"] and sc.bound("new") == 1
    sc.add(make_workload("urgent").podset("p", gpu=2).priority(5).created(6).build())
    result = sc.cycle()
    # higher priority: no checkpoint needed
    assert [e.workload for e in result.evictions] == ["plain"] and sc.bound("urgent") == 1


def test_las_time_slice_protects_a_run_for_its_quantum_but_not_from_higher_priority():
    las = {"name": "las", "args": {"thresholds": [100]}}
    preempt = {"name": "preempt", "args": {"by": "order", "quantum": 60}}
    sc = Scenario(nodes(1), profile=profile(["allocate", preempt], order=["priority", las]))
    sc.snapshot.advance(0.0)
    sc.add(make_workload("old").podset("p", gpu=4).created(0).build())
    sc.cycle()
    sc.snapshot.advance(50.0)  # level 1, but only 50 s into its run
    sc.add(make_workload("new").podset("p", gpu=4).created(5).build())
    assert not sc.cycle().evictions
    sc.add(make_workload("urgent").podset("p", gpu=4).priority(3).created(6).build())
    result = sc.cycle()
    assert [e.workload for e in result.evictions] == ["old"] and sc.bound("urgent") == 1


def test_srtf_prefers_the_shortest_remaining_time():
    sc = Scenario(nodes(1), profile=profile(["allocate"], order=["srtf"]))
    sc.add(make_workload("long").podset("p", gpu=4).runtime(1000).created(0).build())
    sc.add(make_workload("unknown").podset("p", gpu=4).created(0).build())
    sc.add(make_workload("short").podset("p", gpu=4).runtime(10).created(5).build())
    sc.cycle()
    assert sc.bound("short") == 1 and sc.bound("long") == 0 and sc.bound("unknown") == 0


def test_the_filtered_bound_leaves_out_reserved_nodes_and_never_undercounts_a_placement():
    """`upper_bound(filtered=True)` skips what-ifs the reservation is bound to refuse: it counts
    no room on the reserved nodes, for the tasks kept off them, and never less than placement gets."""
    import numpy as np

    from phalanx.actions.gang import _place_gang, gang_tasks, upper_bound
    from phalanx.core.session import Reservation, Session
    from phalanx.core.snapshot import Snapshot

    ns = nodes(3)
    prof = profile(["allocate"], filters=["reservation"])
    wl = [
        make_workload("big").podset("p", 8, gpu=1).build(),
        make_workload("long").podset("p", 6, gpu=1).runtime(500).build(),
        make_workload("short").podset("p", 6, gpu=1).runtime(5).build(),
    ]
    snap = Snapshot(ns, wl)
    session = Session(snap, prof, 0.0, np.random.default_rng(0))
    session.reservation = Reservation("big", np.array([True, True, False]), due=100.0)
    # long (500 s, past the due time) is kept off n0 and n1: only n2's 4 GPUs count for it;
    # short ends before the gang is due and big holds the reservation: all 12 GPUs count
    for name, plain, room, placed in (("long", 6, 4, False), ("short", 6, 6, True), ("big", 8, 8, True)):
        entry = snap.workloads[name]
        tasks = gang_tasks(entry)[0]
        assert upper_bound(session, tasks) == plain, name
        assert upper_bound(session, tasks, filtered=True) == room, name
        st = session.statement()
        assert _place_gang(session, entry, tasks, outer=st, explain=False).placed is placed, name
        st.discard()


def test_a_reservation_waits_for_min_wait_before_it_holds_nodes_back():
    """`reserve: {min_wait}`: until the big gang has waited that long it competes like the others
    (the long job takes the free GPU); after, the reserved node is kept for it (long waits)."""
    reserve = {"name": "reserve", "args": {"min_gpus": 4, "min_wait": 5}}  # 0: late is kept off at once
    sc = Scenario(nodes(1), profile=profile([reserve, "allocate", "backfill"], filters=["reservation"]))
    sc.add(make_workload("run").podset("p", gpu=2).runtime(50).build())
    sc.cycle()  # t=1
    sc.add(make_workload("big").podset("p", gpu=4).created(1).build())
    sc.add(make_workload("early").podset("p", gpu=1).runtime(500).created(2).build())
    sc.cycle()  # t=2: big has waited 1 s, no reservation yet
    assert sc.bound("early") == 1
    sc.complete("early")
    for _ in range(4):
        sc.cycle()  # t=3..6: nothing else waits; 2 GPUs stay free
    sc.add(make_workload("late").podset("p", gpu=1).runtime(500).created(6).build())
    sc.cycle()  # t=7: big has waited 6 s: the node is reserved for it, late would end after it is due
    assert sc.bound("late") == 0
    assert "reserved for big" in " ".join(r.message for r in sc.pending("late").reasons)


def test_min_wait_must_not_be_negative():
    import pytest

    from phalanx.core.errors import SpecError

    with pytest.raises(SpecError, match="min_wait"):
        profile([{"name": "reserve", "args": {"min_wait": -1}}])
