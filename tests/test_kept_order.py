"""A pending group's first workloads in profile order, kept across cycles, are those
`heapq.nsmallest` finds anew (the twin's speed: the gate asks it of every large group each cycle).

Over cycles where workloads arrive, start, run (their attained service grows), finish, and are
evicted back into their group with more attained service (a LAS level up), the kept order answers
as `nsmallest` over the group does, for every group and several counts.
"""

from __future__ import annotations

import heapq

import numpy as np

from builders import Scenario, make_node, make_workload
from phalanx.core.kept_order import first_in_order
from phalanx.core.session import Session
from phalanx.profiles import compile_profile

PROFILE = compile_profile(
    {
        "name": "las",
        "tie_break": "name",
        "actions": [{"name": "allocate"}],
        "order": [{"name": "priority"}, {"name": "las", "args": {"thresholds": [3, 20]}}],
    }
)


def test_the_kept_order_is_the_order_worked_out_anew() -> None:
    rng = np.random.default_rng(7)
    nodes = [make_node(f"n{i}").cpu(64).memory("256Gi").gpus(4).build() for i in range(3)]
    sc = Scenario(nodes, profile=PROFILE)
    s = sc.snapshot
    born = 0
    asked = 0
    for _ in range(40):
        for _ in range(int(rng.integers(0, 6))):
            w = make_workload(f"w{born:03d}").podset("p", gpu=int(rng.choice([1, 2])))
            sc.add(w.priority(int(rng.choice([0, 0, 5]))).created(float(born % 7)).build())
            born += 1
        sc.cycle()
        s.advance(sc.clock, 0.0)
        running = sorted(s.running)
        for name in running:
            if rng.random() < 0.15:
                sc.complete(name)
            elif rng.random() < 0.2:  # evicted: waits again, keyed by what it attained meanwhile
                for task in list(s.workloads[name].bound):
                    s.release(task)
        session = Session(s, PROFILE, sc.clock + 1, np.random.default_rng(0))
        assert session.order_mode() == "attained"
        for key, group in s.pending_groups.items():
            for n in (1, 2, 5, len(group)):
                want = heapq.nsmallest(n, group.values(), key=session.order_key)
                assert first_in_order(session, key, group, n) == want
                asked += 1
    assert asked > 100 and len(s.pending_groups) >= 2
