"""Reclaim weighs what it costs against what it gives (`max_loss_per_gpu`): the victims' lost work
and restarts, in GPU-seconds, against the GPUs the waiting queue gets back. A reclaim that would
lose more waits, and the waiting workload is told what it would lose."""

from __future__ import annotations

import pytest

from builders import make_workload, reclaiming, two_queues
from phalanx.core.decisions import RECLAIM_COST
from phalanx.profiles import compile_profile


def borrowed_until(t: float, **args: float) -> tuple[object, object]:
    """Queue b runs 4 one-GPU jobs (no checkpoints) from t=1 on 4 GPUs, 2 of them a's deserved
    share; at `t`, a asks for one GPU. Returns the scenario and that cycle's result."""
    sc = two_queues(4, reclaiming(dict(args)))
    for k in range(4):
        sc.add(make_workload(f"b-{k}").podset("p", gpu=1).queue("b").build())
    sc.cycle()
    sc.clock = t - 1.0
    sc.add(make_workload("a-0").podset("p", gpu=1).queue("a").created(t).build())
    return sc, sc.cycle()


def test_a_reclaim_that_would_lose_more_than_the_gpus_it_gives_are_worth_waits_and_says_so() -> None:
    sc, r = borrowed_until(7201.0, max_loss_per_gpu=3600)
    assert not r.evictions and sc.bound("a-0") == 0  # two hours of one GPU's work, for one GPU
    p = r.pending_for("a-0")
    assert p is not None and [h.guard for h in p.holds] == [RECLAIM_COST]
    assert "reclaim: evicting b-0 would lose 2.00 GPU-h for 1 GPU" in p.message, p.message
    assert "max_loss_per_gpu allows (3600 s of GPU time per GPU reclaimed)" in p.message
    _, r = borrowed_until(7201.0)  # without the rule the same reclaim is made
    assert [e.workload for e in r.evictions] == ["b-0"]


def test_a_reclaim_that_costs_less_than_it_gives_goes_ahead() -> None:
    sc, r = borrowed_until(1801.0, max_loss_per_gpu=3600)  # half an hour lost, for one GPU
    assert [e.workload for e in r.evictions] == ["b-0"] and sc.bound("a-0") == 1


def test_the_restart_counts_in_the_cost() -> None:
    sc, r = borrowed_until(1001.0, max_loss_per_gpu=3600, restart_s=3000)  # 1,000 s + a 3,000 s restart
    assert not r.evictions and sc.bound("a-0") == 0
    p = r.pending_for("a-0")
    assert p is not None and "would lose 1.11 GPU-h for 1 GPU" in p.message, p.message
    _, r = borrowed_until(1001.0, max_loss_per_gpu=3600)
    assert [e.workload for e in r.evictions] == ["b-0"]


def test_a_gang_is_worth_its_gpus() -> None:
    """Two GPUs back are worth twice one: victims losing 1.4 GPU-h in all are taken for a 2-GPU gang."""
    sc = two_queues(4, reclaiming({"max_loss_per_gpu": 3600}))
    for k in range(4):
        sc.add(make_workload(f"b-{k}").podset("p", gpu=1).queue("b").build())
    sc.cycle()
    sc.clock = 2500.0
    sc.add(make_workload("a-gang").podset("p", 2, gpu=1).queue("a").build())
    r = sc.cycle()  # each victim ran 2,500 s: 5,000 GPU-s in all, under 2 x 3,600
    assert {e.workload for e in r.evictions} == {"b-0", "b-1"} and sc.bound("a-gang") == 2


@pytest.mark.parametrize("bad", [-1, float("inf"), "an hour"])
def test_a_bad_max_loss_per_gpu_is_refused_by_name(bad: object) -> None:
    with pytest.raises(Exception, match="max_loss_per_gpu"):
        compile_profile({"name": "x", "actions": [{"name": "reclaim", "args": {"max_loss_per_gpu": bad}}]})
