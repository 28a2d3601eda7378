"""Workload order: higher priority first (age and name break ties in the session)."""

from __future__ import annotations

import itertools

from phalanx.core.extension import ChangeForecast, CycleHooks
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry

# (level, place in the level's list), with `within: queue`: state kept across cycles in the entry
QUEUE_PLACE = "las-queue"
EPS = 1e-6  # GPU-seconds: a workload that reaches a threshold by float arithmetic is past it


class PriorityOrder:
    name = "priority"
    static = True  # depends only on the workload: sort keys may be memoised
    cycle_static = True
    natural = True  # the snapshot's natural order (priority, age, name)

    def key(self, session: Session, entry: WorkloadEntry) -> tuple[float | int | str, ...]:
        return (-entry.workload.priority,)


class LasOrder(CycleHooks, ChangeForecast):
    """Least attained service (Tiresias' discretised 2D-LAS): fewer GPU-seconds received, earlier.

    Attained service is GPUs x time run, kept by the driver (`Snapshot.advance`). It is
    discretised into levels by `thresholds` (GPU-seconds); within a level, age decides. With
    the `preempt` action (`by: order`), a workload in a lower level preempts higher levels.
    """

    name = "las"
    static = False
    natural = False
    # whether any LAS order of this process keeps places (`within: queue`): a driver whose cycles
    # start afresh then forgets every workload's place each cycle (`forget`); none needs forgetting else
    keeps_places = False

    @property
    def cycle_static(self) -> bool:
        """Attained service moves only between cycles; a place in a level's list may move in one."""
        return self.within == "arrival"

    @property
    def keyed_by_attained(self) -> bool:
        """The key is the level of the entry's attained service alone (not so for a place in a list)."""
        return self.within == "arrival"

    def __init__(self, thresholds: list[float] | None = None, within: str = "arrival") -> None:
        self.thresholds = sorted(thresholds if thresholds is not None else [3600.0, 36_000.0])
        if any(t <= 0 for t in self.thresholds):
            raise ValueError("thresholds must be > 0 GPU-seconds")
        if within not in ("arrival", "queue"):
            raise ValueError("within must be 'arrival' or 'queue'")
        self.within = within
        self._seq = itertools.count()

    def level(self, entry: WorkloadEntry) -> int:
        return sum(1 for t in self.thresholds if entry.attained >= t - EPS)

    def key(self, session: Session, entry: WorkloadEntry) -> tuple[float | int | str, ...]:
        if self.within == "queue" and QUEUE_PLACE in entry.cache:
            return _place(entry)
        return (self.level(entry),)

    # `within: queue` (Tiresias' simulator): one FIFO list per level. Arrivals join the end of
    # level 0, a workload that crosses a threshold the end of its new level; after each re-plan
    # the workloads left waiting move to the back of their list, keeping their order, so running
    # ones stay ahead of waiting ones in their level. Called by the `replan` action.
    def begin_cycle(self, entries: list[WorkloadEntry]) -> None:
        if self.within != "queue":
            return
        LasOrder.keeps_places = True
        known = sorted((e for e in entries if QUEUE_PLACE in e.cache), key=_place)
        fresh = sorted(
            (e for e in entries if QUEUE_PLACE not in e.cache),
            key=lambda e: (e.workload.creation_time, e.name),
        )
        for e in [*fresh, *known]:
            level = self.level(e)
            if QUEUE_PLACE not in e.cache or _place(e)[0] != level:
                e.cache[QUEUE_PLACE] = (level, next(self._seq))

    def end_cycle(self, entries: list[WorkloadEntry], running: set[str]) -> None:
        if self.within != "queue":
            return
        for e in sorted((e for e in entries if e.name not in running), key=_place):
            e.cache[QUEUE_PLACE] = (_place(e)[0], next(self._seq))

    @staticmethod
    def forget(entry: WorkloadEntry) -> None:
        """Forget the workload's place in its level's list (`within: queue`), the one thing this
        order keeps across cycles: the next `begin_cycle` files it as it files an arrival. For a
        driver whose cycles start afresh (the adapter's, from what the API says)."""
        entry.cache.pop(QUEUE_PLACE, None)

    def next_change(self, entry: WorkloadEntry, now: float) -> float | None:
        """When a running workload crosses its next threshold (its rank changes by itself then)."""
        rate = entry.gpu_milli / 1000
        if rate <= 0:
            return None
        got = entry.attained  # read once: a property, asked of every running workload each cycle
        for t in self.thresholds:  # in order: the first above is the next
            if t > got + EPS:
                return now + (t - got) / rate
        return None


def _place(e: WorkloadEntry) -> tuple[int, int]:
    at = e.cache[QUEUE_PLACE]
    assert isinstance(at, tuple)
    return at


class SrtfOrder:
    """Shortest remaining time first, where run times are known (`estimated_runtime`); unknown go last."""

    name = "srtf"
    static = False
    cycle_static = True  # run time executed moves only between cycles
    natural = False

    def key(self, session: Session, entry: WorkloadEntry) -> tuple[float | int | str, ...]:
        est = entry.workload.estimated_runtime
        return (max(0.0, est - entry.executed) if est is not None else float("inf"),)
