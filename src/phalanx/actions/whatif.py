"""What would let a waiting workload start now: the smallest change, each one checked.

Every suggestion is tried on the snapshot inside a statement that is then rolled back: fewer
tasks of the gang, another leaf queue whose quota admits it, or one running workload
preempted. Only what was seen to work is said; a victim that a guard of the profile protects
(its minimum runtime, say) is said with that guard and when it ends, since the scheduler will
not preempt it before then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from phalanx.actions.gang import _place_gang, gang_tasks, upper_bound
from phalanx.core.decisions import sim_time
from phalanx.core.model import Task
from phalanx.core.profile import Profile
from phalanx.core.session import Session
from phalanx.core.snapshot import Snapshot, WorkloadEntry


def _fits(session: Session, entry: WorkloadEntry, tasks: list[Task]) -> bool:
    """The tasks fit now (capacity only), tried and undone."""
    if upper_bound(session, tasks) < len(tasks):
        return False
    stmt = session.statement()
    try:
        return _place_gang(session, entry, tasks, outer=stmt, explain=False).placed
    finally:
        stmt.discard()


def fits_now_if(
    snap: Snapshot,
    profile: Profile,
    now: float,
    name: str,
    max_victims: int = 30,
    when: Callable[[float], str] = sim_time,
) -> list[str]:
    """Changes that would let workload `name` start now, smallest first; empty if none was found.

    `when` says a time (a guard's end) as the driver shows times.
    """
    entry = snap.workloads[name]
    session = Session(snap, profile, now, np.random.default_rng(0))
    gang, _ = gang_tasks(entry)
    if not gang:
        return []
    out: list[str] = []
    fits = _fits(session, entry, gang)
    refused = session.admit(entry, gang) if profile.admission else None
    if fits and refused is None:
        return ["fits now: it waits only for its turn in the order"]
    if fits and refused is not None and snap.queues is not None:
        for q in sorted(
            q for q in snap.queues.queues if snap.queues.is_leaf(q) and q != entry.workload.queue
        ):
            moved = WorkloadEntry(replace(entry.workload, queue=q), entry.tasks)
            if session.admit(moved, gang) is None:
                out.append(f"fits now in queue {q}")
                break
    if not fits:
        per = gang[0].request.gpu.total_milli / 1000 if gang else 0
        for k in range(1, len(gang)):
            if _fits(session, entry, gang[: len(gang) - k]):
                what = f"{k * per:g} fewer GPUs" if per else f"{k} fewer tasks"
                out.append(f"fits now with {what} ({len(gang) - k} of {len(gang)} tasks)")
                break
        out += _one_victim(session, entry, gang, max_victims, when)
    return out


def _one_victim(
    session: Session, entry: WorkloadEntry, gang: list[Task], limit: int, when: Callable[[float], str]
) -> list[str]:
    """The first running workload (lowest priority, then newest) whose preemption alone makes room."""
    running = [
        e for e in session.snapshot.running.values() if e.workload.preemptible and e.name != entry.name
    ]
    running.sort(key=lambda e: (e.workload.priority, -min(a.since for a in e.bound.values()), e.name))
    for victim in running[:limit]:
        stmt = session.statement()
        try:
            for a in list(victim.bound.values()):
                stmt.evict(a, "what-if")
            if (
                upper_bound(session, gang) >= len(gang)
                and _place_gang(session, entry, gang, outer=stmt, explain=False).placed
            ):
                said = (
                    f"fits now if workload {victim.name} (priority {victim.workload.priority}) is preempted"
                )
                held = [
                    h
                    for h in (entry.last_pending.holds if entry.last_pending else ())
                    if h.victim == victim.name
                ]
                if held:
                    h = held[0]
                    until = f" until {when(h.until)}" if h.until is not None else ""
                    said += f", which the profile's {h.action} holds back ({h.guard}{until})"
                return [said]
        finally:
            stmt.discard()
    return []
