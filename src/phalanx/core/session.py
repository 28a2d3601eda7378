"""One cycle's context: snapshot, profile, plugins, clock and rng.

The Session offers the few operations actions need (order workloads, place one task,
open a statement, record a pending reason) so that actions stay short recipes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from phalanx.core import backends, drafit, numa
from phalanx.core.classes import PlacementClass, PlacementClasses
from phalanx.core.cluster import BoolArray, IntArray
from phalanx.core.decisions import Bind, CycleResult, Hold, Pending, Reason, Repartition
from phalanx.core.devices import default_assignment
from phalanx.core.dra import ClaimAllocation
from phalanx.core.extension import FloatArray, PlacementContext
from phalanx.core.feasibility import capacity_of, explain_kept, find_candidates
from phalanx.core.kept_order import first_in_order
from phalanx.core.model import MIG_BACKEND, GpuKind, GpuRequest, Task, TaskRequest
from phalanx.core.profile import Profile
from phalanx.core.queues import Vector
from phalanx.core.snapshot import Allocation, Snapshot, WorkloadEntry
from phalanx.core.statement import Op, Statement, undo
from phalanx.core.wake import Wake


@dataclass(frozen=True, slots=True, eq=False)
class Reservation:
    """Nodes earmarked for a waiting gang, and when it is expected to fit there (equal only to itself)."""

    workload: str
    nodes: BoolArray
    due: float


ORDER_BY_ATTAINED = "order-by-attained"  # entry cache: (profile, attained service, order key)

Stream = Callable[[str, list[Bind]], None]  # a workload placed whole, and its binds, as soon as final


# a gang's queue request kept across cycles (`request_of`): at most this many, of at most this many tasks
KEPT_REQUESTS = 16384
KEPT_REQUEST_TASKS = 64


class Session:
    def __init__(
        self,
        snapshot: Snapshot,
        profile: Profile,
        clock: float,
        rng: np.random.Generator,
        stream: Stream | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.profile = profile
        self.clock = clock
        self.rng = rng
        self.committed: list[Op] = []
        # workloads handed out to the driver before the cycle ended (`hand_out`): final, so no
        # later action of the cycle evicts or moves them
        self.stream = stream
        self.streamed: set[str] = set()
        self.pending: dict[str, Pending] = {}
        self.attempted: set[str] = set()
        # gang shapes found not to fit this cycle (cleared when an eviction frees capacity)
        self.no_room: dict[tuple[object, ...], Any] = {}
        self._open: list[Statement] = []
        self._gated: list[WorkloadEntry] | None = None
        self._by_queue: dict[str, list[WorkloadEntry]] | None = None
        self._fair: dict[str, Vector] | None = None
        self.reservation: Reservation | None = None
        # the earliest moment an action said its answer changes by the clock alone (`wake_at`)
        self.wake: Wake | None = None
        self.repartitions: list[Repartition] = []  # MIG GPUs cut anew this cycle (actions.repartition)
        # per-cycle memo of derived state (e.g. the victim list), keyed by what it depends on
        self.memo: dict[object, object] = {}
        self._classes: PlacementClasses | None = None
        self._order_memo: tuple[str, dict[str, tuple[object, ...]]] | None = None
        # per request object (kept with it, so a reused id never hits): `effective`, `variants`
        self._effective: dict[int, tuple[TaskRequest, TaskRequest]] = {}
        self._variants: dict[int, tuple[TaskRequest, list[tuple[str, TaskRequest]]]] = {}

    # ----------------------------------------------------------------- ordering
    def order_mode(self) -> str:
        """What an order key depends on: "entry" (the workload alone), "attained" (and its attained
        service), "cycle" (held for a cycle) or "none"."""
        if self._order_memo is None:
            order = self.profile.order
            static = all(o.static for o in order)
            by_attained = all(o.static or getattr(o, "keyed_by_attained", False) for o in order)
            cycle = all(o.static or o.cycle_static for o in order)
            how = "entry" if static else "attained" if by_attained else "cycle" if cycle else "none"
            self._order_memo = (how, {})
        return self._order_memo[0]

    def order_key(self, e: WorkloadEntry) -> tuple[object, ...]:
        """Profile order, then age, then name; memoised in the entry when every order plugin is
        static, and for the cycle when each is static or says its key holds for a cycle
        (`cycle_static`: attained service and run time move only between cycles)."""
        if self._order_memo is None:
            self.order_mode()
        assert self._order_memo is not None
        how, keys = self._order_memo
        cached: object = None
        if how == "entry":
            cached = e.cache.get(("order", self.profile.name))
        elif how == "attained":  # kept in the entry while its attained service stays (a waiting one's does)
            kept = e.cache.get(ORDER_BY_ATTAINED)
            if isinstance(kept, tuple) and kept[0] is self.profile and kept[1] == e.attained:
                cached = kept[2]
        elif how == "cycle":
            cached = keys.get(e.name)
        if isinstance(cached, tuple):
            return cached
        parts: list[object] = []
        for o in self.profile.order:
            parts.extend(o.key(self, e))
        parts.extend((e.workload.creation_time, e.name))
        key = tuple(parts)
        if how == "entry":
            e.cache[("order", self.profile.name)] = key
        elif how == "attained":
            e.cache[ORDER_BY_ATTAINED] = (self.profile, e.attained, key)
        elif how == "cycle":
            keys[e.name] = key
        return key

    def ordered_pending(self) -> list[WorkloadEntry]:
        """Pending workloads worth a try this cycle, in profile order (see `gated_pending`)."""
        if self._gated is None:
            self._gated = sorted(self.gated_pending(), key=self.order_key)
        return list(self._gated)

    def pending_by_queue(self) -> dict[str, list[WorkloadEntry]]:
        """Every pending workload by queue, unsorted (as at the first call in the cycle)."""
        if self._by_queue is None:
            out: dict[str, list[WorkloadEntry]] = {}
            for e in self.snapshot.pending_workloads():
                out.setdefault(e.workload.queue, []).append(e)
            self._by_queue = out
        return self._by_queue

    def pending_for_eviction(self, queues: Iterable[str]) -> list[WorkloadEntry]:
        """The pending workloads of these queues, furthest below fair share first, then profile order.

        Preempt and reclaim make room, so the free-capacity gate of `gated_pending` does not apply:
        a workload that found no room in an earlier cycle must still get its turn to evict.
        Only the first in order of each queue's alike workloads (same demand) is returned: alike
        workloads find victims or not alike, and the next one gets its turn in the next cycle.
        """
        by_queue = self.pending_by_queue()
        heads: dict[tuple[str, object], WorkloadEntry] = {}
        for q in queues:
            for e in by_queue.get(q, ()):
                if not e.workload.preempts:  # preemptionPolicy Never: free room only
                    continue
                k = (q, e.demand_key)
                h = heads.get(k)
                if h is None or self.order_key(e) < self.order_key(h):
                    heads[k] = e
        return sorted(heads.values(), key=lambda e: (self.queue_key(e.workload.queue), self.order_key(e)))

    def gated_pending(self) -> list[WorkloadEntry]:
        """Pending workloads that could possibly be placed now, plus those never looked at.

        Workloads with the same demand fit or not alike. When the free capacity could hold at
        most k of a group's gangs (a cheap upper bound), only the group's first k + 1 in order
        are tried: the rest cannot fit this cycle and keep the reason they were given before.
        Workloads no cycle has looked at yet, and partly placed ones, are always included.
        """
        s = self.snapshot
        natural = all(o.natural for o in self.profile.order)
        fresh, partial = s.fresh, s.partial  # a driver may mark every workload fresh: not copied here
        specials = len(fresh) + len(partial)  # at least as many as the two together
        out: list[WorkloadEntry] = []
        either: set[str] | None = None  # fresh | partial, made once (the same set, iterated alike)
        for key, group in s.pending_groups.items():
            sample = next(iter(group.values()))
            if len(group) == 1 or (k := self.room_for(sample)) >= len(group) - 1:
                out.extend(group.values())
                continue
            if k <= 0:
                picked: list[WorkloadEntry] = []
            elif natural:
                picked = [group[name] for *_, name in s.group_order[key][: k + 1]]
            else:
                picked = first_in_order(self, key, group, k + 1)
            seen = {e.name for e in picked}
            out.extend(picked)
            if specials < len(group):
                if either is None:
                    either = fresh | partial
                out.extend(group[n] for n in either if n in group and n not in seen)
            else:
                out.extend(e for n, e in group.items() if (n in fresh or n in partial) and n not in seen)
        return out

    def room_for(self, entry: WorkloadEntry) -> int:
        """At most how many gangs like this one the free capacity could hold (cheap upper bound)."""
        w = entry.workload
        total = 0
        counts = []
        for ps in w.podsets:
            cap = capacity_of(self.snapshot, self.effective(ps.request), self.memo)[1]  # kept: no sum anew
            total += min(ps.count, cap)
            counts.append(cap // ps.count if ps.count else cap)
        if total < w.gang_size:
            return 0
        return max(1, min(counts)) if w.gang_size == w.total_tasks else max(1, total // max(w.gang_size, 1))

    # ----------------------------------------------------------------- queues
    def fair_shares(self) -> dict[str, Vector]:
        """Fair share of every queue this cycle (empty without a queue tree)."""
        if self._fair is None:
            s = self.snapshot
            if s.queues is None:
                self._fair = {}
            else:
                self._fair = s.fair_shares(s.queues)
        return self._fair

    def request_of(self, tasks: list[Task]) -> Vector:
        """What these tasks ask of their queue, as this profile accounts them.

        Kept across cycles by the tasks it sums (read-only): admission asks it of one gang after
        every victim an eviction try takes, and of every waiting gang at each cycle's try (each
        time a new list of the same tasks); the sum is the same numbers added the same way.
        """
        now = tuple(tasks)
        key = tuple(map(id, now))
        s = self.snapshot
        table = s.kept_requests
        hit = table.get(key)
        # the same tasks (compared by identity first) and profile: a vector per request object is
        # the snapshot's for good (`request_vector`), and `effective` reads the profile alone
        if hit is not None and hit[1] is self.profile and hit[0] == now:
            kept = hit[2]
            assert isinstance(kept, np.ndarray)
            return kept
        out = sum((s.request_vector(self.effective(t.request)) for t in tasks), np.zeros(3))
        out.flags.writeable = False
        if len(now) <= KEPT_REQUEST_TASKS:  # bounded: at most this many tasks an entry
            if len(table) >= KEPT_REQUESTS:  # and this many entries; those of workloads long gone go
                table.clear()
            table[key] = (now, self.profile, out)
        return out

    def admit(self, entry: WorkloadEntry, tasks: list[Task]) -> Reason | None:
        for check in self.profile.admission:
            reason = check.admit(self, entry, tasks)
            if reason is not None:
                return reason
        return None

    def queue_key(self, queue: str) -> tuple[object, ...]:
        order = self.profile.queue_order
        if order is None:
            return (self.snapshot.queue_gpu_milli.get(queue, 0), queue)
        return order.queue_key(self, queue)

    # ----------------------------------------------------------------- statements
    def statement(self) -> Statement:
        st = Statement(self.snapshot, self.committed, on_release=self.no_room.clear)
        self._open.append(st)
        return st

    # ----------------------------------------------------------------- placement
    def effective(self, request: TaskRequest) -> TaskRequest:
        """The request as this profile accounts it: without GPU sharing, shares become whole GPUs;
        a share carries the backends that may serve it (`core.backends`)."""
        g = request.gpu
        if g.kind not in (GpuKind.FRACTION, GpuKind.MEMORY):
            return request
        if not self.profile.gpu_sharing:
            return replace(request, gpu=GpuRequest.whole(g.devices))
        policy = self.profile.fraction_backend
        if policy.is_default or g.backends:
            return request
        hit = self._effective.get(id(request))
        if hit is not None and hit[0] is request:
            return hit[1]
        out = replace(request, gpu=replace(g, backends=backends.resolve(policy, g)))
        self._effective[id(request)] = (request, out)
        return out

    def variants(self, req: TaskRequest) -> list[tuple[str, TaskRequest]]:
        """An effective request as the backends that may serve it, in order, one request each: a
        MIG instance as one request per profile that serves it (smallest first), a share as a
        share of that backend alone. A request without backends is itself ("")."""
        g = req.gpu
        if not g.backends:
            return [("", req)]
        hit = self._variants.get(id(req))
        if hit is not None and hit[0] is req:
            return hit[1]
        out: list[tuple[str, TaskRequest]] = []
        for b in g.backends:
            if b == MIG_BACKEND:
                profiles = backends.mig_profiles(self.snapshot.cluster, g)
                out += [(b, replace(req, gpu=GpuRequest.mig(p))) for p in profiles]
            else:
                out.append((b, replace(req, gpu=replace(g, backends=(b,)))))
        self._variants[id(req)] = (req, out)
        return out

    def candidates(
        self, task: Task, restrict: BoolArray | None = None, req: TaskRequest | None = None
    ) -> PlacementContext:
        req = req or self.effective(task.request)
        if restrict is not None and not req.claims:  # check the domain's nodes only: the same verdicts
            cand = find_candidates(self.snapshot, req, within=np.nonzero(restrict)[0])
        else:
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
        """Choose a node and devices for one task and apply it through `stmt`.

        A fractional ask with several backends is served by the first, in order, that can
        place it (`variants`).
        """
        req = self.effective(task.request)
        if not req.gpu.backends:
            return self._place(task, req, stmt, restrict, "")
        for backend, one in self.variants(req):
            alloc = self._place(task, one, stmt, restrict, backend)
            if alloc is not None:
                return alloc
        return None

    def _place(
        self, task: Task, req: TaskRequest, stmt: Statement, restrict: BoolArray | None, backend: str
    ) -> Allocation | None:
        """`place` for one effective request, its devices said to be served by `backend`.

        Tasks of one class (`phalanx.core.classes`) share their feasibility and scoring pass;
        the others, and any the class cannot decide, take the full pass below.
        """
        if restrict is None:
            if self._classes is None:
                self._classes = PlacementClasses(self)
            cls = self._classes.lookup(task, req)
            if cls is not None:
                placed = self._place_class(cls, task, req, stmt, backend)
                if placed is not False:
                    return placed
        ctx = self.candidates(task, restrict, req)
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
            claims: tuple[ClaimAllocation, ...] = ()
            if selector is not None:
                devices = selector.select(ctx, k)
                if devices is not None and c.numa_any and not numa.respects(c, i, ctx.request, devices):
                    devices = default_assignment(c, i, ctx.candidates.usable(k), ctx.request)
            else:
                devices = default_assignment(c, i, ctx.candidates.usable(k), ctx.request)
            if devices is not None and c.numa_any:
                devices = c.pinned(i, ctx.request.exclusive_cpu, devices)
            if ctx.request.claims:  # the policy's choice is a preference; the claims decide
                got = drafit.assign(self.snapshot, i, ctx.request.claims, devices)
                if got is not None:
                    got = drafit.merged(got, devices, ctx.request.claimed)
                devices, claims = got if got is not None else (None, ())
            if devices is None:
                alive[k] = False
                continue
            if backend and devices.backend != backend:
                devices = replace(devices, backend=backend)
            alloc = Allocation(
                task, i, devices, ctx.request.cpu_milli, ctx.request.memory_mib, self.clock, claims
            )
            stmt.allocate(alloc)
            return alloc
        return None

    def _place_class(
        self, cls: PlacementClass, task: Task, req: TaskRequest, stmt: Statement, backend: str
    ) -> Allocation | Literal[False] | None:
        """`place` for a task of class `cls`; False when the full pass must decide (a best score of -inf)."""
        classes = self._classes
        assert classes is not None
        selector = self.profile.device_selector
        skip: set[int] = set()
        while True:
            i = classes.best(cls, skip)
            if i is None:
                return None
            if i < 0:
                return False
            ctx = classes.candidate(cls, task, i)
            if selector is not None:
                devices = selector.select(ctx, 0)
            else:
                devices = default_assignment(self.snapshot.cluster, i, ctx.candidates.usable(0), req)
            if devices is None:
                skip.add(i)
                continue
            if backend and devices.backend != backend:
                devices = replace(devices, backend=backend)
            alloc = Allocation(task, i, devices, req.cpu_milli, req.memory_mib, self.clock, ())
            stmt.allocate(alloc)
            return alloc

    def why_not(self, task: Task, restrict: BoolArray | None = None) -> list[Reason]:
        ctx_req = self.effective(task.request)
        reasons = explain_kept(self.snapshot, ctx_req, self.memo, restrict)
        n = len(self.snapshot.cluster)
        if reasons and sum(r.nodes for r in reasons) >= n:
            return reasons  # every node failed a check: no filter had a node left to refuse
        if not n:
            return [Reason("nodes", "no nodes")]
        # every check passed on some nodes: the profile's filters took them; name those that did
        ctx = PlacementContext(self, task, ctx_req, find_candidates(self.snapshot, ctx_req, restrict))
        for f in self.profile.filters:
            if not len(ctx.candidates):
                break
            keep = f.keep(ctx)
            if not keep.all():
                reasons.append(Reason(f.name, f.reason(), int((~keep).sum())))
                ctx = PlacementContext(self, task, ctx_req, ctx.candidates.subset(keep))
        return reasons

    def set_pending(
        self,
        workload: str,
        summary: str,
        reasons: list[Reason] | tuple[Reason, ...] = (),
        unschedulable: bool = False,
        holds: tuple[Hold, ...] = (),
    ) -> None:
        self.pending[workload] = Pending(workload, summary, tuple(reasons), unschedulable, holds)

    def parked(self, entry: WorkloadEntry) -> bool:
        """True if the workload did not fit and no capacity was released since: skip it, keep its reason."""
        if entry.parked_epoch != self.snapshot.release_epoch or entry.last_pending is None:
            return False
        self.pending[entry.name] = entry.last_pending
        return True

    # ----------------------------------------------------------------- result
    def hand_out(self, entry: WorkloadEntry, since: int) -> None:
        """With a `stream`, hand a workload that allocate just placed to the driver at once, so its
        binds go out while the cycle goes on: only when every operation committed since `since`
        binds one of its tasks (nothing else was moved to make room for it)."""
        if self.stream is None:
            return
        ops = self.committed[since:]
        name = entry.name
        if not ops or any(op.kind != "bind" or op.alloc.task.workload != name for op in ops):
            return
        self.streamed.add(name)
        self.stream(name, [self.snapshot.bind_of(op.alloc) for op in ops])

    def wake_at(self, at: float, why: str) -> None:
        """An action's answer changes at `at` even if nothing else does: the cycle's wake-up says so."""
        if at > self.clock and (self.wake is None or at < self.wake.at):
            self.wake = Wake(at, why)

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
        out.evictions = [s.evict_of(op.alloc, op.reason, op.by, op.cost) for op in evicted.values()]
        out.binds = [s.bind_of(op.alloc) for op in bound.values()]
        placed = {op.alloc.task.workload for op in bound.values()}
        out.pending = [
            p for w, p in self.pending.items() if w not in placed or not s.workloads[w].is_complete
        ]
        out.repartitions = list(self.repartitions)
        return out

    def keep(self) -> None:
        """Keep what was committed (the caller applies the decisions this way); drop what was not."""
        for st in self._open:
            if not st._closed:
                st.discard()
        self.committed.clear()
        self._classes = None  # it points back at the session: freed with it, not left to the collector

    def close(self) -> None:
        """Undo everything this cycle did, so the caller's snapshot is unchanged."""
        for st in self._open:
            if not st._closed:
                st.discard()
        while self.committed:
            undo(self.snapshot, self.committed.pop())
        self._classes = None
