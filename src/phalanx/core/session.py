"""One cycle's context: snapshot, profile, plugins, clock and rng.

The Session offers the few operations actions need (order workloads, place one task,
open a statement, record a pending reason) so that actions stay short recipes.
"""

from __future__ import annotations

import numpy as np

from phalanx.core.cluster import BoolArray, IntArray
from phalanx.core.decisions import CycleResult, Pending, Reason
from phalanx.core.devices import default_assignment
from phalanx.core.extension import FloatArray, PlacementContext
from phalanx.core.feasibility import explain, find_candidates
from phalanx.core.model import GpuKind, GpuRequest, Task, TaskRequest
from phalanx.core.profile import Profile
from phalanx.core.snapshot import Allocation, Snapshot, WorkloadEntry
from phalanx.core.statement import Op, Statement, undo


class Session:
    def __init__(self, snapshot: Snapshot, profile: Profile, clock: float, rng: np.random.Generator) -> None:
        self.snapshot = snapshot
        self.profile = profile
        self.clock = clock
        self.rng = rng
        self.committed: list[Op] = []
        self.pending: dict[str, Pending] = {}
        self.attempted: set[str] = set()
        self._open: list[Statement] = []

    # ----------------------------------------------------------------- ordering
    def ordered_pending(self) -> list[WorkloadEntry]:
        entries = self.snapshot.pending_workloads()
        order = self.profile.order

        def key(e: WorkloadEntry) -> tuple[object, ...]:
            parts: list[object] = []
            for o in order:
                parts.extend(o.key(self, e))
            parts.extend((e.workload.creation_time, e.name))
            return tuple(parts)

        return sorted(entries, key=key)

    # ----------------------------------------------------------------- statements
    def statement(self) -> Statement:
        st = Statement(self.snapshot, self.committed)
        self._open.append(st)
        return st

    # ----------------------------------------------------------------- placement
    def effective(self, request: TaskRequest) -> TaskRequest:
        """The request as this profile accounts it: without GPU sharing, shares become whole GPUs."""
        g = request.gpu
        if self.profile.gpu_sharing or g.kind not in (GpuKind.FRACTION, GpuKind.MEMORY):
            return request
        return TaskRequest(
            cpu_milli=request.cpu_milli,
            memory_mib=request.memory_mib,
            gpu=GpuRequest.whole(g.devices),
            gpu_models=request.gpu_models,
            rdma_nics=request.rdma_nics,
            nic_same_pcie=request.nic_same_pcie,
            node_selector=request.node_selector,
            tolerations=request.tolerations,
            dataset=request.dataset,
        )

    def candidates(self, task: Task, restrict: BoolArray | None = None) -> PlacementContext:
        req = self.effective(task.request)
        cand = find_candidates(self.snapshot, req, restrict)
        ctx = PlacementContext(self, task, req, cand)
        for f in self.profile.filters:
            if not len(ctx.candidates):
                break
            keep = f.keep(ctx)
            if not keep.all():
                ctx = PlacementContext(self, task, req, cand.subset(keep))
                cand = ctx.candidates
        return ctx

    def scores(self, ctx: PlacementContext) -> FloatArray:
        total = np.zeros(len(ctx.candidates), dtype=np.float64)
        for scorer, weight in self.profile.scorers:
            if weight:
                total += weight * scorer.score(ctx)
        return total

    def pick(self, scores: FloatArray, alive: BoolArray, nodes: IntArray) -> int:
        """Index of the best alive candidate; ties broken by the profile's rule.

        `name`: the node first in the snapshot's node order (by name unless the driver set
        `node_rank`); `random`: uniformly among the tied nodes, from the session's rng.
        """
        masked = np.where(alive, scores, -np.inf)
        best = masked.max()
        ties = np.nonzero(masked == best)[0]
        if len(ties) == 1:
            return int(ties[0])
        if self.profile.tie_break == "name":
            return int(ties[np.argmin(self.snapshot.node_rank[nodes[ties]])])
        return int(ties[self.rng.integers(len(ties))])

    def place(self, task: Task, stmt: Statement, restrict: BoolArray | None = None) -> Allocation | None:
        """Choose a node and devices for one task and apply it through `stmt`."""
        ctx = self.candidates(task, restrict)
        n = len(ctx.candidates)
        if n == 0:
            return None
        scores = self.scores(ctx)
        alive = np.ones(n, dtype=np.bool_)
        selector = self.profile.device_selector
        c = self.snapshot.cluster
        while alive.any():
            k = self.pick(scores, alive, ctx.candidates.nodes)
            i = int(ctx.candidates.nodes[k])
            if selector is not None:
                devices = selector.select(ctx, k)
            else:
                devices = default_assignment(c, i, ctx.candidates.usable(k), ctx.request)
            if devices is None:
                alive[k] = False
                continue
            alloc = Allocation(task, i, devices, ctx.request.cpu_milli, ctx.request.memory_mib, self.clock)
            stmt.allocate(alloc)
            return alloc
        return None

    def why_not(self, task: Task, restrict: BoolArray | None = None) -> list[Reason]:
        ctx_req = self.effective(task.request)
        reasons = explain(self.snapshot, ctx_req, restrict)
        if not reasons:
            ctx = self.candidates(task, restrict)
            if not len(ctx.candidates) and self.profile.filters:
                reasons = [Reason(f.name, f.reason()) for f in self.profile.filters]
        return reasons

    def set_pending(
        self, workload: str, summary: str, reasons: list[Reason] | tuple[Reason, ...] = ()
    ) -> None:
        self.pending[workload] = Pending(workload, summary, tuple(reasons))

    # ----------------------------------------------------------------- result
    def result(self) -> CycleResult:
        """Decisions from committed operations; a task bound and evicted in one cycle cancels out."""
        out = CycleResult()
        bound: dict[str, Op] = {}
        evicted: dict[str, Op] = {}
        for op in self.committed:
            name = op.alloc.task.name
            if op.kind == "bind":
                if name in evicted and evicted[name].alloc == op.alloc:
                    del evicted[name]
                else:
                    bound[name] = op
            else:
                if name in bound:
                    del bound[name]
                else:
                    evicted[name] = op
        s = self.snapshot
        out.evictions = [s.evict_of(op.alloc, op.reason) for op in evicted.values()]
        out.binds = [s.bind_of(op.alloc) for op in bound.values()]
        placed = {op.alloc.task.workload for op in bound.values()}
        out.pending = [
            p for w, p in self.pending.items() if w not in placed or not s.workloads[w].is_complete
        ]
        return out

    def close(self) -> None:
        """Undo everything this cycle did, so the caller's snapshot is unchanged."""
        for st in self._open:
            if not st._closed:
                st.discard()
        while self.committed:
            undo(self.snapshot, self.committed.pop())
