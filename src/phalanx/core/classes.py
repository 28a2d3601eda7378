"""Placement by class: tasks alike share one feasibility and scoring pass per cycle.

A class is a task's effective request plus every filter's and weighted scorer's `class_key`
(see `phalanx.core.extension.ClassKeyed`). For each class the session keeps, for every node,
whether it passes the checks and filters, its usable GPUs and its total score, and refreshes
only the nodes whose version changed since (a placement, a rollback or an eviction on node i
stamps node i; nothing else changes a node within a cycle). The best node comes from a heap
ordered as `Session.pick` orders with tie_break `name`: the highest score, then the node first
in `node_rank`, then the lowest index; entries that no longer match their node's current score
are dropped as they surface. The answer is the one the full pass would give, by construction:
every check, filter and scorer that takes part is evaluated per node by the same code, on the
same node state, and the scorers are called once per placement as the full pass calls them.

A plugin without `class_key`, or one whose `class_key` is None for this task (gang-affinity
once a gang has members placed, locality for a task with a dataset), a task with DRA claims,
a placement restricted to a topology domain, a random tie-break, and a score that is not a
number take the full pass. A class is built at its second use in a cycle, if the first was
recent (see `lookup`): a request seen once costs what it did.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

from phalanx.core.cluster import IntArray
from phalanx.core.extension import SCORES_ZERO, FloatArray, NodeScorer, PlacementContext
from phalanx.core.feasibility import Candidates, find_candidates
from phalanx.core.model import Task, TaskRequest
from phalanx.core.traits import class_keyed

if TYPE_CHECKING:
    from phalanx.core.session import Session

ClassKey = tuple[object, ...]
BEHIND_MAX = 32  # a class further behind than this many changes is not worth catching up
CLASSES_MAX = 16  # classes kept per cycle (each holds a few arrays and a heap over the nodes)
BUILDS_PER_USE_MAX = 8  # a cycle that builds a class for fewer than 8 uses each stops building them
HEAP_AFTER = 8  # uses before a class keeps a heap (its build costs a few full passes; a pick then ~4 us)


class PlacementClass:
    """Feasibility, usable GPUs and scores of one class on every node, as of `mark`."""

    __slots__ = ("heap", "live", "mark", "ok", "request", "score", "usable", "uses")

    def __init__(self, request: TaskRequest, n: int, g: int) -> None:
        self.request = request
        self.ok = np.zeros(n, dtype=np.bool_)
        self.score = np.zeros(n, dtype=np.float64)
        self.usable = np.zeros((n, g), dtype=np.bool_)
        # (-score, node rank, node), Session.pick's order; built once the class has had HEAP_AFTER uses
        self.heap: list[tuple[float, int, int]] | None = None
        self.uses = 0
        self.mark = (-1, -1, 0)  # the cluster's change log when last brought up to date
        self.live: list[tuple[NodeScorer, float]] = []  # the weighted scorers not SCORES_ZERO for it


class PlacementClasses:
    """The classes of one session (one cycle)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        p = session.profile
        self.filters = list(p.filters)
        self.scorers = [s for s, w in p.scorers if w]
        self.weighted = [(s, w) for s, w in p.scorers if w]
        plugins: list[object] = [*self.filters, *self.scorers]
        self.keyed = class_keyed(plugins)  # declared (a class-statement check, not a runtime protocol's)
        # NUMA alignment is decided device by device on the node (core.numa): no class shares it
        numa = session.snapshot.cluster.numa_any
        self.enabled = p.tie_break == "name" and len(self.keyed) == len(plugins) and not numa
        self.classes: dict[ClassKey, PlacementClass] = {}
        self.seen: dict[ClassKey, tuple[int, int, int]] = {}  # class -> the cluster's mark at its last use
        self.broken: set[ClassKey] = set()
        self.builds = 0  # classes built this cycle
        self.used = 0  # placements that took a class
        c = session.snapshot.cluster
        self.rank_list: list[int] = []  # the snapshot's node_rank as a list, once a class is built
        self.n = len(c)
        self.g = c.max_gpus

    def key(self, task: Task, req: TaskRequest) -> ClassKey | None:
        """The task's class, or None when some plugin's answer depends on more than node state."""
        if req.claims:
            return None
        parts: list[object] = [req.shape_key]
        s = self.session
        for plugin in self.keyed:
            k = plugin.class_key(s, task, req)
            if k is None:
                return None
            parts.append(k)
        return tuple(parts)

    def behind(self, mark: tuple[int, int, int]) -> int:
        """At most how many nodes changed since `mark` (changes logged since; huge after a reset)."""
        c = self.session.snapshot.cluster
        return len(c.log) - mark[2] if mark[1] == c.log_epoch else self.n + 1

    def lookup(self, task: Task, req: TaskRequest) -> PlacementClass | None:
        """The task's class brought up to date, or None to take the full pass.

        A class pays off when its tasks come close together (replicas, a gang, a stream of alike
        pods); one whose last use is more than BEHIND_MAX changes back takes the full pass (and
        is dropped), at most CLASSES_MAX classes are kept, the most recently used, and a cycle
        whose classes serve fewer than BUILDS_PER_USE_MAX placements per build stops using them.
        """
        if not self.enabled:
            return None
        key = self.key(task, req)
        if key is None or key in self.broken:
            return None
        cls = self.classes.pop(key, None)
        if cls is not None and self.behind(cls.mark) > BEHIND_MAX:
            cls = None  # dropped: rebuilt if its next task comes soon
        if cls is None:
            last = self.seen.get(key)
            self.seen[key] = self.session.snapshot.cluster.mark()
            if last is None or self.behind(last) > BEHIND_MAX:
                return None
            self.builds += 1
            if self.builds * BUILDS_PER_USE_MAX > self.used and self.used >= 256:
                # classes too short-lived to pay for their builds (many shapes, few of each): stop
                self.enabled = False
                self.classes.clear()
                return None
            cls = PlacementClass(req, self.n, self.g)
            tail = key[1 + len(self.filters) :]
            cls.live = [sw for sw, k in zip(self.weighted, tail, strict=True) if k is not SCORES_ZERO]
        if not self.sync(cls, task):
            self.broken.add(key)  # a score that is not a number: this class takes the full pass
            return None
        self.used += 1
        self.classes[key] = cls  # the most recently used last
        if len(self.classes) > CLASSES_MAX:
            del self.classes[next(iter(self.classes))]
        return cls

    def sync(self, cls: PlacementClass, task: Task) -> bool:
        """Recompute the nodes changed since the class was last brought up to date.

        The scorers are called once per placement that has candidates, as the full pass calls
        them (over no nodes when none changed): a scorer that refreshes state lazily (FGD's node
        signatures) sees the same sequence of calls, so what it memoises, and in which batches
        it computes it, stays the same.
        """
        c = self.session.snapshot.cluster
        if c._stamp == cls.mark[0]:
            self.touch(cls, task)
            return True
        full = cls.mark[0] < 0
        rows: IntArray = (
            np.arange(self.n, dtype=np.int64) if full else np.array(c.changed_since(cls.mark), dtype=np.int64)
        )
        cls.mark = c.mark()
        ctx = self.context(
            task, cls.request, find_candidates(self.session.snapshot, cls.request, within=rows)
        )
        cls.ok[rows] = False
        kept = ctx.candidates.nodes
        if not len(kept):
            self.touch(cls, task)
            return True
        scores = self.scores(cls, ctx)
        if np.isnan(scores).any():
            return False
        cls.ok[kept] = True
        cls.score[kept] = scores
        cls.usable[kept] = ctx.candidates.usable_all()
        if cls.heap is not None:
            nodes = kept.tolist()
            for e in zip((-scores).tolist(), [self.rank_list[i] for i in nodes], nodes, strict=True):
                heapq.heappush(cls.heap, e)
            if len(cls.heap) > 4 * self.n:  # compact: one entry per feasible node
                self.build_heap(cls)
        return True

    def build_heap(self, cls: PlacementClass) -> None:
        """One heap entry per feasible node, from the class's arrays."""
        if not self.rank_list:
            self.rank_list = self.session.snapshot.node_rank.tolist()
        live = np.nonzero(cls.ok)[0].tolist()
        cls.heap = list(
            zip((-cls.score[live]).tolist(), [self.rank_list[i] for i in live], live, strict=True)
        )
        heapq.heapify(cls.heap)

    def scores(self, cls: PlacementClass, ctx: PlacementContext) -> FloatArray:
        """`Session.scores` without the scorers that said SCORES_ZERO (the sum is the same)."""
        total = np.zeros(len(ctx.candidates), dtype=np.float64)
        for scorer, weight in cls.live:
            total += weight * scorer.score(ctx)
        return total

    def touch(self, cls: PlacementClass, task: Task) -> None:
        """Call the scorers over no nodes if the class has candidates (see `sync`)."""
        if cls.live and cls.ok.any():
            none = Candidates(self.session.snapshot.cluster, cls.request, np.zeros(0, dtype=np.int64))
            self.scores(cls, PlacementContext(self.session, task, cls.request, none))

    def context(self, task: Task, req: TaskRequest, cand: Candidates) -> PlacementContext:
        """The profile's filters over `cand`, as `Session.candidates` applies them."""
        ctx = PlacementContext(self.session, task, req, cand)
        for f in self.filters:
            if not len(ctx.candidates):
                break
            keep = f.keep(ctx)
            if not keep.all():
                ctx = PlacementContext(self.session, task, req, ctx.candidates.subset(keep))
        return ctx

    def best(self, cls: PlacementClass, skip: set[int]) -> int | None:
        """The best node of the class not in `skip` (highest score, then node rank), or None.

        A node whose best score is -inf, or none at all, returns -1: the full pass decides then.
        """
        cls.uses += 1
        if cls.heap is None:
            if cls.uses < HEAP_AFTER:
                return self.best_by_arrays(cls, skip)
            self.build_heap(cls)
        heap = cls.heap
        assert heap is not None
        ok, score = cls.ok, cls.score
        held: list[tuple[float, int, int]] = []
        out: int | None = None
        while heap:
            neg, _, i = heap[0]
            if not ok[i] or score[i] != -neg:
                heapq.heappop(heap)
                continue
            if i in skip:
                held.append(heapq.heappop(heap))
                continue
            out = i if neg != np.inf else -1
            break
        for e in held:
            heapq.heappush(heap, e)
        return out

    def best_by_arrays(self, cls: PlacementClass, skip: set[int]) -> int | None:
        """`best` as `Session.pick` finds it, over the class's arrays (before a heap pays off)."""
        alive = cls.ok.copy()
        for i in skip:
            alive[i] = False
        masked = np.where(alive, cls.score, -np.inf)
        if not alive.any():
            return None
        top = masked.max()
        if top == -np.inf:
            return -1
        ties = np.nonzero(masked == top)[0]
        if len(ties) == 1:
            return int(ties[0])
        return int(ties[np.argmin(self.session.snapshot.node_rank[ties])])

    def candidate(self, cls: PlacementClass, task: Task, i: int) -> PlacementContext:
        """A context holding node i alone, with the class's usable GPUs on it (for device selection)."""
        c = self.session.snapshot.cluster
        cand = Candidates(c, cls.request, np.array([i], dtype=np.int64), cls.usable[i : i + 1].copy())
        return PlacementContext(self.session, task, cls.request, cand)
