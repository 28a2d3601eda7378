"""Topology: pack a gang into the fewest domains at the lowest level that fits; honour required levels.

Levels are tried narrowest first (node, then rack, block, spine, zone as configured).
At each level, domains whose free capacity could host the whole gang are tried
tightest first (best fit keeps big domains whole for big gangs).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

import numpy as np

from phalanx.core.cluster import IntArray
from phalanx.core.extension import SCORES_ZERO, ClassKeyed, Domain, FloatArray, PlacementContext
from phalanx.core.feasibility import UNBOUNDED, capacity_of, node_capacity
from phalanx.core.model import Task, TaskRequest
from phalanx.core.session import Session
from phalanx.core.snapshot import Snapshot, WorkloadEntry

__all__ = ["GangAffinityScorer", "TopologyPlanner", "node_capacity"]


class TopologyPlanner:
    name = "topology"

    def __init__(self, pack: bool = True, max_domains_per_level: int = 4) -> None:
        self.pack = pack
        self.max_domains = max_domains_per_level

    def levels(self, s: Snapshot) -> list[str]:
        return ["node", *reversed(s.topology_levels)]

    def domains(self, session: Session, entry: WorkloadEntry, tasks: list[Task]) -> Iterator[Domain]:
        s = session.snapshot
        constraint = entry.workload.topology
        levels = self.levels(s)
        if constraint is not None:
            target = "node" if constraint.level == "hostname" else constraint.level
            if target not in levels:
                levels_txt = ", ".join(levels)
                yield Domain(
                    constraint.level,
                    f"unknown level (known: {levels_txt})",
                    np.zeros(len(s.cluster), bool),
                    required=constraint.required,
                )
                return
            try_levels = levels[: levels.index(target) + 1]
        elif self.pack and len(tasks) > 1:
            try_levels = levels
        else:
            yield Domain("cluster", "", None)
            return
        # by request object first (a gang's tasks mostly share one), then by shape, in order of
        # first appearance: a shape key is a deep tuple, hashed anew each time
        by_id: dict[int, tuple[TaskRequest, int]] = {}
        for t in tasks:
            had = by_id.get(id(t.request))
            by_id[id(t.request)] = (t.request, 1 if had is None else had[1] + 1)
        groups: dict[tuple[object, ...], tuple[TaskRequest, int]] = {}
        for r, k in by_id.values():
            key = r.shape_key
            same = groups.get(key)
            groups[key] = (session.effective(r), k) if same is None else (same[0], same[1] + k)
        caps = [(capacity_of(s, req, session.memo)[0], n) for req, n in groups.values()]
        required = constraint is not None and constraint.required
        for level in try_levels:
            dom = s.domains(level)
            ndom = int(dom.max()) + 1 if len(dom) else 0
            fits = np.ones(ndom, dtype=np.bool_)
            for cap, n in caps:
                dcap = np.bincount(dom, weights=np.minimum(cap, n), minlength=ndom)
                fits &= dcap >= n
            cand = np.nonzero(fits)[0]
            if not len(cand):  # often so at the node level: no slack worked out for nothing
                continue
            slack = domain_slack(dom, caps, ndom)
            order = cand[np.lexsort((cand, slack[cand]))][: self.max_domains]
            for d in order:
                mask = dom == d
                first = int(np.argmax(mask))
                node = s.nodes[first]
                label = node.name if level == "node" else node.topology.get(level, node.name)
                yield Domain(level, label, mask, required=required, then_cluster=not required)
        if not required:
            yield Domain("cluster", "", None)


def domain_slack(dom: IntArray, caps: list[tuple[IntArray, int]], ndom: int) -> FloatArray:
    """Per domain, the tasks of each shape it could still hold, summed: lower is tighter."""
    slack = np.zeros(ndom, dtype=np.float64)
    for cap, _ in caps:
        slack += np.bincount(dom, weights=np.minimum(cap, UNBOUNDED // 2).astype(np.float64), minlength=ndom)
    return slack


class GangAffinityScorer(ClassKeyed):
    """Within a domain, prefer nodes that already run tasks of the same workload."""

    name = "gang-affinity"

    def class_key(self, session: Session, task: Task, request: TaskRequest) -> Hashable | None:
        """Every node scores 0 until the task's workload has members placed; then a node's score
        depends on that node alone (whether it runs a member) and the workload, the key.

        A member comes to or leaves a node only by a bind or an unbind there, which stamps the node
        (`ClusterState._touch`), so a class keyed by the workload recomputes exactly the nodes whose
        bonus changed: the gang's later tasks share one pass instead of a full pass each.
        """
        entry = session.snapshot.workloads.get(task.workload)
        return ("members of", task.workload) if entry is not None and entry.bound else SCORES_ZERO

    def score(self, ctx: PlacementContext) -> FloatArray:
        s = ctx.session.snapshot
        w = ctx.task.workload
        entry = s.workloads.get(w)
        if entry is None or not entry.bound:
            return np.zeros(len(ctx.candidates))
        # a mask over all nodes, read at the candidates: np.isin sorts, and costs more than the
        # rest of this scorer on the small arrays of a gang (it was 4 % of a queue replay)
        has = np.zeros(len(s.nodes), dtype=np.bool_)
        for a in entry.bound.values():
            has[a.node] = True
        return np.where(has[ctx.candidates.nodes], 100.0, 0.0)
