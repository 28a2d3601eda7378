"""Place a workload's tasks all-or-nothing, trying the gang planner's domains in order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from phalanx.actions import subgroups
from phalanx.core.decisions import Reason
from phalanx.core.extension import Domain, NodeBound
from phalanx.core.feasibility import node_capacity
from phalanx.core.model import Task, TaskRequest
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry
from phalanx.core.statement import Statement

WHOLE_CLUSTER = Domain("cluster", "", None)


@dataclass(frozen=True, slots=True)
class GangOutcome:
    placed: bool
    summary: str = ""
    reasons: tuple[Reason, ...] = ()


def gang_tasks(entry: WorkloadEntry) -> tuple[list[Task], list[Task]]:
    """(tasks needed to reach min_available, the optional rest), biggest GPU demand first."""
    cached = entry.cache.get("order")
    if isinstance(cached, list):
        order: list[Task] = cached
    else:
        order = sorted(entry.tasks, key=lambda t: (-t.request.gpu.total_milli, -t.request.cpu_milli, t.name))
        entry.cache["order"] = order
    if entry.workload.subgroups:
        return subgroups.split(entry, order)
    unbound = [t for t in order if t.name not in entry.bound] if entry.bound else list(order)
    need = max(0, entry.workload.gang_size - len(entry.bound))
    return unbound[:need], unbound[need:]


def gang_key(
    session: Session, entry: WorkloadEntry, tasks: list[Task] | None = None
) -> tuple[object, ...] | None:
    """What decides whether a gang fits: its tasks' effective requests and its topology constraint."""
    topo = entry.workload.topology
    if topo is not None and topo.required and entry.bound:
        return None  # tied to where its running tasks are
    if not entry.bound and session.profile.gpu_sharing:
        return entry.demand_key  # same requests, counts and gang size: the same gang
    memo = ("gang_key", session.profile.gpu_sharing, len(entry.bound))
    key = entry.cache.get(memo)
    if key is None:
        if tasks is None:
            tasks = gang_tasks(entry)[0]
        shapes: dict[tuple[object, ...], int] = {}
        for t in tasks:
            k = session.effective(t.request).shape_key
            shapes[k] = shapes.get(k, 0) + 1
        key = (tuple(sorted(shapes.items(), key=repr)), topo, entry.workload.subgroups)
        entry.cache[memo] = key
    return key  # type: ignore[return-value]


def upper_bound(session: Session, tasks: list[Task], filtered: bool = False) -> int:
    """At most how many of `tasks` the free capacity could hold (cheap, never too low).

    `filtered`: leave out the nodes a filter of the profile refuses the task outright
    (`NodeBound`), e.g. those reserved for a large gang; a tighter bound, still never too low.
    """
    counts: dict[tuple[object, ...], tuple[TaskRequest, Task, int]] = {}
    for t in tasks:
        req = session.effective(t.request)
        k = req.shape_key
        counts[k] = (req, t, counts[k][2] + 1 if k in counts else 1)
    bounds = [f for f in session.profile.filters if filtered and callable(getattr(f, "excluded", None))]
    total = 0
    for req, task, n in counts.values():
        cap = node_capacity(session.snapshot, req)
        for f in bounds:
            out = cast(NodeBound, f).excluded(session, task)
            if out is not None:
                cap = np.where(out, 0, cap)
        total += min(n, int(cap.sum()))
    return total


def place_gang(session: Session, entry: WorkloadEntry, tasks: list[Task]) -> GangOutcome:
    """Place all `tasks` in one domain, or none of them.

    A gang shape that did not fit earlier in this cycle does not fit now either (placements
    only take capacity; evictions clear this memo), so it is not tried again.
    """
    if not tasks:
        return GangOutcome(True)
    key = gang_key(session, entry, tasks)
    if key is not None and key in session.no_room:
        cached: GangOutcome = session.no_room[key]
        return cached
    if entry.last_pending is not None and upper_bound(session, tasks) < len(tasks):
        # not even the free capacity is there: keep the reason found last time, do no placement work
        last = entry.last_pending
        outcome = GangOutcome(False, last.summary, last.reasons)
    else:
        outcome = _place_gang(session, entry, tasks)
    if not outcome.placed and key is not None:
        session.no_room[key] = outcome
    return outcome


def _place_gang(
    session: Session,
    entry: WorkloadEntry,
    tasks: list[Task],
    outer: Statement | None = None,
    explain: bool = True,
) -> GangOutcome:
    """Try the planner's domains in order; with `outer`, work inside that statement (a preemption).

    `explain=False` skips working out why a failed try failed (costly): eviction simulations
    try many times and only need to know whether the gang fits.
    """
    planner = session.profile.gang_planner
    if entry.workload.subgroups:  # each subgroup packs itself, inside the workload's own level
        domains = iter(subgroups.outer_domains(session, entry, tasks))
    else:
        domains = planner.domains(session, entry, tasks) if planner is not None else iter((WHOLE_CLUSTER,))
    last: GangOutcome | None = None
    for dom in domains:
        stmt = session.statement() if outer is None else outer
        start = stmt.checkpoint()
        placed = 0
        failed: Task | None = None
        if entry.workload.subgroups:
            failed, placed = subgroups.place(session, entry, tasks, stmt, dom.mask)
        for t in tasks if not entry.workload.subgroups else ():
            if session.place(t, stmt, dom.mask) is None:
                failed = t
                break
            placed += 1
        if failed is None:
            if outer is None:
                stmt.commit()
            return GangOutcome(True)
        if last is None or dom.mask is None:
            reasons = tuple(session.why_not(failed, dom.mask)) if explain else ()
            sg = entry.workload.subgroup_of(failed.podset) if entry.workload.subgroups else None
            if sg is not None:
                where = f"one {sg.topology.level}" if sg.topology is not None else "the workload's domain"
                summary = (
                    f"multi-level gang: subgroup {sg.name} (min {sg.min_available}) does not fit in "
                    f"{where}; nothing placed ({placed} of {len(tasks)} tasks fitted before it)"
                )
            elif dom.mask is not None and dom.required:
                summary = (
                    f"required topology: no {dom.level} can host all {len(tasks)} tasks; "
                    f"best try {dom.label}: {placed} of {len(tasks)} placed"
                )
            elif len(tasks) > 1:
                summary = f"gang of {len(tasks)} tasks does not fit: {placed} of {len(tasks)} placed"
            else:
                summary = "task does not fit"
            last = GangOutcome(False, summary, reasons)
        if outer is None:
            stmt.discard()
        else:
            stmt.rollback(start)
    if last is None:
        w = entry.workload
        level = w.topology.level if w.topology else "domain"
        return GangOutcome(
            False,
            f"required topology: no {level} can host all {len(tasks)} tasks",
            (Reason("topology", f"no {level} has enough free capacity for the whole gang"),),
        )
    return last
