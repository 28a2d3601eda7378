"""Consolidate skips a try it can show is bound to fail, and only such a try (the twin's speed).

A node a filter refuses outright both to the waiting gang and to every movable task (say, one
reserved for a large gang) takes nobody in the try; when the other nodes' free capacity cannot
hold the gang, the try fails, so `may_fit` says so without it. The checks: the skip is never
wrong (the full try fails wherever it skips, over random clusters), and a node that a movable
task may still use keeps the try.
"""

from __future__ import annotations

import numpy as np

from builders import Scenario, make_node, make_workload
from phalanx.actions.consolidate import Consolidate
from phalanx.actions.gang import gang_tasks
from phalanx.core.session import Reservation, Session
from phalanx.profiles import compile_profile

PROFILE = compile_profile(
    {
        "name": "p",
        "tie_break": "name",
        "actions": [{"name": "allocate"}],
        "scorers": [{"name": "binpack"}],
        "filters": [{"name": "reservation"}],
    }
)


def nodes(n: int) -> list:
    return [make_node(f"n{i}").cpu(64).memory("512Gi").gpus(4).build() for i in range(n)]


def reserved_n0(mover_runtime: float | None) -> tuple[Scenario, Session]:
    """n0 reserved (4 GPUs free) for a big gang due at t=1000; n1 holds three movable one-GPU tasks."""
    sc = Scenario(nodes(2), profile=PROFILE)
    sc.snapshot.cluster.set_ready(0, False)
    for k in range(3):
        w = make_workload(f"m{k}").podset("p", gpu=1).created(k)
        sc.add((w.runtime(mover_runtime) if mover_runtime is not None else w).build())
    sc.run()
    sc.snapshot.cluster.set_ready(0, True)
    assert {a.node for a in sc.snapshot.allocations.values()} == {1}
    sc.add(make_workload("gang").podset("p", gpu=4).created(10).build())
    session = Session(sc.snapshot, PROFILE, sc.clock + 1, np.random.default_rng(0))
    mask = np.array([True, False])
    session.reservation = Reservation("big", mask, 1000.0)
    return sc, session


def test_a_gang_whose_only_room_is_reserved_from_everyone_is_known_to_fail() -> None:
    sc, session = reserved_n0(None)  # unknown ends: the reservation keeps the movers off n0 too
    entry = sc.snapshot.workloads["gang"]
    gang, _ = gang_tasks(entry)
    c = Consolidate()
    assert c.enough_in_total(session, gang)  # 5 GPUs free in all: fragmented, by the plain count
    assert not c.may_fit(session, gang)
    assert c.consolidate(session, entry, gang, 8) == 0  # and the try itself fails


def test_movers_that_may_use_the_reserved_node_keep_the_try() -> None:
    sc, session = reserved_n0(10.0)  # they end before the reservation is due: n0 takes them
    entry = sc.snapshot.workloads["gang"]
    gang, _ = gang_tasks(entry)
    c = Consolidate()
    assert c.may_fit(session, gang)
    assert c.consolidate(session, entry, gang, 8) == 3
    assert {a.node for a in sc.snapshot.allocations.values() if a.task.workload != "gang"} == {0}


def test_the_skip_is_never_wrong_on_random_clusters() -> None:
    skipped = tried = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        sc = Scenario(nodes(5), profile=PROFILE, seed=seed)
        for k in range(int(rng.integers(10, 18))):
            w = make_workload(f"m{k:02d}").podset("p", gpu=int(rng.choice([1, 1, 2]))).created(k)
            w = w.preemptible(bool(rng.random() < 0.8))
            runtime = rng.choice([0.0, 0.0, 10.0, 5000.0])
            sc.add((w.runtime(float(runtime)) if runtime else w).build())
        sc.run()
        for k in range(4):
            size = int(rng.choice([1, 2]))
            sc.add(
                make_workload(f"g{k}")
                .podset("p", size, gpu=int(rng.choice([2, 3, 4])))
                .created(100 + k)
                .build()
            )
        session = Session(sc.snapshot, PROFILE, sc.clock + 1, rng)
        session.reservation = Reservation("big", rng.random(5) < 0.6, 1000.0)
        for k in range(4):
            entry = sc.snapshot.workloads[f"g{k}"]
            gang, _ = gang_tasks(entry)
            c = Consolidate()
            if not c.enough_in_total(session, gang):
                continue
            if c.may_fit(session, gang):
                tried += 1
                continue
            skipped += 1
            before = sorted((a.task.name, a.node, a.devices.gpus) for a in sc.snapshot.allocations.values())
            assert c.consolidate(session, entry, gang, 8) == 0, f"seed {seed}: g{k} would have fitted"
            assert before == sorted(
                (a.task.name, a.node, a.devices.gpus) for a in sc.snapshot.allocations.values()
            )
    assert skipped >= 10 and tried >= 50  # both sides of the look were met


def test_a_share_charged_by_gpu_memory_keeps_the_try() -> None:
    """A memory-sized share takes fewer milli-GPU on a GPU with more memory: moved, it frees more
    than it takes, so the sums prove nothing and the try is made (and here succeeds)."""
    nodes = [
        make_node("A").cpu(64).memory("512Gi").gpus(1, memory="40Gi").build(),
        make_node("B").cpu(64).memory("512Gi").gpus(1, memory="80Gi").build(),
        make_node("C").cpu(64).memory("512Gi").gpus(1, memory="80Gi").build(),
    ]
    sc = Scenario(nodes, profile=PROFILE)
    cl = sc.snapshot.cluster
    cl.set_ready(0, False)
    cl.set_ready(2, False)
    sc.add(make_workload("u").podset("p", fraction=0.8).preemptible(False).created(0).build())
    sc.run()  # u on B: 200 milli free there
    cl.set_ready(0, True)
    cl.set_ready(1, False)
    sc.add(make_workload("m").podset("p", gpu_memory=10240).created(1).build())
    sc.run()  # m on A: 250 milli of its 40 GiB GPU
    cl.set_ready(1, True)
    cl.set_ready(2, True)
    sc.add(make_workload("gang").podset("p", gpu=1).created(10).build())
    session = Session(sc.snapshot, PROFILE, sc.clock + 1, np.random.default_rng(0))
    session.reservation = Reservation("big", np.array([False, False, True]), 1000.0)  # C, for everyone
    entry = sc.snapshot.workloads["gang"]
    gang, _ = gang_tasks(entry)
    c = Consolidate()
    assert c.may_fit(session, gang)  # 750 + 200 milli free off C: short by the sums, yet
    assert c.consolidate(session, entry, gang, 8) == 1  # m moves to B at 125 milli; the gang takes A
