"""Workload order: higher priority first (age and name break ties in the session)."""

from __future__ import annotations

from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry


class PriorityOrder:
    name = "priority"
    static = True  # depends only on the workload: sort keys may be memoised
    natural = True  # the snapshot's natural order (priority, age, name)

    def key(self, session: Session, entry: WorkloadEntry) -> tuple[float | int | str, ...]:
        return (-entry.workload.priority,)
