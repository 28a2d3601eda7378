"""Reclaim's hysteresis (issue 40): with `margin: m` a queue reclaims only below (1 - m) of what it
is owed, from queues above (1 + m) of theirs: two queues near their shares keep their workloads."""

from __future__ import annotations

import pytest

from builders import Scenario, make_workload, reclaiming, two_queues
from phalanx.profiles import compile_profile


def near_shares(margin: float) -> Scenario:
    """10 GPUs, 5 deserved each: b runs 6 (1.2x), a runs 4 (0.8x) and asks for one more."""
    sc = two_queues(10, reclaiming({"margin": margin}))
    for k in range(6):
        sc.add(make_workload(f"b-{k}").podset("p", gpu=1).queue("b").build())
    sc.cycle()
    for k in range(4):
        sc.add(make_workload(f"a-{k}").podset("p", gpu=1).queue("a").build())
    sc.cycle()
    sc.add(make_workload("a-more").podset("p", gpu=1).queue("a").created(10).build())
    return sc


@pytest.mark.parametrize(("margin", "reclaimed"), [(0.0, True), (0.1, True), (0.25, False)])
def test_a_margin_keeps_queues_near_their_shares_apart(margin: float, reclaimed: bool) -> None:
    sc = near_shares(margin)
    r = sc.cycle()
    assert bool(r.evictions) is reclaimed, r.evictions
    if reclaimed:
        assert {e.workload for e in r.evictions} <= {f"b-{k}" for k in range(6)}


def test_a_margin_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="margin must be a fraction"):
        compile_profile(
            {
                "name": "r",
                "actions": [{"name": "reclaim", "args": {"margin": 1.5}}],
                "order": [{"name": "priority"}],
            }
        )
