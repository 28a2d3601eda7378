"""Place a workload's tasks all-or-nothing, trying the gang planner's domains in order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from phalanx.actions import subgroups
from phalanx.actions.said import asked, free, plural
from phalanx.core.decisions import Reason
from phalanx.core.extension import Domain
from phalanx.core.feasibility import capacity_of
from phalanx.core.model import Task, TaskRequest
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry
from phalanx.core.statement import Statement
from phalanx.core.traits import node_bounds

WHOLE_CLUSTER = Domain("cluster", "", None)


@dataclass(frozen=True, slots=True)
class GangOutcome:
    """Whether the gang was placed; if not, why, in parts a workload of the same shape can reuse
    with its own words (`said`): after what it asks, `scope` (its topology), `free`, `detail`."""

    placed: bool
    summary: str = ""
    reasons: tuple[Reason, ...] = ()
    scope: str = ""
    free: str = ""
    detail: str = ""


def said(entry: WorkloadEntry, tasks: list[Task], outcome: GangOutcome) -> GangOutcome:
    """`outcome` (maybe found for another workload of the same shape) in `entry`'s own words."""
    if outcome.placed or not (outcome.free or outcome.detail or outcome.scope):
        return outcome
    head = asked(entry, tasks) + outcome.scope
    tail = "; ".join(x for x in (outcome.free, outcome.detail) if x)
    summary = f"{head}: {tail}" if tail else head
    return GangOutcome(False, summary, outcome.reasons, outcome.scope, outcome.free, outcome.detail)


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
    total = 0
    for req, task, n in _shapes_of(session, tasks):
        cap, room = capacity_of(session.snapshot, req, session.memo)
        out = refused(session, task) if filtered else None
        if out is not None:
            room = int(np.where(out, 0, cap).sum())
        total += min(n, room)
    return total


def refused(session: Session, task: Task) -> np.ndarray | None:
    """The nodes some filter of the profile refuses `task` outright (`NodeBound`), whatever they
    have free; None when no filter refuses any."""
    out: np.ndarray | None = None
    for f in node_bounds(session.profile.filters):
        m = f.excluded(session, task)
        if m is not None:
            out = m if out is None else out | m
    return out


def _shapes_of(session: Session, tasks: list[Task]) -> list[tuple[TaskRequest, Task, int]]:
    """`_by_shape(session, tasks)`, kept for the cycle by the list's contents: an eviction loop asks
    the bound of one gang after every victim it tries (the effective requests hold for a cycle)."""
    key = ("shapes", id(tasks))
    now = tuple(tasks)
    hit = session.memo.get(key)
    if isinstance(hit, tuple) and hit[0] == now:  # the same tasks (compared by identity first)
        shapes: list[tuple[TaskRequest, Task, int]] = hit[1]
        return shapes
    shapes = _by_shape(session, tasks)
    session.memo[key] = (now, shapes)
    return shapes


def _by_shape(session: Session, tasks: list[Task]) -> list[tuple[TaskRequest, Task, int]]:
    """(effective request, last task, count) per request shape, in order of first appearance.

    A gang's tasks mostly share one request object: they are grouped by it first, so that the
    shape key (a deep tuple, hashed anew each time) is hashed once per request, not per task;
    the eviction loops ask this after every victim.
    """
    # id(request) -> (request, its last task, that task's position, count)
    groups: dict[int, tuple[TaskRequest, Task, int, int]] = {}
    for pos, t in enumerate(tasks):
        g = groups.get(id(t.request))
        groups[id(t.request)] = (t.request, t, pos, 1 if g is None else g[3] + 1)
    merged: dict[tuple[object, ...], tuple[TaskRequest, Task, int, int]] = {}
    for r, t, pos, n in groups.values():
        req = session.effective(r)
        k = req.shape_key
        had = merged.get(k)
        if had is None:
            merged[k] = (req, t, pos, n)
        elif pos > had[2]:  # the shape's last task and its request, as a plain walk would keep
            merged[k] = (req, t, pos, had[3] + n)
        else:
            merged[k] = (had[0], had[1], had[2], had[3] + n)
    return [(req, t, n) for req, t, _, n in merged.values()]


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
        return said(entry, tasks, cached)
    if entry.last_pending is not None and upper_bound(session, tasks) < len(tasks):
        # not even the free capacity is there: keep the reason found last time, do no placement work
        last = entry.last_pending
        kept = entry.cache.get("gang_outcome")
        outcome = (
            kept
            if isinstance(kept, GangOutcome) and kept.summary == last.summary
            else GangOutcome(False, last.summary, last.reasons)
        )
    else:
        outcome = _place_gang(session, entry, tasks)
    if not outcome.placed:
        entry.cache["gang_outcome"] = outcome
        if key is not None:
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
    last_dom = WHOLE_CLUSTER
    # only for a workload that waited before (a backlog's, tried every cycle): worked out for a
    # first try, its capacity pass over every node costs more than the tries it would skip
    room = None if entry.workload.subgroups or entry.last_pending is None else first_room(session, tasks)
    for dom in domains:
        stmt = session.statement() if outer is None else outer
        start = stmt.checkpoint()
        placed = 0
        failed: Task | None = None
        if entry.workload.subgroups:
            failed, placed = subgroups.place(session, entry, tasks, stmt, dom.mask)
        elif room is not None and not (room if dom.mask is None else room & dom.mask).any():
            failed = tasks[0]  # no node of the domain may take the first task: its place() finds none
        for t in tasks if failed is None and not entry.workload.subgroups else ():
            if session.place(t, stmt, dom.mask) is None:
                failed = t
                break
            placed += 1
        if failed is None:
            if outer is None:
                stmt.commit()
            return GangOutcome(True)
        # the first domain's reasons, unless the whole cluster's follow (and replace them)
        if dom.mask is None or (last is None and not dom.then_cluster):
            reasons = tuple(session.why_not(failed, dom.mask)) if explain else ()
            scope, detail = _why(entry, tasks, dom, failed, placed)
            last = GangOutcome(False, "", reasons, scope, detail=detail)
            last_dom = dom
        if outer is None:
            stmt.discard()
        else:
            stmt.rollback(start)
    if last is None:
        w = entry.workload
        level = w.topology.level if w.topology else "domain"
        last = GangOutcome(
            False,
            "",
            (Reason("topology", f"no {level} has enough free capacity for the whole gang"),),
            f", in one {level} (required topology)",
            detail=f"no {level} has room for all {len(tasks)}",
        )
        last_dom = WHOLE_CLUSTER
    if explain:  # what is free, now that the tries are undone
        mask = last_dom.mask if last_dom.mask is not None and last_dom.mask.any() else None
        where = f"{last_dom.level} {last_dom.label}" if mask is not None else ""
        last = GangOutcome(
            False, "", last.reasons, last.scope, free(session, tasks, mask, where), last.detail
        )
    return said(entry, tasks, last)


def first_room(session: Session, tasks: list[Task]) -> np.ndarray | None:
    """The nodes that may take the gang's first task: capacity for its request, less the nodes a
    filter refuses it outright (`NodeBound`); None when every node may.

    A superset of where `session.place` could put it (capacity is an upper bound), so a domain
    without any of these nodes fails at the first task, placing nothing, as a try there would:
    a backlog in a full cluster whose free GPUs sit on reserved nodes fails this way every cycle.
    """
    t = tasks[0]
    cap, total = capacity_of(session.snapshot, session.effective(t.request), session.memo)
    ok = cap > 0
    out = refused(session, t)
    if out is not None:
        ok &= ~out
    return None if total and ok.all() else ok


def _why(entry: WorkloadEntry, tasks: list[Task], dom: Domain, failed: Task, placed: int) -> tuple[str, str]:
    """(scope, detail) of a failed try, in the user's words: a flat gang is a gang, never a
    multi-level one; a subgroup is named as its user named it."""
    n = len(tasks)
    w = entry.workload
    sg = w.subgroup_of(failed.podset) if w.subgroups else None
    if sg is not None and not all(x.implicit for x in w.subgroups):
        where = f"one {sg.topology.level}" if sg.topology is not None else "the workload's domain"
        who = (
            f"the {sg.name.strip('()')} (min {sg.min_available}) do not"
            if sg.implicit
            else f"subgroup {sg.name} (min {sg.min_available}) does not"
        )
        named = [x for x in w.subgroups if not x.implicit]
        scope = f", in {plural(len(named), 'subgroup')} ({', '.join(x.name for x in named)})"
        return scope, (
            f"multi-level gang: {who} fit in {where}; nothing placed ({placed} of {n} fitted before it)"
        )
    if dom.mask is not None and dom.required:
        return (
            f", in one {dom.level} (required topology)",
            f"no {dom.level} has room for all {n}; best try {dom.label}: {placed} of {n} placed",
        )
    return "", (f"{placed} of {n} placed" if n > 1 else "")
