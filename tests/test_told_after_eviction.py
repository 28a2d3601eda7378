"""A workload evicted and waiting again is looked at anew, so it is told why it waits.

Found under churn on a full cluster: gangs waited minutes with no Event. A workload leaves the set
of those never looked at when it is bound; evicted, it waits again with no reason of its own, and
while alike workloads ahead of it do not fit a cycle tries only the first of them, so it was never
tried and never told. Its placement was right all along: only what it was told was missing.
"""

from __future__ import annotations

import numpy as np

from builders import make_node, make_workload
from phalanx.core.cycle import run_cycle
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile


def test_an_evicted_gang_waiting_behind_an_alike_one_gets_its_own_pending_reason() -> None:
    prof = load_profile("phalanx-queues")
    s = Snapshot([make_node("n0").cpu(64).memory("256Gi").gpus(8).build()])

    def cycle(t: float) -> object:
        return run_cycle(s, prof, t, np.random.default_rng(0), apply=True)

    s.add_workload(make_workload("v").podset("p", 2, gpu=4).created(0).build())
    r = cycle(1.0)
    assert {b.workload for b in r.binds} == {"v"}
    s.add_workload(make_workload("w").podset("p", 2, gpu=4).created(0.5).build())  # alike, ahead of v
    r = cycle(2.0)
    assert [p.workload for p in r.pending] == ["w"]
    s.add_workload(make_workload("high").podset("p", 1, gpu=8).priority(1000).created(3).build())
    r = cycle(4.0)
    assert {e.workload for e in r.evictions} == {"v"}
    r = cycle(5.0)
    waiting = {p.workload for p in r.pending}
    assert "v" in waiting, r.pending  # told why it waits, though w (alike) is ahead of it
    r = cycle(6.0)
    assert not r.binds and not r.evictions  # and nothing else changes for it


def test_a_gang_whose_binds_the_driver_could_not_make_is_looked_at_anew() -> None:
    """On Kubernetes a bind onto a node where the same cycle evicts waits for a later cycle (the
    executor defers it): the gang waits again with no reason of its own (as after an eviction), and
    the driver has it looked at anew (`Snapshot.look_again`)."""
    prof = load_profile("phalanx-queues")
    s = Snapshot([make_node("n0").cpu(64).memory("256Gi").gpus(8).build()])
    s.add_workload(make_workload("w").podset("p", 2, gpu=4).created(0).build())
    s.add_workload(make_workload("x").podset("p", 1, gpu=8).created(-1).build())
    run_cycle(s, prof, 1.0, np.random.default_rng(0), apply=True)  # x is placed, w waits
    s.add_workload(make_workload("v").podset("p", 2, gpu=4).created(1.5).build())
    r = run_cycle(s, prof, 2.0, np.random.default_rng(0), apply=True)
    assert not r.binds and {p.workload for p in r.pending} == {"v"}  # said once, as it came
    v = s.workloads["v"]
    v.last_pending, v.parked_epoch = None, -1  # as a deferred bind leaves it: no reason of its own
    r = run_cycle(s, prof, 3.0, np.random.default_rng(0), apply=True)
    assert "v" not in {p.workload for p in r.pending}  # behind w, which does not fit: never tried
    s.look_again(["v", "gone"])
    r = run_cycle(s, prof, 4.0, np.random.default_rng(0), apply=True)
    assert "v" in {p.workload for p in r.pending}
