"""Victims and the evict-then-place transaction shared by preempt, reclaim and consolidate.

Evictions are simulated before they are committed: victims are evicted one by one inside a
statement, and after each the preemptor's gang is tried; only if it then fits is anything
committed. Otherwise the statement is discarded and nothing happens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.actions.gang import _place_gang, upper_bound
from phalanx.core.model import Task
from phalanx.core.session import Session
from phalanx.core.snapshot import Allocation, WorkloadEntry


@dataclass(frozen=True, slots=True)
class Victim:
    """Tasks to evict together: a whole workload, or the optional tasks of an elastic one."""

    entry: WorkloadEntry
    allocs: tuple[Allocation, ...]
    lost_work: float  # GPU-seconds since the last checkpoint
    shrink: bool  # only tasks beyond min_available (the workload keeps running)

    @property
    def name(self) -> str:
        return self.entry.name


def run_start(entry: WorkloadEntry) -> float:
    return min(a.since for a in entry.bound.values())


def lost_work(session: Session, entry: WorkloadEntry, allocs: tuple[Allocation, ...]) -> float:
    """GPUs x seconds since the last checkpoint (since the start when checkpoints are unknown)."""
    now = session.clock
    interval = entry.workload.checkpoint_interval
    total = 0.0
    for a in allocs:
        since = a.since
        last = since + math.floor((now - since) / interval) * interval if interval > 0 else since
        gpus = (
            len(a.devices.gpus) * a.devices.milli / 1000
            if a.devices.mig is None
            else a.devices.mig_compute / 7
        )
        total += max(gpus, 0.001) * max(0.0, now - last)
    return total


def victims(session: Session, eligible: Callable[[WorkloadEntry], bool], min_runtime: float) -> list[Victim]:
    """Evictable units, elastic surplus first, then by least lost work, lower priority, newer, name."""
    out: list[Victim] = []
    now = session.clock
    for entry in session.snapshot.running.values():
        w = entry.workload
        if not w.preemptible or not eligible(entry):
            continue
        if now - run_start(entry) < min_runtime:
            continue
        bound = sorted(entry.bound.values(), key=lambda a: (-a.since, a.task.name))
        extra = len(bound) - w.gang_size
        if extra > 0:
            allocs = tuple(bound[:extra])
            out.append(Victim(entry, allocs, lost_work(session, entry, allocs), True))
        allocs = tuple(bound)
        out.append(Victim(entry, allocs, lost_work(session, entry, allocs), False))
    out.sort(
        key=lambda v: (not v.shrink, v.lost_work, v.entry.workload.priority, -run_start(v.entry), v.name)
    )
    return out


def evict_for(
    session: Session,
    preemptor: WorkloadEntry,
    tasks: list[Task],
    candidates: list[Victim],
    reason: str,
    allow: Callable[[Victim, list[Victim]], bool] | None = None,
) -> list[Victim] | None:
    """Evict candidates in order until the gang is admitted and fits; commit and return the victims.

    If it never fits, nothing changes.
    """
    stmt = session.statement()
    taken: list[Victim] = []
    gone: set[str] = set()
    for v in candidates:
        allocs = [
            a for a in v.allocs if a.task.name not in gone and a.task.name in session.snapshot.allocations
        ]
        if not allocs or (allow is not None and not allow(v, taken)):
            continue
        for a in allocs:
            stmt.evict(a, reason)
            gone.add(a.task.name)
        taken.append(v)
        if upper_bound(session, tasks) < len(tasks) or session.admit(preemptor, tasks) is not None:
            continue
        outcome = _place_gang(session, preemptor, tasks, outer=stmt)
        if outcome.placed:
            stmt.commit()
            return taken
    stmt.discard()
    return None
