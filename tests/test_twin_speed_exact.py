"""The twin's shortcuts (issue 36) answer what the work they save would have answered.

Capacity kept from the cluster's change log equals `node_capacity` worked out anew; the scalar
first look of `may_host` never refuses a node `find_candidates` keeps; one node's usable GPUs
equal that node's row of `gpu_usable`; a demand key hashes and pickles as its plain tuple; the
victim and the guard kept for a cycle are given up when the workload's allocations change; gang-affinity keys
a class by the workload once members are placed (`test_classes` checks the decisions).
"""

from __future__ import annotations

import pickle

import numpy as np

from builders import make_node, make_workload
from phalanx.actions.evict import Guards
from phalanx.actions.holds import as_victim, guard_of
from phalanx.core.decisions import MIN_RUNTIME
from phalanx.core.devices import gpu_usable, gpu_usable_on
from phalanx.core.extension import SCORES_ZERO
from phalanx.core.feasibility import (
    CATCH_UP_MAX,
    _prefilter,
    capacity_of,
    find_candidates,
    may_host,
    node_capacity,
)
from phalanx.core.model import Workload
from phalanx.core.session import ORDER_BY_ATTAINED, Session
from phalanx.core.snapshot import HashedKey, Snapshot
from phalanx.plugins.topology import GangAffinityScorer
from phalanx.profiles import compile_profile, load_profile


def snapshot(seed: int) -> Snapshot:
    rng = np.random.default_rng(seed)
    nodes = []
    for i in range(12):
        b = make_node(f"n{i:02d}").cpu(int(rng.choice([16, 32]))).rack(f"r{i % 3}")
        nodes.append(b.gpus(int(rng.choice([2, 4, 8]))).build())
    work: list[Workload] = []
    for k in range(60):
        w = make_workload(f"w{k:03d}").created(float(k)).runtime(100.0)
        r = rng.random()
        if r < 0.4:
            w.podset("p", cpu=2, fraction=float(rng.choice([0.25, 0.5])))
        elif r < 0.8:
            w.podset("p", cpu=4, gpu=int(rng.choice([1, 2])))
        else:
            w.podset("w", 3, cpu=4, gpu=2)
        work.append(w.build())
    return Snapshot(nodes, work, topology_levels=("rack",))


def requests(session: Session) -> list:
    return [session.effective(t.request) for e in session.snapshot.workloads.values() for t in e.tasks]


def test_kept_capacity_equals_capacity_worked_out_anew() -> None:
    for seed in range(3):
        snap = snapshot(seed)
        session = Session(snap, load_profile("phalanx"), 0.0, np.random.default_rng(seed))
        reqs = requests(session)
        stmt = session.statement()
        placed = 0
        for e in list(snap.workloads.values()):
            for t in e.tasks:
                if session.place(t, stmt) is not None:
                    placed += 1
                for req in reqs[:: 7 + seed]:
                    cap, total = capacity_of(snap, req, session.memo)
                    assert np.array_equal(cap, node_capacity(snap, req))
                    assert total == int(node_capacity(snap, req).sum())
            if placed > 20:
                stmt.rollback(stmt.checkpoint() // 2)  # unbinds: capacity comes back
        assert placed > 20
        for _ in range(CATCH_UP_MAX + 5):  # far behind: worked out anew
            snap.cluster.set_ready(3, True)
        for req in reqs[:5]:
            assert np.array_equal(capacity_of(snap, req, session.memo)[0], node_capacity(snap, req))
        session.close()


def test_the_scalar_look_never_refuses_a_node_the_full_check_keeps() -> None:
    for seed in range(3):
        snap = snapshot(seed)
        session = Session(snap, load_profile("phalanx"), 0.0, np.random.default_rng(seed))
        reqs = requests(session)
        stmt = session.statement()
        refused = 0
        for e in list(snap.workloads.values())[:40]:
            for t in e.tasks:
                session.place(t, stmt)
            for req in reqs[::5]:
                kept = set(find_candidates(snap, req).nodes.tolist())
                for i in range(len(snap.cluster)):
                    if not may_host(snap, req, i):
                        refused += 1
                        assert i not in kept
        assert refused > 0  # the look does refuse, so it saves work
        session.close()


def test_one_node_usable_gpus_are_its_row_of_gpu_usable() -> None:
    snap = snapshot(1)
    session = Session(snap, load_profile("phalanx"), 0.0, np.random.default_rng(1))
    stmt = session.statement()
    c = snap.cluster
    for e in list(snap.workloads.values())[:30]:
        for t in e.tasks:
            session.place(t, stmt)
        for req in requests(session)[::9]:
            rows = gpu_usable(c, np.arange(len(c)), req)
            for i in range(len(c)):
                assert np.array_equal(gpu_usable_on(c, i, req), rows[i])
    session.close()


def test_a_demand_key_hashes_and_pickles_as_its_tuple() -> None:
    plain = (("a", 1), 2, None, ())
    key = HashedKey(plain)
    assert hash(key) == hash(plain) and key == plain and {plain: 1}[key] == 1
    back = pickle.loads(pickle.dumps(key))
    assert back == plain and type(back) is HashedKey and "_hash" not in back.__dict__
    snap = snapshot(0)
    e = next(iter(snap.workloads.values()))
    assert e.demand_key == tuple(e.demand_key) and isinstance(e.demand_key, HashedKey)


def test_the_victim_kept_for_the_cycle_follows_its_allocations() -> None:
    snap = snapshot(2)
    session = Session(snap, load_profile("phalanx"), 50.0, np.random.default_rng(2))
    stmt = session.statement()
    entry = next(e for e in snap.workloads.values() if len(e.tasks) == 3)
    for t in entry.tasks:
        assert session.place(t, stmt) is not None
    first = as_victim(session, entry)
    assert as_victim(session, entry) is first  # nothing changed: the same victim
    stmt.evict(first.allocs[0], "test")
    fewer = as_victim(session, entry)
    assert fewer is not first and len(fewer.allocs) == 2
    stmt.rollback(stmt.checkpoint() - 1)  # the same allocation back: the same answer as at first
    again = as_victim(session, entry)
    assert again.allocs == first.allocs and again.lost_work == first.lost_work
    session.close()


def test_gang_affinity_keys_a_class_by_the_workload_once_members_are_placed() -> None:
    snap = snapshot(0)
    session = Session(snap, load_profile("phalanx"), 0.0, np.random.default_rng(0))
    entry = next(e for e in snap.workloads.values() if len(e.tasks) == 3)
    scorer = GangAffinityScorer()
    t0, t1 = entry.tasks[0], entry.tasks[1]
    assert scorer.class_key(session, t0, t0.request) is SCORES_ZERO
    stmt = session.statement()
    assert session.place(t0, stmt) is not None
    assert scorer.class_key(session, t1, t1.request) == ("members of", entry.name)
    session.close()


def test_the_guard_kept_for_the_cycle_follows_its_allocations() -> None:
    snap = snapshot(2)
    session = Session(snap, load_profile("phalanx"), 50.0, np.random.default_rng(2))
    stmt = session.statement()
    entry = next(e for e in snap.workloads.values() if len(e.tasks) == 3)
    for t in entry.tasks:
        assert session.place(t, stmt) is not None
    g = Guards()
    first = guard_of(session, "preempt", entry, 3600.0, "d", g, None)
    assert first is not None and first.guard == MIN_RUNTIME and first.until == 50.0 + 3600.0
    assert guard_of(session, "preempt", entry, 3600.0, "d", g, None) is first  # kept
    assert guard_of(session, "preempt", entry, 0.0, "d", g, None) is None  # another key
    stmt.evict(next(iter(entry.bound.values())), "test")
    again = guard_of(session, "preempt", entry, 3600.0, "d", g, None)
    assert again == first and again is not first  # worked out anew for the allocations left
    unhashable: object = {"a": 1}
    assert guard_of(session, "preempt", entry, 3600.0, "d", g, unhashable) == first
    session.close()


def test_whole_gpu_candidates_from_kept_capacity_are_the_prefilter_s() -> None:
    for seed in range(3):
        snap = snapshot(seed)
        session = Session(snap, load_profile("phalanx"), 0.0, np.random.default_rng(seed))
        whole = [r for r in requests(session) if r.gpu.kind.value == "whole"]
        stmt = session.statement()
        checked = 0
        for e in list(snap.workloads.values()):
            for t in e.tasks:
                session.place(t, stmt)
            for req in whole[::3]:
                got = find_candidates(snap, req).nodes.tolist()
                assert got == np.nonzero(_prefilter(snap, req))[0].tolist()
                within = np.array([1, 4, 7, 10], dtype=np.int64)
                assert find_candidates(snap, req, within=within).nodes.tolist() == [
                    int(i) for i in within if _prefilter(snap, req)[i]
                ]
                checked += 1
        assert checked > 100
        session.close()


def test_capacity_of_a_few_nodes_is_their_part_of_the_whole() -> None:
    snap = snapshot(4)
    session = Session(snap, load_profile("phalanx"), 0.0, np.random.default_rng(4))
    stmt = session.statement()
    snap.cluster.set_ready(2, False)  # a node not ready has no room
    rng = np.random.default_rng(4)
    for e in list(snap.workloads.values())[:40]:
        for t in e.tasks:
            session.place(t, stmt)
        for req in requests(session)[::4]:
            every = node_capacity(snap, req)
            for k in (1, 2, 5, 8, 9):
                rows = np.sort(rng.choice(len(snap.cluster), size=k, replace=False)).astype(np.int64)
                assert node_capacity(snap, req, rows).tolist() == every[rows].tolist()
    session.close()


def test_a_las_key_kept_across_cycles_follows_the_attained_service() -> None:
    """`las` keys are kept in the entry while its attained service stays: each cycle's keys equal
    the keys worked out anew, as attained service moves across the thresholds."""
    prof = compile_profile(
        {
            "name": "las",
            "actions": [{"name": "allocate"}],
            "order": [{"name": "priority"}, {"name": "las", "args": {"thresholds": [100, 1000]}}],
        }
    )
    snap = snapshot(0)
    entries = list(snap.workloads.values())
    rng = np.random.default_rng(0)
    levels_seen = set()
    for cycle in range(8):
        if cycle:
            assert all(ORDER_BY_ATTAINED in e.cache for e in entries)  # kept from the cycle before
        kept = [Session(snap, prof, float(cycle), rng).order_key(e) for e in entries]
        for e in entries:
            del e.cache[ORDER_BY_ATTAINED]
        anew = [Session(snap, prof, float(cycle), rng).order_key(e) for e in entries]
        assert kept == anew
        levels_seen |= {k[1] for k in anew}
        for e in entries[cycle % 3 :: 3]:
            e.attained = e.attained + 400.0  # some cross a threshold this time, some do not
    assert levels_seen == {0, 1, 2}
