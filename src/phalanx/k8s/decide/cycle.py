"""One way to decide: a world, a profile and a time -> the core's decisions and the forecasts they quote.

Everything that asks "what would the scheduler do now" asks here: the loop (`phalanx scheduler`),
`--shadow`, `phalanx status` and `phalanx dashboard`, and a capture's replay. So one world gives
one answer whoever asks, and `run_cycle` stays the only way into the core. The cycle is applied
(the snapshot ends as the decisions leave it): queue status, metrics and forecasts start from what
the cycle did. Forecasts come after, when the caller asks (`Decision.foresee`).
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import CycleResult
from phalanx.core.profile import Profile
from phalanx.core.session import Stream
from phalanx.k8s.decide.insight import Insight, RunTimes, insights
from phalanx.k8s.read.world import World

log = logging.getLogger("phalanx.k8s")
Memory = dict[str, dict[tuple[object, ...], float]]  # the repeat guard's: workload -> preemptor shape -> when
Recent = collections.deque[tuple[float, str, str, float]]  # the budgets': (when, workload, queue, GPU-s)


@dataclass
class Forecasting:
    """How a decision's start forecasts are made. A one-off caller (status, a replay) takes the
    default; the loop keeps one across cycles, so run times learnt from finished pods add up."""

    budget_s: float = 1.0  # 0: no forecast
    runtimes: RunTimes = field(default_factory=RunTimes)
    default_queue: str = ""  # the queue of a finished pod that names none
    courtesy: bool = False  # a failing forecast is logged and the decision stands (the loop's cycle)


@dataclass
class Decision:
    """One applied cycle on a world: its result, and the start forecasts for what it leaves waiting,
    made when asked (`foresee`): the loop binds first and forecasts after, so a bind never waits
    for a forecast."""

    world: World
    profile: Profile
    now: float
    result: CycleResult
    insight: Insight | None = None  # None: not foreseen yet

    def foresee(
        self, forecasting: Forecasting | None = None, finished: Sequence[dict[str, Any]] = ()
    ) -> Insight:
        """The start forecasts (made once). `finished`: pods to learn run times from, looked at only
        when a forecast is made."""
        if self.insight is None:
            f = forecasting if forecasting is not None else Forecasting()
            self.insight = _forecast(self.world, self.profile, self.now, self.result, f, finished)
        return self.insight


def decide(
    world: World,
    profile: Profile,
    now: float,
    rng: np.random.Generator | None = None,
    *,
    evicted_for: Memory | None = None,
    recent: Recent | None = None,
    stream: Stream | None = None,
) -> Decision:
    """One applied cycle on `world` (the snapshot ends as the decisions leave it).

    `rng`: the loop's own, carried across cycles; one-off callers get a fresh seeded one.
    `evicted_for`: the driver's memory of evictions across cycles, lent to the snapshot for this
    cycle (the core adds this cycle's evictions to it); without it the snapshot's own is used.
    `recent`: the driver's record of the hour's evictions (what the eviction budgets count), lent
    likewise, so a snapshot built anew does not start the hour empty.
    `stream`: where gangs go as soon as they are placed (the loop binds them while the cycle goes on).
    """
    snap = world.snapshot
    if recent is not None:
        snap.lend_recent(recent)
    if evicted_for is not None:
        snap.evicted_for = evicted_for
        snap.seed_recent(now)  # the eviction budgets' hour, from the memory an earlier leader saved
    rng = rng if rng is not None else np.random.default_rng(0)
    result = run_cycle(snap, profile, now, rng, apply=True, stream=stream)
    for r in result.repartitions:  # on Kubernetes a GPU is cut when its node agent says so, not
        i = snap.node_index(r.node)  # at the action's `recut_s`: until then it serves nothing
        j = next(k for k, g in enumerate(snap.nodes[i].gpus) if g.index == r.gpu)
        snap.recuts[(i, j)] = math.inf
    return Decision(world, profile, now, result)


def _forecast(
    world: World,
    profile: Profile,
    now: float,
    result: CycleResult,
    f: Forecasting,
    finished: Sequence[dict[str, Any]],
) -> Insight:
    if f.budget_s <= 0 or not result.pending:
        return Insight()
    f.runtimes.observe(list(finished), f.default_queue)
    waiting = [p.workload for p in result.pending if p.workload in world.snapshot.workloads]
    try:
        return insights(world.snapshot, profile, now, waiting, f.runtimes, f.budget_s)
    except Exception:
        if not f.courtesy:
            raise
        log.exception("start forecast failed")  # a forecast is a courtesy: it never stops a cycle
        return Insight()
