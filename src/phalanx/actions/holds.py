"""What holds back the evictions a waiting workload needs: each guard named, with the time it ends.

Preempt and reclaim skip victims that a guard protects: one that has not run the action's
minimum runtime yet, one whose time slice (`quantum`) has not ended, one that is not
preemptible. When a waiting workload finds no room among the other victims, the guarded ones
are tried as well, on the snapshot, and undone: if the workload would then fit, the guards of
the victims it needs become `Hold`s on its Pending decision, each with the time it ends (the
forecast plays the cluster forward to those times). Victims still terminating (evicted, their
devices not free yet) are held the same way, by allocate. Nothing here changes a decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import replace

from phalanx.actions import budget as budgets
from phalanx.actions.evict import (
    NO_GUARDS,
    Guards,
    Victim,
    _attempt,
    checkpoint_origin,
    lost_work,
    repeated_until,
    run_start,
    since_checkpoint,
    victim_order,
    whole_cost,
)
from phalanx.actions.gang import _place_gang
from phalanx.core.decisions import (
    CHECKPOINT,
    MIN_RUNTIME,
    NOT_PREEMPTIBLE,
    REPEAT,
    TERMINATING,
    Hold,
    Pending,
)
from phalanx.core.model import Task
from phalanx.core.session import Session
from phalanx.core.snapshot import Allocation, WorkloadEntry

# what-ifs per action and cycle: each costs about one preemption try
MAX_PER_CYCLE = 8


def budget(session: Session, action: str) -> bool:
    """True (and one less left) while this action may still work out holds this cycle."""
    key = ("holds-budget", action)
    left = session.memo.get(key, MAX_PER_CYCLE)
    assert isinstance(left, int)
    if left <= 0:
        return False
    session.memo[key] = left - 1
    return True


def running_in(session: Session, queues: Iterable[str]) -> list[WorkloadEntry]:
    """Running workloads of these queues, preemptible or not, in name order (per cycle)."""
    memo = session.memo.get("all-running-by-queue")
    by_queue: dict[str, list[WorkloadEntry]]
    if isinstance(memo, dict):
        by_queue = memo
    else:
        by_queue = {}
        for e in session.snapshot.running.values():
            by_queue.setdefault(e.workload.queue, []).append(e)
        session.memo["all-running-by-queue"] = by_queue
    running = session.snapshot.running
    out = [e for q in sorted(set(queues)) for e in by_queue.get(q, ()) if e.name in running and e.bound]
    return sorted(out, key=lambda e: e.name)


def guard_of(
    session: Session,
    action: str,
    entry: WorkloadEntry,
    min_runtime: float,
    detail: str,
    guards: Guards = NO_GUARDS,
    shape: object = None,
    guarded: bool = True,
) -> Hold | None:
    """What protects running `entry` from `action` now: not preemptible, its minimum runtime, and
    (if `guarded`) a recent eviction for this shape or its next checkpoint not yet come.

    Kept for the cycle while the workload's allocations stay the same (the clock and the memory
    of evictions do not move within a cycle), unless an eviction budget is asked: that one is
    spent as the cycle evicts.
    """
    if guarded and guards.budget.on:
        return _guard_of(session, action, entry, min_runtime, detail, guards, shape, guarded)
    memo = session.memo.get("guard-of")
    kept: dict[tuple[object, ...], tuple[WorkloadEntry, Guards, tuple[Allocation, ...], Hold | None]]
    if isinstance(memo, dict):
        kept = memo
    else:
        kept = session.memo["guard-of"] = {}
    key = (id(entry), action, min_runtime, detail, id(guards), shape, guarded)
    try:
        hit = kept.get(key)
    except TypeError:  # a shape that does not hash: not kept
        return _guard_of(session, action, entry, min_runtime, detail, guards, shape, guarded)
    bound = entry.bound
    if (
        hit is not None
        and hit[0] is entry
        and hit[1] is guards
        and len(hit[2]) == len(bound)
        and all(bound.get(a.task.name) is a for a in hit[2])
    ):
        return hit[3]
    out = _guard_of(session, action, entry, min_runtime, detail, guards, shape, guarded)
    kept[key] = (entry, guards, tuple(bound.values()), out)
    return out


def _guard_of(
    session: Session,
    action: str,
    entry: WorkloadEntry,
    min_runtime: float,
    detail: str,
    guards: Guards,
    shape: object,
    guarded: bool,
) -> Hold | None:
    w = entry.workload
    started = run_start(entry)
    now = session.clock
    if not w.preemptible:
        rt = w.estimated_runtime
        return Hold(action, NOT_PREEMPTIBLE, entry.name, started + rt if rt else None, detail=detail)
    if now - started < min_runtime:
        return Hold(action, MIN_RUNTIME, entry.name, started + min_runtime, min_runtime, detail)
    again = repeated_until(session, entry, shape, guards.repeat_window) if guarded else None
    if again is not None:
        return Hold(action, REPEAT, entry.name, again, guards.repeat_window, detail)
    window = guards.checkpoint_window
    ago = since_checkpoint(now, entry) if window > 0 and guarded else None
    if ago is not None and ago > window:
        due = now - ago + entry.workload.checkpoint_interval + settle(window)
        return Hold(action, CHECKPOINT, entry.name, due, window, detail)
    budget = guards.budget
    cost = whole_cost(session, entry, guards) if guarded and budget.by_cost else 0.0
    spent = budgets.spent(session, budget, w.queue, cost=cost) if guarded else None
    if spent is not None:
        guard, frees, limit = spent
        return Hold(action, guard, entry.name, budgets.until(frees), float(limit), f"queue {w.queue}")
    return None


def settle(window: float) -> float:
    """How long after a checkpoint an eviction waiting for it happens: the checkpoint is written."""
    return min(1.0, window / 2)


def aligned(now: float, lower: float, needed: list[Victim], window: float) -> float | None:
    """The first time from `lower` (within one checkpoint interval) when every workload in `needed`
    that checkpoints is at most `window` seconds past a checkpoint; None if there is none."""
    ticks = [
        (checkpoint_origin(v.entry, now), v.entry.workload.checkpoint_interval)
        for v in needed
        if v.entry.bound and v.entry.workload.checkpoint_interval > 0
    ]
    times = {lower}
    for p, t in ticks:
        k = math.ceil((lower - p - settle(window)) / t)
        times.update(p + (k + j) * t + settle(window) for j in (0, 1))
    for at in sorted(x for x in times if x >= lower):
        if all((at - p) - math.floor((at - p) / t) * t <= window for p, t in ticks):
            return at
    return None


def as_victim(session: Session, entry: WorkloadEntry) -> Victim:
    """The running workload as one victim, whole; kept for the cycle while its tasks stay bound.

    A held preemptor asks this of every guarded workload of its queue, each cycle and preemptor
    anew; what it says (the allocations, the work lost by the session's clock) changes only when
    the workload's allocations do, and a what-if that evicts them puts the same ones back.
    """
    memo = session.memo.get("as-victim")
    kept: dict[int, Victim]
    if isinstance(memo, dict):
        kept = memo
    else:
        kept = session.memo["as-victim"] = {}
    hit = kept.get(id(entry))
    bound = entry.bound
    if (
        hit is not None
        and hit.entry is entry
        and len(hit.allocs) == len(bound)
        and all(bound.get(a.task.name) is a for a in hit.allocs)
    ):
        return hit
    allocs = tuple(sorted(bound.values(), key=lambda a: (-a.since, a.task.name)))
    v = Victim(entry, allocs, lost_work(session, entry, allocs), False, run_start(entry))
    kept[id(entry)] = v
    return v


def held_back(
    session: Session,
    entry: WorkloadEntry,
    gang: list[Task],
    free: Iterable[Victim],
    guarded: list[tuple[Victim, Hold]],
    allow: Callable[[Victim, list[Victim]], bool] | None = None,
    window: float = 0.0,
) -> tuple[Hold, ...]:
    """The holds of the guarded victims the gang would need, if with them it fits (tried, undone).

    With a checkpoint `window`, the victims needed that checkpoint are held until the first time
    (after the other guards end) when all of them are just past a checkpoint at once (None: not
    within an interval), so that the driver can run a cycle then.
    """
    if not guarded:
        return ()
    ordered = sorted(guarded, key=lambda vh: (vh[1].until is None, vh[1].until or 0.0, victim_order(vh[0])))
    hold = {id(v): h for v, h in guarded}
    taken, used = _attempt(
        session, entry, gang, [*free, *(v for v, _ in ordered)], "what-if", allow, commit=False
    )
    if taken is None:
        return ()
    needed = [v for v in taken if any(a.node in used for a in v.allocs)]
    out = [hold[id(v)] for v in needed if id(v) in hold]
    if window <= 0 or not any(h.guard == CHECKPOINT for h in out):
        return tuple(out)
    now = session.clock
    lower = max([now, *(h.until for h in out if h.guard != CHECKPOINT and h.until is not None)])
    at = aligned(now, lower, needed, window)
    rest = [h for h in out if h.guard != CHECKPOINT]
    action = out[0].action
    waits = [
        Hold(action, CHECKPOINT, v.name, at, window, hold[id(v)].detail if id(v) in hold else "")
        for v in needed
        if since_checkpoint(now, v.entry) is not None
    ]
    return tuple(rest + waits)


def terminating(session: Session, entry: WorkloadEntry, gang: list[Task]) -> tuple[Hold, ...]:
    """If the gang fits once the pods still terminating are gone: a hold for each on its nodes."""
    s = session.snapshot
    if not s.leaving or not gang or not budget(session, "allocate"):
        return ()
    leaving = list(s.leaving)
    for lv in leaving:
        s.let_go(lv)
    used: set[int] = set()
    try:
        stmt = session.statement()
        try:
            if _place_gang(session, entry, gang, outer=stmt, explain=False).placed:
                used = {entry.bound[t.name].node for t in gang}
        finally:
            stmt.discard()
    finally:
        for lv in reversed(leaving):
            s.let_go(lv, gone=False)
    return tuple(Hold("allocate", TERMINATING, lv.owner, lv.ends) for lv in leaving if lv.node in used)


def note(session: Session, entry: WorkloadEntry, holds: tuple[Hold, ...]) -> None:
    """Put the holds on the workload's Pending decision of this cycle (made now if it has none)."""
    if not holds:
        return
    base = session.pending.get(entry.name) or entry.last_pending
    if base is None:
        base = Pending(entry.name, "waits for room that a guard holds back", unschedulable=True)
    session.pending[entry.name] = replace(base, holds=holds)
