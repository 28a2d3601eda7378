"""Gangs handed out while the cycle decides (`run_cycle`'s `stream`): final when handed, and the
cycle's decisions the same as without a stream (issue 34)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from builders import Scenario, make_node, make_workload
from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import Bind, CycleResult


def _both(make: Callable[[], Scenario]) -> tuple[CycleResult, CycleResult, list[tuple[str, list[Bind]]]]:
    """The same cycle run without and with a stream, on two equal scenarios."""
    plain, streaming = make(), make()
    handed: list[tuple[str, list[Bind]]] = []
    a = run_cycle(plain.snapshot, plain.prof, 10_000.0, np.random.default_rng(0), apply=True)
    b = run_cycle(
        streaming.snapshot,
        streaming.prof,
        10_000.0,
        np.random.default_rng(0),
        apply=True,
        stream=lambda w, binds: handed.append((w, binds)),
    )
    return a, b, handed


def _burst() -> Scenario:
    sc = Scenario([make_node(f"n{k}").gpus(8).build() for k in range(4)], profile="phalanx-queues")
    for k in range(5):
        sc.add(make_workload(f"gang{k}").podset("w", count=2, gpu=2).build())
    sc.add(make_workload("big").podset("w", count=1, gpu=8).build())
    return sc


def test_every_gang_placed_into_free_room_is_handed_out_as_placed_with_its_binds():
    a, b, handed = _both(_burst)
    assert a.binds == b.binds and a.evictions == b.evictions == []
    assert sorted(w for w, _ in handed) == sorted({x.workload for x in b.binds})
    by_task = {x.task: x for x in b.binds}
    assert all(x == by_task[x.task] for _, binds in handed for x in binds)
    assert sum(len(binds) for _, binds in handed) == len(b.binds)
    assert all(len(binds) == (1 if w == "big" else 2) for w, binds in handed)


def _preempting() -> Scenario:
    """An old low-priority run holds half a node; a high-priority gang needs all of it, so it waits
    at allocate while a small low-priority one is placed behind it; preempt then evicts both."""
    sc = Scenario([make_node("n0").gpus(4).build()], profile="phalanx-queues")
    sc.add(make_workload("old").podset("w", gpu=2).build())
    sc.cycle()
    sc.add(make_workload("high").priority(10).podset("w", gpu=4).build())
    sc.add(make_workload("small").podset("w", gpu=1).build())
    return sc


def test_a_workload_placed_behind_one_that_waits_in_its_queue_is_not_handed_out_early():
    a, b, handed = _both(_preempting)
    assert sorted(e.task for e in a.evictions) == ["old/w-0"], a.evictions
    assert (a.binds, a.evictions) == (b.binds, b.evictions)
    assert handed == [], "small could still make room for high: it is decided with the cycle's end"
