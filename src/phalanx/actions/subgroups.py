"""Multi-level gangs: a workload of subgroups, each with its own minimum and topology constraint.

The workload is one gang at the top (every subgroup gets its minimum, or none is placed: the
caller's statement is rolled back), and each subgroup is a gang inside the workload's domain:
its tasks go into one domain of its own level (required), or preferably so (preferred). The
domains of a subgroup are tried tightest first within the workload's domain, subgroups with
the most GPU demand first; a subgroup that fits nowhere fails the whole workload there.
"""

from __future__ import annotations

import numpy as np

from phalanx.core.cluster import BoolArray
from phalanx.core.extension import Domain
from phalanx.core.feasibility import UNBOUNDED, node_capacity
from phalanx.core.model import SubGroup, Task, TaskRequest
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry
from phalanx.core.statement import Statement

MAX_DOMAINS = 8  # per subgroup and outer domain: enough to step around a busy rack, bounded work
MAX_OUTER = 32  # domains of the workload's own level tried, tightest first
MAX_TRIES = 64  # subgroup placements per domain of the workload (backtracking included)


def split(entry: WorkloadEntry, order: list[Task]) -> tuple[list[Task], list[Task]]:
    """(tasks each subgroup needs to reach its minimum, the optional rest), subgroup by subgroup."""
    w = entry.workload
    need: list[Task] = []
    rest: list[Task] = []
    for sg in _by_demand(w.subgroups, order):
        mine = [t for t in order if t.podset in sg.podsets]
        bound = sum(1 for t in mine if t.name in entry.bound)
        unbound = [t for t in mine if t.name not in entry.bound]
        k = max(0, sg.min_available - bound)
        need += unbound[:k]
        rest += unbound[k:]
    return need, rest


def _by_demand(subgroups: tuple[SubGroup, ...], order: list[Task]) -> list[SubGroup]:
    def demand(sg: SubGroup) -> int:
        return sum(t.request.gpu.total_milli for t in order if t.podset in sg.podsets)

    return sorted(subgroups, key=lambda sg: (-demand(sg), sg.name))


def place(
    session: Session, entry: WorkloadEntry, tasks: list[Task], stmt: Statement, mask: BoolArray | None
) -> tuple[Task | None, int]:
    """Place `tasks` (from `split`) subgroup by subgroup inside `mask`; (the task that failed, or
    None, and how many were placed in the try that got furthest). On failure the caller rolls
    `stmt` back: nothing stays.

    Subgroups with a required level go first (the most GPUs first), then the others. A subgroup
    that fits in no domain of its own sends the one before it to its next domain (backtracking,
    at most `MAX_TRIES` subgroup placements per call)."""
    order = sorted(
        _by_demand(entry.workload.subgroups, tasks),
        key=lambda sg: 0 if sg.topology is not None and sg.topology.required else 1,
    )  # stable: by demand within each kind
    groups = [(sg, mine) for sg in order if (mine := [t for t in tasks if t.podset in sg.podsets])]
    best: list[tuple[int, Task | None]] = [(-1, None)]
    if not groups:
        return None, 0
    if _from(session, entry, groups, 0, 0, stmt, mask, [MAX_TRIES], best):
        return None, len(tasks)
    return best[0][1] or groups[0][1][0], max(0, best[0][0])


def _from(
    session: Session,
    entry: WorkloadEntry,
    groups: list[tuple[SubGroup, list[Task]]],
    k: int,
    placed: int,
    stmt: Statement,
    mask: BoolArray | None,
    budget: list[int],
    best: list[tuple[int, Task | None]],
) -> bool:
    """Place groups[k:] (groups[:k] are placed, `placed` tasks); True when all are."""
    if k == len(groups):
        return True
    sg, mine = groups[k]
    for dom in domains(session, entry, sg, mine, mask):
        if budget[0] <= 0:
            break
        budget[0] -= 1
        start = stmt.checkpoint()
        ok = 0
        failed: Task | None = None
        for t in mine:
            if session.place(t, stmt, dom) is None:
                failed = t
                break
            ok += 1
        if failed is None and _from(session, entry, groups, k + 1, placed + ok, stmt, mask, budget, best):
            return True
        if failed is not None and placed + ok > best[0][0]:
            best[0] = (placed + ok, failed)
        stmt.rollback(start)
    if best[0][0] < placed:  # no domain at all for this subgroup
        best[0] = (placed, mine[0])
    return False


def outer_domains(session: Session, entry: WorkloadEntry, tasks: list[Task]) -> list[Domain]:
    """Where the whole workload may go: the domains of its own level (`Workload.topology`) that
    could hold all its tasks, tightest first, then (unless required) the cluster. Not the gang
    planner's narrowest-first packing: the subgroups pack themselves, and a domain that holds the
    sum of the tasks may still not hold each subgroup in one of its own domains, so more of them
    are tried than the planner's few."""
    topo = entry.workload.topology
    cluster = Domain("cluster", "", None)
    if topo is None:
        return [cluster]
    s = session.snapshot
    level = "node" if topo.level == "hostname" else topo.level
    if level != "node" and level not in s.topology_levels:
        known = ", ".join(["node", *reversed(s.topology_levels)])
        none = np.zeros(len(s.cluster), dtype=np.bool_)
        return [Domain(topo.level, f"unknown level (known: {known})", none, required=topo.required)]
    dom = s.domains(level)
    order = _fitting(session, dom, tasks, None)[:MAX_OUTER]
    out = []
    for d in order:
        mask = dom == d
        node = s.nodes[int(np.argmax(mask))]
        label = node.name if level == "node" else node.topology.get(level, node.name)
        out.append(Domain(level, label, mask, required=topo.required))
    return out if topo.required else [*out, cluster]


def _fitting(session: Session, dom: np.ndarray, tasks: list[Task], within: BoolArray | None) -> np.ndarray:
    """Domain ids (of `dom`) whose free capacity within `within` could hold `tasks`, tightest first."""
    s = session.snapshot
    ndom = int(dom.max()) + 1 if len(dom) else 0
    fits = np.ones(ndom, dtype=np.bool_)
    slack = np.zeros(ndom, dtype=np.float64)
    for req, n in _shapes(session, tasks):
        cap = node_capacity(s, req) if within is None else np.where(within, node_capacity(s, req), 0)
        fits &= np.bincount(dom, weights=np.minimum(cap, n), minlength=ndom) >= n
        slack += np.bincount(dom, weights=np.minimum(cap, UNBOUNDED // 2).astype(np.float64), minlength=ndom)
    cand = np.nonzero(fits)[0]
    return np.asarray(cand[np.lexsort((cand, slack[cand]))])


def domains(
    session: Session, entry: WorkloadEntry, sg: SubGroup, tasks: list[Task], mask: BoolArray | None
) -> list[BoolArray | None]:
    """Where the subgroup's tasks may go, in the order to try: domains of its level that could
    hold them (within `mask`), then, unless required, `mask` itself."""
    topo = sg.topology
    if topo is None:
        return [mask]
    s = session.snapshot
    level = "node" if topo.level == "hostname" else topo.level
    if level != "node" and level not in s.topology_levels:
        return [] if topo.required else [mask]
    dom = s.domains(level)
    within = np.ones(len(s.cluster), dtype=np.bool_) if mask is None else mask
    here = [a.node for a in entry.bound.values() if a.task.podset in sg.podsets]
    if here and topo.required:  # a running subgroup grows only inside its domain
        return [within & (dom == dom[here[0]])]
    order = _fitting(session, dom, tasks, within)[:MAX_DOMAINS]
    out: list[BoolArray | None] = [within & (dom == d) for d in order]
    if not topo.required:
        out.append(mask)
    return out


def _shapes(session: Session, tasks: list[Task]) -> list[tuple[TaskRequest, int]]:
    groups: dict[tuple[object, ...], tuple[TaskRequest, int]] = {}
    for t in tasks:
        req, n = groups.get(t.request.shape_key, (t.request, 0))
        groups[t.request.shape_key] = (session.effective(req), n + 1)
    return list(groups.values())


def same_domain(session: Session, entry: WorkloadEntry, task: Task) -> BoolArray | None:
    """An optional task of a subgroup with a required level joins the domain its subgroup runs in."""
    sg = entry.workload.subgroup_of(task.podset)
    if sg is None or sg.topology is None or not sg.topology.required:
        return None
    here = [a.node for a in entry.bound.values() if a.task.podset in sg.podsets]
    if not here:
        return None
    level = "node" if sg.topology.level == "hostname" else sg.topology.level
    dom = session.snapshot.domains(level)
    return np.asarray(dom == dom[here[0]])
