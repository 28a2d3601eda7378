"""Backfill: after allocate, place smaller workloads that fit now, smallest first.

It only uses capacity that is free after allocate's decisions, so it never displaces
what allocate placed. Workloads allocate already tried and could not place are not
retried (nothing got freer); those it skipped (strict FIFO) get their chance here.
"""

from __future__ import annotations

from phalanx.actions.allocate import allocate_workload
from phalanx.core.session import Session


class Backfill:
    name = "backfill"

    def execute(self, session: Session) -> None:
        waiting = [
            e
            for e in session.snapshot.pending_workloads()
            if len(e.bound) < e.workload.gang_size and e.name not in session.attempted
        ]
        waiting.sort(
            key=lambda e: (
                e.workload.total_gpu_milli,
                sum(t.request.cpu_milli for t in e.tasks),
                e.workload.creation_time,
                e.name,
            )
        )
        for entry in waiting:
            allocate_workload(session, entry)
