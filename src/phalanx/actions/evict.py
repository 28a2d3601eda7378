"""Victims and the evict-then-place transaction shared by preempt, reclaim and consolidate.

Evictions are simulated before they are committed: victims are evicted one by one inside a
statement, and after each the preemptor's gang is tried; only if it then fits is anything
committed. Otherwise the statement is discarded and nothing happens.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
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


def victims(
    session: Session,
    eligible: Callable[[WorkloadEntry], bool],
    min_runtime: float,
    queues: Iterable[str] | None = None,
) -> Iterator[Victim]:
    """Evictable units, elastic surplus first, then by least lost work, lower priority, newer, name.

    Lazy: callers stop as soon as enough is freed. With `queues`, only those queues are looked at.
    """
    running = session.snapshot.running
    every = all_victims(session, min_runtime)
    if queues is not None:
        by_queue = _by_queue(session, min_runtime, every)
        lists = [by_queue[q] for q in set(queues) if q in by_queue]
        pool: Iterable[Victim] = (v for _, v in heapq.merge(*lists, key=lambda i: i[0]))
    else:
        pool = every
    return (v for v in pool if v.entry.workload.name in running and eligible(v.entry))


def peek(victims: Iterator[Victim]) -> Iterator[Victim] | None:
    """The same victims, or None if there are none."""
    first = next(victims, None)
    return None if first is None else itertools.chain((first,), victims)


def _by_queue(
    session: Session, min_runtime: float, every: list[Victim]
) -> dict[str, list[tuple[int, Victim]]]:
    """The victim list split by queue, each victim with its rank in the whole list."""
    key = ("victims-by-queue", min_runtime)
    cached = session.memo.get(key)
    if cached is None:
        out: dict[str, list[tuple[int, Victim]]] = {}
        for k, v in enumerate(every):
            out.setdefault(v.entry.workload.queue, []).append((k, v))
        session.memo[key] = cached = out
    return cached  # type: ignore[return-value]


def all_victims(session: Session, min_runtime: float) -> list[Victim]:
    """Every evictable unit, in victim order, as at the first call in the cycle.

    Kept for the cycle: the clock does not move within it, workloads placed during it are too
    new to evict, and `evict_for` skips allocations that have changed since.
    """
    s = session.snapshot
    key = ("victims", min_runtime)
    cached = session.memo.get(key)
    if cached is not None:
        return cached  # type: ignore[return-value]
    out: list[Victim] = []
    now = session.clock
    for entry in s.running.values():
        w = entry.workload
        if not w.preemptible:
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
    session.memo[key] = out
    return out


def evict_for(
    session: Session,
    preemptor: WorkloadEntry,
    tasks: list[Task],
    candidates: Iterable[Victim],
    reason: str,
    allow: Callable[[Victim, list[Victim]], bool] | None = None,
) -> list[Victim] | None:
    """Evict candidates in order until the gang is admitted and fits; commit and return the victims.

    The greedy pass may evict victims on nodes the gang then does not use; a second pass
    evicts only those on the gang's nodes, and is kept if the gang still fits. If it never
    fits, nothing changes.
    """
    taken, used = _attempt(session, preemptor, tasks, candidates, reason, allow, commit=False)
    if taken is None:
        return None
    needed = [v for v in taken if any(a.node in used for a in v.allocs)]
    if len(needed) < len(taken):
        fewer, _ = _attempt(session, preemptor, tasks, needed, reason, allow, commit=True)
        if fewer is not None:
            return fewer
    again, _ = _attempt(session, preemptor, tasks, taken, reason, allow, commit=True)
    return again


def _attempt(
    session: Session,
    preemptor: WorkloadEntry,
    tasks: list[Task],
    candidates: Iterable[Victim],
    reason: str,
    allow: Callable[[Victim, list[Victim]], bool] | None,
    commit: bool,
) -> tuple[list[Victim] | None, set[int]]:
    """Evict in order until the gang fits; (victims, the gang's nodes), committed only with `commit`."""
    stmt = session.statement()
    taken: list[Victim] = []
    gone: set[str] = set()
    for v in candidates:
        current = session.snapshot.allocations
        allocs = [a for a in v.allocs if a.task.name not in gone and current.get(a.task.name) is a]
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
            used = {preemptor.bound[t.name].node for t in tasks}
            if commit:
                stmt.commit()
            else:
                stmt.discard()
            return taken, used
    stmt.discard()
    return None, set()
