"""When the clock alone changes a cycle's answer: the core's wake-up.

A cycle that leaves work waiting says when it must look again even if nothing else happens
(`CycleResult.wake`): the end of a guard that holds a waiting workload's victims back (min_runtime,
quantum, checkpoint, repeat, a victim's grace period), a running workload whose rank changes by
itself while something waits (LAS crossing a level: the order's `ChangeForecast`), and what an
action asks for itself (`Session.wake_at`: reserve's `min_wait`). Both drivers read it: the replay
runs a cycle then, the adapter's loop sleeps until then instead of cycling every period while
work waits. Drift that has no one moment (fair-share history decaying, SRTF's remaining time of
running work) is not a wake-up: the replay never cycled for it, the adapter looks again every
`quiet_recheck_s`.

Rank changes are kept across cycles (`RankWakes`, on the snapshot): a run read from the
snapshot's clock crosses its next level at a time fixed until its GPUs or its service change, so
the adapter's cycle looks only at the workloads whose run moved (`Snapshot.ranks_moved`), not at
every running one. A snapshot whose every running workload moved (the simulator's `advance`) is
looked at whole, as before.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from phalanx.core.extension import ChangeForecast
from phalanx.core.traits import change_forecasts

if TYPE_CHECKING:
    from phalanx.core.decisions import CycleResult
    from phalanx.core.session import Session
    from phalanx.core.snapshot import Snapshot, WorkloadEntry


@dataclass(frozen=True, slots=True)
class Wake:
    """The next moment the clock alone may change what a cycle decides, and why."""

    at: float
    why: str


Token = tuple[float, float | None, int]


def _token(entry: WorkloadEntry) -> Token:
    """What a running workload's next rank change is worked out from: it holds while these do."""
    return (entry.attained_base, entry.run_since, entry.gpu_milli)


def _current(entry: WorkloadEntry | None, token: Token) -> bool:
    return entry is not None and _token(entry) == token


def _next_change(forecasts: list[ChangeForecast], entry: WorkloadEntry, now: float) -> float:
    if len(forecasts) == 1:  # the usual case, asked of every running workload after each advance
        t = forecasts[0].next_change(entry, now)
        return math.inf if t is None else t
    return min(
        (t for f in forecasts if (t := f.next_change(entry, now)) is not None),
        default=math.inf,
    )


@dataclass(slots=True)
class RankWakes:
    """Each running workload's next rank change, in a heap; stale entries are dropped when seen."""

    heap: list[tuple[float, int, str, Token]] = field(default_factory=list)
    epoch: int = -1  # the snapshot's `service_epoch` the heap was built at
    seq: itertools.count[int] = field(default_factory=itertools.count)  # ties never compare tokens

    def earliest(
        self, snap: Snapshot, forecasts: list[ChangeForecast], now: float
    ) -> tuple[float, str] | None:
        """The first rank change after `now`, and whose; None if no running workload's rank moves."""
        running = snap.running
        if self.epoch != snap.service_epoch:
            self.epoch = snap.service_epoch
            self.heap = [
                (t, next(self.seq), name, _token(e))
                for name, e in running.items()
                if (t := _next_change(forecasts, e, now)) < math.inf
            ]
            heapq.heapify(self.heap)
        else:
            for name in snap.ranks_moved:
                e = running.get(name)
                if e is not None and (t := _next_change(forecasts, e, now)) < math.inf:
                    heapq.heappush(self.heap, (t, next(self.seq), name, _token(e)))
            if len(self.heap) > 2 * len(running) + 64:  # stale entries piled up below the top
                self.heap = [x for x in self.heap if _current(running.get(x[2]), x[3])]
                heapq.heapify(self.heap)
        snap.ranks_moved.clear()
        heap = self.heap
        while heap:
            t, _, name, token = heap[0]
            e = running.get(name)
            if e is None or not _current(e, token):
                heapq.heappop(heap)  # no longer running, or moved since: a fresher entry is in the heap
            elif t <= now:
                heapq.heappop(heap)  # crossed by now: its next level, if any, from here
                t = _next_change(forecasts, e, now)
                if now < t < math.inf:
                    heapq.heappush(heap, (t, next(self.seq), name, token))
            else:
                return t, name
        return None


def next_wake(session: Session, result: CycleResult) -> Wake | None:
    """The earliest of the cycle's clock-bound guards, rank changes and actions' own wake-ups."""
    now = session.clock
    best: Wake | None = session.wake
    for p in result.pending:
        for h in p.holds:
            if h.until is not None and h.until > now and (best is None or h.until < best.at):
                best = Wake(h.until, f"{h.action}: {h.guard} of {h.victim} ends (holds {p.workload})")
    snap = session.snapshot
    forecasts = change_forecasts(session.profile.order)
    if not forecasts:
        snap.ranks_moved.clear()  # no order whose ranks move: nothing will read them
    elif snap.pending_workloads():
        if snap.rank_wakes is None:
            snap.rank_wakes = RankWakes()
        first = snap.rank_wakes.earliest(snap, forecasts, now)
        if first is not None and first[0] > now and (best is None or first[0] < best.at):
            best = Wake(first[0], f"the rank of {first[1]} changes")
    return best
