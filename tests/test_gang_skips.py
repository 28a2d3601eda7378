"""A gang's try is skipped where it is bound to place nothing, and a node check's reasons are kept
while no node changed: both the twin's speed, neither changing a decision or a reason.

`first_room` is where the gang's first task may go at all (capacity, less the nodes a filter
refuses it outright); a domain without such a node fails at the first task, as the try there
would. The checks: over random clusters with reserved nodes and racks, every gang's outcome
(placed or not, and every word of why not) and the cluster after it are the same with the skip
and without it, and the skip did fire; `explain_kept` answers as `explain` does after binds,
unbinds and a node going down.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from builders import Scenario, make_node, make_workload
from phalanx.actions import gang as gang_mod
from phalanx.actions.gang import _place_gang, gang_tasks
from phalanx.core.decisions import Pending
from phalanx.core.feasibility import explain, explain_kept
from phalanx.core.session import Reservation, Session
from phalanx.profiles import compile_profile

PROFILE = compile_profile(
    {
        "name": "p",
        "tie_break": "name",
        "actions": [{"name": "allocate"}],
        "scorers": [{"name": "fgd"}],
        "filters": [{"name": "reservation"}],
        "device_selector": {"name": "fgd"},
        "gang_planner": {"name": "topology", "args": {"pack": True}},
    }
)


def cluster(rng: np.random.Generator) -> list:
    return [
        make_node(f"n{i}").cpu(64).memory("512Gi").gpus(int(rng.choice([4, 8]))).rack(f"r{i % 3}").build()
        for i in range(8)
    ]


def busy(seed: int) -> tuple[np.random.Generator, Scenario]:
    """Eight nodes in three racks, partly taken by a random mix of running gangs."""
    rng = np.random.default_rng(seed)
    sc = Scenario(cluster(rng), profile=PROFILE, seed=seed)
    for k in range(int(rng.integers(6, 14))):
        size, gpus = int(rng.choice([1, 2, 4])), int(rng.choice([1, 2]))
        sc.add(make_workload(f"m{k:02d}").podset("p", size, gpu=gpus).created(k).build())
    sc.run()
    return rng, sc


def state(sc: Scenario) -> list[tuple[str, int, tuple[int, ...]]]:
    return sorted((a.task.name, a.node, a.devices.gpus) for a in sc.snapshot.allocations.values())


def test_skipped_tries_say_and_leave_what_the_tries_would(monkeypatch: pytest.MonkeyPatch) -> None:
    fired = 0
    real = gang_mod.first_room

    def counted(session: Session, tasks: list) -> np.ndarray | None:
        nonlocal fired
        room = real(session, tasks)
        fired += room is not None and not room.all()
        return room

    for seed in range(60):
        rng, sc = busy(seed)
        for k in range(5):
            size, gpus = int(rng.choice([1, 2, 3, 6])), int(rng.choice([1, 2, 4]))
            sc.add(make_workload(f"g{k}").podset("p", size, gpu=gpus).created(100 + k).build())
        reserved = rng.random(8) < 0.5
        for k in range(5):
            outcomes = []
            for skip in (True, False):
                monkeypatch.setattr(gang_mod, "first_room", counted if skip else lambda s, t: None)
                session = Session(sc.snapshot, PROFILE, sc.clock + 1, np.random.default_rng(0))
                session.reservation = Reservation("big", reserved, 1e9)
                entry = sc.snapshot.workloads[f"g{k}"]
                entry.last_pending = Pending(entry.name, "waited a cycle before")  # the skip's case
                tasks, _ = gang_tasks(entry)
                before = state(sc)
                stmt = session.statement()
                outcomes.append(_place_gang(session, entry, tasks, outer=stmt))
                stmt.discard()
                assert state(sc) == before
            assert outcomes[0] == outcomes[1], f"seed {seed}, g{k}"
    assert fired >= 50  # the skip was met, not only the full tries


def test_a_preferred_domain_leaves_its_reasons_to_the_whole_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """A domain followed by the whole cluster (`then_cluster`) does not say why its try failed:
    the whole cluster's failed try says it, as it did when both were worked out."""
    planner = PROFILE.gang_planner
    assert planner is not None
    real = planner.domains
    told = {True: 0, False: 0}
    for seed in range(80):
        rng, sc = busy(seed)
        for k in range(4):
            size, gpus = int(rng.choice([2, 3, 5])), int(rng.choice([1, 2, 4]))
            w = make_workload(f"g{k}").podset("p", size, gpu=gpus).created(100 + k)
            if k == 3:  # in one rack or not at all: no whole cluster follows, its own reasons are told
                w = w.topology("rack", required=True)
            sc.add(w.build())
        reserved = rng.random(8) < 0.4  # room the planner counts that the filter refuses: tries fail
        for k in range(4):
            outcomes = []
            for keep in (True, False):
                monkeypatch.setattr(
                    planner,
                    "domains",
                    real if keep else lambda *a: (replace(d, then_cluster=False) for d in real(*a)),
                )
                session = Session(sc.snapshot, PROFILE, sc.clock + 1, np.random.default_rng(0))
                session.reservation = Reservation("big", reserved, 1e9)
                entry = sc.snapshot.workloads[f"g{k}"]
                tasks, _ = gang_tasks(entry)
                stmt = session.statement()
                outcomes.append(_place_gang(session, entry, tasks, outer=stmt))
                stmt.discard()
            assert outcomes[0] == outcomes[1], f"seed {seed}, g{k}"
            failed = not outcomes[0].placed and "best try" in outcomes[0].detail
            told[k == 3 and failed] += 1
    assert told[True] >= 5 and told[False] >= 50  # failed tries in a required rack were compared too


def test_kept_reasons_follow_every_change_to_a_node() -> None:
    nodes = [make_node(f"n{i}").cpu(8).memory("64Gi").gpus(2).build() for i in range(3)]
    sc = Scenario(nodes, profile=PROFILE)
    sc.add(make_workload("a").podset("p", 2, gpu=2).created(0).build())
    sc.add(make_workload("b").podset("p", 1, gpu=2, dataset="other").created(1).build())
    s = sc.snapshot
    req = s.workloads["a"].tasks[0].request
    alike = s.workloads["b"].tasks[0].request  # another dataset: the node checks read it alike
    memo: dict[object, object] = {}

    def check() -> None:
        kept = explain_kept(s, req, memo)
        assert kept == explain(s, req) == explain_kept(s, alike, memo)
        kept.append(kept[0] if kept else None)  # a caller adds to it: what is kept stays
        assert explain_kept(s, req, memo) == explain(s, req)
        for nodes in ([True, True, False], [False, True, True], [True, False, True]):  # domains apart
            mask = np.array(nodes)
            assert explain_kept(s, req, memo, mask) == explain(s, req, mask)

    check()
    sc.run()  # a takes two nodes whole, b the third
    check()
    assert [(r.plugin, r.nodes) for r in explain_kept(s, req, memo)] == [("gpu", 3)]
    s.cluster.set_ready(2, False)
    check()
    assert [(r.plugin, r.nodes) for r in explain_kept(s, req, memo)] == [("nodeready", 1), ("gpu", 2)]
    s.release(next(iter(s.workloads["a"].bound)))
    check()
    assert [(r.plugin, r.nodes) for r in explain_kept(s, req, memo)] == [("nodeready", 1), ("gpu", 1)]
