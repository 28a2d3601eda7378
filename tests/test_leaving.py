"""A waiting workload that fits once the pods still terminating are gone evicts nothing more for it
(found on a full cluster under churn: a 1-GPU preemptor evicted one victim a cycle until its node
was empty); a pod stuck terminating long past its grace period is not waited for."""

from __future__ import annotations

import numpy as np
import pytest

from builders import make_node, make_workload
from phalanx.actions.leaving import STUCK_S
from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import TERMINATING, Bind
from phalanx.core.queues import Queue, QueueTree, ResourceQuota
from phalanx.core.snapshot import ForeignUsage, Snapshot
from phalanx.profiles import compile_profile

NOW = 1000.0


def profile(action: str) -> object:
    return compile_profile(
        {
            "name": "p",
            "tie_break": "name",
            "actions": [{"name": "allocate"}, {"name": action}],
            "order": [{"name": "priority"}],
            **(
                {"admission": [{"name": "quota"}], "queue_order": {"name": "fairshare"}}
                if action == "reclaim"
                else {}
            ),
        }
    )


def four_gpus(queues: QueueTree | None = None) -> Snapshot:
    return Snapshot([make_node("n0").cpu(64).memory("256Gi").gpus(4).build()], queues=queues)


def running(s: Snapshot, names: list[str], queue: str = "default", gpus: tuple[int, ...] = (0, 1, 2)) -> None:
    for name, g in zip(names, gpus, strict=True):
        s.add_workload(make_workload(name).podset("p", gpu=1).queue(queue).created(0).build())
        s.bind_existing(
            f"{name}/p-0",
            "n0",
            s.assignment_of(Bind(f"{name}/p-0", name, "n0", (g,), gpu_milli=1000)),
            since=0.0,
        )


@pytest.mark.parametrize("ends", [NOW + 30, NOW - STUCK_S + 1])
def test_preempt_waits_for_a_victim_still_terminating(ends: float) -> None:
    s = four_gpus()
    running(s, ["low-0", "low-1", "low-2"])
    s.add_foreign(ForeignUsage("n0", 1000, 1024, (3,), 1000, "default/low-3", ends))  # evicted last cycle
    s.add_workload(make_workload("high").podset("p", gpu=1).priority(1000).created(NOW).build())
    r = run_cycle(s, profile("preempt"), NOW, np.random.default_rng(0), apply=True)
    assert not r.evictions and not r.binds
    p = r.pending_for("high")
    assert p is not None and {(h.guard, h.victim) for h in p.holds} == {(TERMINATING, "default/low-3")}


def test_a_pod_stuck_terminating_is_not_waited_for() -> None:
    s = four_gpus()
    running(s, ["low-0", "low-1", "low-2"])
    stuck = NOW - STUCK_S - 1  # past its grace period for over a minute: its node is away
    s.add_foreign(ForeignUsage("n0", 1000, 1024, (3,), 1000, "default/low-3", stuck))
    s.add_workload(make_workload("high").podset("p", gpu=1).priority(1000).created(NOW).build())
    r = run_cycle(s, profile("preempt"), NOW, np.random.default_rng(0), apply=True)
    assert len(r.evictions) == 1


def test_reclaim_waits_for_a_victim_still_terminating() -> None:
    gpu = {"gpu": ResourceQuota(2000)}
    s = four_gpus(QueueTree([Queue("a", quotas=dict(gpu)), Queue("b", quotas=dict(gpu))]))
    running(s, ["b-0", "b-1", "b-2"], queue="b")  # b borrows one of a's GPUs
    s.add_foreign(ForeignUsage("n0", 1000, 1024, (3,), 1000, "default/b-3", NOW + 30))  # reclaimed
    s.add_workload(make_workload("a-0").podset("p", gpu=1).queue("a").created(NOW).build())
    s.add_workload(make_workload("a-1").podset("p", gpu=1).queue("a").created(NOW + 1).build())
    r = run_cycle(s, profile("reclaim"), NOW, np.random.default_rng(0), apply=True)
    # a-0 waits for b-3's GPU; a-1 (its queue still owed one) reclaims one more, not two
    assert len(r.evictions) == 1
    p = r.pending_for("a-0")
    assert p is not None and any(h.guard == TERMINATING for h in p.holds)


def test_a_gang_waiting_for_leaving_pods_is_not_given_victims_by_a_later_action() -> None:
    """Reclaim finds the gang waiting for a pod on its way out and claims that pod for it; preempt,
    asking next in the same cycle, must not read the claim as someone else's and evict for it."""
    gpu = {"gpu": ResourceQuota(2000)}
    s = four_gpus(QueueTree([Queue("a", quotas=dict(gpu)), Queue("b", quotas=dict(gpu))]))
    running(s, ["b-0", "b-1"], queue="b", gpus=(0, 1))
    running(s, ["a-low"], queue="a", gpus=(2,))  # a lower-priority workload preempt could evict
    s.add_foreign(ForeignUsage("n0", 1000, 1024, (3,), 1000, "default/b-3", NOW + 30))
    s.add_workload(make_workload("a-0").podset("p", gpu=1).queue("a").priority(1000).created(NOW).build())
    prof = compile_profile(
        {
            "name": "p",
            "tie_break": "name",
            "actions": [{"name": "allocate"}, {"name": "reclaim"}, {"name": "preempt"}],
            "order": [{"name": "priority"}],
            "admission": [{"name": "quota"}],
            "queue_order": {"name": "fairshare"},
        }
    )
    r = run_cycle(s, prof, NOW, np.random.default_rng(0), apply=True)
    assert not r.evictions
