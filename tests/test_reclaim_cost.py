"""Reclaim weighs what it costs against what it gives (`max_loss_per_gpu`): the lost work and
restarts of the victims it would evict in the end, in GPU-seconds, against the GPUs the waiting
workload gets back, each worth `max_loss_per_gpu` seconds or the time it has waited if longer. A
reclaim that would lose more waits, and the waiting workload is told what it would lose."""

from __future__ import annotations

import pytest

from builders import Scenario, make_node, make_workload, reclaiming
from phalanx.core.decisions import RECLAIM_COST
from phalanx.core.queues import Queue, QueueTree, ResourceQuota
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import compile_profile


def surplus(t: float, gang: int = 1, running: bool = True, **args: object) -> tuple[Scenario, object]:
    """6 GPUs; queues a and b deserve 1 GPU each and c 4 (idle: its share is a's and b's to split).
    b runs one-GPU jobs (no checkpoints) from t=1 and a one (within its quota), or b all six if
    not `running`; at `t`, a asks for a gang of `gang` GPUs. Returns the scenario and that cycle's result."""
    sc = Scenario(
        [make_node("n").cpu(64).memory("256Gi").gpus(6).build()],
        [],
        profile=reclaiming({"owed": "fair", **args}),
    )
    quota = {"a": 1000, "b": 1000, "c": 4000}
    tree = QueueTree(Queue(q, quotas={"gpu": ResourceQuota(g)}) for q, g in quota.items())
    sc.snapshot = Snapshot(sc.nodes, queues=tree)
    if running:
        sc.add(make_workload("a-run").podset("p", gpu=1).queue("a").build())
    for k in range(5 if running else 6):  # the cluster full
        sc.add(make_workload(f"b-{k}").podset("p", gpu=1).queue("b").build())
    sc.cycle()
    sc.clock = t - 1.0
    sc.add(make_workload("a-ask").podset("p", gang, gpu=1).queue("a").created(t).build())
    return sc, sc.cycle()


def test_a_reclaim_above_the_deserved_quota_that_loses_more_than_its_gpus_are_worth_waits() -> None:
    sc, r = surplus(7201.0, max_loss_per_gpu=3600)
    assert not r.evictions and sc.bound("a-ask") == 0  # two hours of one GPU's work, for one GPU
    p = r.pending_for("a-ask")
    assert p is not None and [h.guard for h in p.holds] == [RECLAIM_COST]
    assert "reclaim: evicting b-0 would lose 2.00 GPU-h for 1 GPU, more than max_loss_per_gpu" in p.message
    assert "above the queue's deserved quota (3600 s of GPU time per GPU)" in p.message, p.message
    _, r = surplus(7201.0)  # without the rule the same reclaim is made
    assert [e.workload for e in r.evictions] == ["b-0"]


def test_a_reclaim_that_costs_less_than_it_gives_goes_ahead() -> None:
    sc, r = surplus(1801.0, max_loss_per_gpu=3600)  # half an hour lost, for one GPU
    assert [e.workload for e in r.evictions] == ["b-0"] and sc.bound("a-ask") == 1


def test_up_to_its_deserved_quota_a_queue_reclaims_whatever_it_costs() -> None:
    sc, r = surplus(7201.0, running=False, max_loss_per_gpu=3600)  # a's first GPU: its guarantee
    assert [e.workload for e in r.evictions] == ["b-0"] and sc.bound("a-ask") == 1


def test_the_restart_counts_in_the_cost() -> None:
    sc, r = surplus(1001.0, max_loss_per_gpu=3600, restart_s=3000)  # 1,000 s + a 3,000 s restart
    assert not r.evictions and sc.bound("a-ask") == 0
    p = r.pending_for("a-ask")
    assert p is not None and "would lose 1.11 GPU-h for 1 GPU" in p.message, p.message
    _, r = surplus(1001.0, max_loss_per_gpu=3600)
    assert [e.workload for e in r.evictions] == ["b-0"]


def test_a_gang_is_worth_its_gpus() -> None:
    """Two GPUs back are worth twice one: victims losing 1.4 GPU-h in all are taken for a 2-GPU gang."""
    sc, r = surplus(2501.0, gang=2, max_loss_per_gpu=3600)  # 2 x 2,500 GPU-s, under 2 x 3,600
    assert {e.workload for e in r.evictions} == {"b-0", "b-1"} and sc.bound("a-ask") == 2
    sc, r = surplus(2501.0, gang=2, max_loss_per_gpu=2000)  # over 2 x 2,000
    assert not r.evictions and sc.bound("a-ask") == 0


@pytest.mark.parametrize("bad", [-1, float("inf"), "an hour"])
def test_a_bad_max_loss_per_gpu_is_refused_by_name(bad: object) -> None:
    with pytest.raises(Exception, match="max_loss_per_gpu"):
        compile_profile({"name": "x", "actions": [{"name": "reclaim", "args": {"max_loss_per_gpu": bad}}]})
