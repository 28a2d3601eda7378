"""Backfill: after allocate, place smaller workloads that fit now, smallest first.

It only uses capacity that is free after allocate's decisions, so it never displaces
what allocate placed. Workloads allocate already tried and could not place are not
retried (nothing got freer); those it skipped (strict FIFO) get their chance here.
"""

from __future__ import annotations

from phalanx.actions.allocate import allocate_workload, no_room
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry


class Backfill:
    name = "backfill"

    def execute(self, session: Session) -> None:
        waiting = [
            e
            for e in session.ordered_pending()
            if len(e.bound) < e.workload.gang_size and e.name not in session.attempted
        ]
        waiting.sort(key=size_key)
        for entry in waiting:
            if not session.parked(entry) and not no_room(session, entry):
                allocate_workload(session, entry)


def size_key(e: WorkloadEntry) -> tuple[object, ...]:
    key = e.cache.get("size")
    if key is None:
        cpu = sum(t.request.cpu_milli for t in e.tasks)
        key = (e.workload.total_gpu_milli, cpu, e.workload.creation_time, e.name)
        e.cache["size"] = key
    return key  # type: ignore[return-value]
