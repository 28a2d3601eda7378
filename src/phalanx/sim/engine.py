"""A virtual-time discrete-event engine: a heap of events ordered by (time, sequence number).

The sequence number (as SimPy's `_eid`) makes the order of simultaneous events the order in
which they were scheduled, so a run is deterministic. The engine never reads the wall clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum


class Kind(IntEnum):
    """Event kinds; at equal times, lower values go first (completions free capacity before arrivals)."""

    NODE_RECOVER = 0
    COMPLETION = 1
    NODE_FAIL = 2
    ARRIVAL = 3
    TICK = 4


@dataclass(order=True, frozen=True, slots=True)
class Event:
    time: float
    kind: Kind
    seq: int
    payload: str = field(compare=False, default="")
    token: int = field(compare=False, default=0)


class Engine:
    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0
        self.now = 0.0

    def schedule(self, time: float, kind: Kind, payload: str = "", token: int = 0) -> Event:
        if time < self.now:
            raise ValueError(f"cannot schedule an event in the past ({time} < {self.now})")
        ev = Event(time, kind, self._seq, payload, token)
        self._seq += 1
        heapq.heappush(self._heap, ev)
        return ev

    def __len__(self) -> int:
        return len(self._heap)

    def peek_time(self) -> float | None:
        return self._heap[0].time if self._heap else None

    def pop_batch(self) -> list[Event]:
        """All events at the earliest time, in (kind, sequence) order; advances the clock."""
        if not self._heap:
            return []
        t = self._heap[0].time
        self.now = t
        out = []
        while self._heap and self._heap[0].time == t:
            out.append(heapq.heappop(self._heap))
        return out

    def run(self, handle: Callable[[list[Event]], None], until: float = float("inf")) -> None:
        while self._heap and self._heap[0].time <= until:
            handle(self.pop_batch())
