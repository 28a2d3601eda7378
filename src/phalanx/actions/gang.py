"""Place a workload's tasks all-or-nothing, trying the gang planner's domains in order."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.core.decisions import Reason
from phalanx.core.extension import Domain
from phalanx.core.model import Task
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry

WHOLE_CLUSTER = Domain("cluster", "", None)


@dataclass(frozen=True, slots=True)
class GangOutcome:
    placed: bool
    summary: str = ""
    reasons: tuple[Reason, ...] = ()


def gang_tasks(entry: WorkloadEntry) -> tuple[list[Task], list[Task]]:
    """(tasks needed to reach min_available, the optional rest), biggest GPU demand first."""
    unbound = sorted(entry.unbound, key=lambda t: (-t.request.gpu.total_milli, -t.request.cpu_milli, t.name))
    need = max(0, entry.workload.gang_size - len(entry.bound))
    return unbound[:need], unbound[need:]


def place_gang(session: Session, entry: WorkloadEntry, tasks: list[Task]) -> GangOutcome:
    """Place all `tasks` in one domain, or none of them."""
    if not tasks:
        return GangOutcome(True)
    planner = session.profile.gang_planner
    domains = planner.domains(session, entry, tasks) if planner is not None else iter((WHOLE_CLUSTER,))
    last: GangOutcome | None = None
    for dom in domains:
        stmt = session.statement()
        placed = 0
        failed: Task | None = None
        for t in tasks:
            if session.place(t, stmt, dom.mask) is None:
                failed = t
                break
            placed += 1
        if failed is None:
            stmt.commit()
            return GangOutcome(True)
        if last is None or dom.mask is None:
            reasons = tuple(session.why_not(failed, dom.mask))
            if dom.mask is not None and dom.required:
                summary = (
                    f"required topology: no {dom.level} can host all {len(tasks)} tasks; "
                    f"best try {dom.label}: {placed} of {len(tasks)} placed"
                )
            elif len(tasks) > 1:
                summary = f"gang of {len(tasks)} tasks does not fit: {placed} of {len(tasks)} placed"
            else:
                summary = f"task {failed.name} does not fit"
            last = GangOutcome(False, summary, reasons)
        stmt.discard()
    if last is None:
        w = entry.workload
        level = w.topology.level if w.topology else "domain"
        return GangOutcome(
            False,
            f"required topology: no {level} can host all {len(tasks)} tasks",
            (Reason("topology", f"no {level} has enough free capacity for the whole gang"),),
        )
    return last
