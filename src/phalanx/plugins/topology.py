"""Topology: pack a gang into the fewest domains at the lowest level that fits; honour required levels.

Levels are tried narrowest first (node, then rack, block, spine, zone as configured).
At each level, domains whose free capacity could host the whole gang are tried
tightest first (best fit keeps big domains whole for big gangs).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from phalanx.core.cluster import KIND_MIG, ClusterState
from phalanx.core.extension import Domain, FloatArray, PlacementContext
from phalanx.core.model import GpuKind, Task, TaskRequest
from phalanx.core.session import Session
from phalanx.core.snapshot import Snapshot, WorkloadEntry

UNBOUNDED = 1 << 30


def node_capacity(s: Snapshot, req: TaskRequest) -> np.ndarray:
    """How many tasks of `req` each node could still take (an upper bound, cheap to compute)."""
    c: ClusterState = s.cluster
    cap = np.full(len(c), UNBOUNDED, dtype=np.int64)
    if req.cpu_milli:
        cap = np.minimum(cap, c.cpu_free // req.cpu_milli)
    if req.memory_mib:
        cap = np.minimum(cap, c.mem_free // req.memory_mib)
    g = req.gpu
    if g.kind is GpuKind.WHOLE:
        cap = np.minimum(cap, c.gpu_whole_free // g.devices)
    elif g.kind is GpuKind.FRACTION:
        cap = np.minimum(cap, (c.gpu_milli_free // g.milli).sum(axis=1) // g.devices)
    elif g.kind is GpuKind.MEMORY:
        cap = np.minimum(cap, (c.gpu_mem_free // g.memory_mib).sum(axis=1) // g.devices)
    elif g.kind is GpuKind.MIG:
        cap = np.minimum(cap, ((c.gpu_kind == KIND_MIG) & (c.mig_compute < 7)).sum(axis=1) * 7)
    if req.rdma_nics:
        cap = np.minimum(cap, c.nic_free.sum(axis=1) // req.rdma_nics)
    ok = c.node_ready & s.static_mask(req)
    return np.where(ok, cap, 0)


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
        groups: dict[tuple[object, ...], tuple[TaskRequest, int]] = {}
        for t in tasks:
            key = t.request.shape_key
            req, n = groups.get(key, (t.request, 0))
            groups[key] = (session.effective(req), n + 1)
        caps = [(node_capacity(s, req), n) for req, n in groups.values()]
        required = constraint is not None and constraint.required
        for level in try_levels:
            dom = s.domains(level)
            ndom = int(dom.max()) + 1 if len(dom) else 0
            fits = np.ones(ndom, dtype=np.bool_)
            slack = np.zeros(ndom, dtype=np.float64)
            for cap, n in caps:
                dcap = np.bincount(dom, weights=np.minimum(cap, n), minlength=ndom)
                fits &= dcap >= n
                slack += np.bincount(
                    dom, weights=np.minimum(cap, UNBOUNDED // 2).astype(np.float64), minlength=ndom
                )
            cand = np.nonzero(fits)[0]
            if not len(cand):
                continue
            order = cand[np.lexsort((cand, slack[cand]))][: self.max_domains]
            for d in order:
                mask = dom == d
                first = int(np.argmax(mask))
                node = s.nodes[first]
                label = node.name if level == "node" else node.topology.get(level, node.name)
                yield Domain(level, label, mask, required=required)
        if not required:
            yield Domain("cluster", "", None)


class GangAffinityScorer:
    """Within a domain, prefer nodes that already run tasks of the same workload."""

    name = "gang-affinity"

    def score(self, ctx: PlacementContext) -> FloatArray:
        s = ctx.session.snapshot
        w = ctx.task.workload
        entry = s.workloads.get(w)
        out = np.zeros(len(ctx.candidates))
        if entry is None or not entry.bound:
            return out
        nodes = np.fromiter({a.node for a in entry.bound.values()}, dtype=np.int64)
        return np.where(np.isin(ctx.candidates.nodes, nodes), 100.0, 0.0)
