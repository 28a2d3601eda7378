"""The queue tree: deserved quota, over-quota weight, limit, borrowing and lending per resource.

Resources are accounted as a vector `(gpu, cpu, memory)`: weighted milli-GPU (a GPU model
may count for more, so that an H100-hour weighs more than a T4-hour), milli-CPU and MiB.
Only leaf queues hold workloads. Semantics follow KAI (deserved quota, over-quota weight,
limit, queue priority) and Kueue (borrowing and lending limits):

- a queue may use more than its deserved quota (borrow) up to `borrowing_limit` beyond it,
  and never more than its `limit`;
- of its deserved quota, a queue lends at most `lending_limit` to others: the rest stays
  free for it even while it is idle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from phalanx.core.errors import SpecError

RESOURCES = ("gpu", "cpu", "memory")
GPU, CPU, MEM = 0, 1, 2
INF = math.inf
Vector = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    deserved: float = 0.0
    limit: float = INF
    over_quota_weight: float = 1.0
    borrowing_limit: float = INF
    lending_limit: float = INF

    def __post_init__(self) -> None:
        for name in ("deserved", "limit", "over_quota_weight", "borrowing_limit", "lending_limit"):
            v = getattr(self, name)
            if math.isnan(v) or v < 0:
                raise SpecError(name, f"must be a number >= 0, got {v}")
        if self.limit < self.deserved:
            raise SpecError("limit", f"limit {self.limit:g} is below the deserved quota {self.deserved:g}")


@dataclass(frozen=True, slots=True)
class Queue:
    name: str
    parent: str = ""
    quotas: Mapping[str, ResourceQuota] = field(default_factory=dict)
    priority: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("name", "queue name must not be empty")
        for r in self.quotas:
            if r not in RESOURCES:
                raise SpecError(f"quotas.{r}", f"unknown resource (known: {', '.join(RESOURCES)})")

    def vec(self, attr: str, default: float) -> Vector:
        return np.array(
            [getattr(self.quotas[r], attr) if r in self.quotas else default for r in RESOURCES],
            dtype=np.float64,
        )


class QueueTree:
    """Queues by name, with parent/child links and per-resource quota vectors."""

    def __init__(self, queues: Iterable[Queue], gpu_weights: Mapping[str, float] | None = None) -> None:
        self.queues: dict[str, Queue] = {}
        for q in queues:
            if q.name in self.queues:
                raise SpecError(f"queue {q.name!r}", "duplicate queue name")
            self.queues[q.name] = q
        self.gpu_weights = dict(gpu_weights or {})
        for m, w in self.gpu_weights.items():
            if not w > 0:
                raise SpecError(f"gpu_weights.{m}", f"weight must be > 0, got {w}")
        self.children: dict[str, list[str]] = {"": []}
        for q in self.queues.values():
            if q.parent and q.parent not in self.queues:
                raise SpecError(f"queue {q.name!r}.parent", f"unknown parent queue {q.parent!r}")
            self.children.setdefault(q.parent, []).append(q.name)
            self.children.setdefault(q.name, [])
        for kids in self.children.values():
            kids.sort()
        self._check_cycles()
        self.depth = {n: self._depth(n) for n in self.queues}
        self.deserved = {n: q.vec("deserved", 0.0) for n, q in self.queues.items()}
        self.limit = {n: q.vec("limit", INF) for n, q in self.queues.items()}
        self.weight = {n: q.vec("over_quota_weight", 1.0) for n, q in self.queues.items()}
        self.borrow = {n: q.vec("borrowing_limit", INF) for n, q in self.queues.items()}
        self.lend = {n: q.vec("lending_limit", INF) for n, q in self.queues.items()}
        # resources a queue has a quota for; deserved-quota rules apply only to these
        self.managed = {n: np.array([r in q.quotas for r in RESOURCES]) for n, q in self.queues.items()}
        self._ancestors = {n: self._chain(n) for n in self.queues}
        self._ceiling = {n: np.minimum(self.limit[n], self.deserved[n] + self.borrow[n]) for n in self.queues}
        self._reserve = {
            n: np.where(self.managed[n], np.maximum(self.deserved[n] - self.lend[n], 0.0), 0.0)
            for n in self.queues
        }
        # leaves that keep part of their quota even while idle (finite lending limits)
        self.keepers = [n for n in self.queues if self.is_leaf(n) and self._reserve[n].any()]

    def _check_cycles(self) -> None:
        for name in self.queues:
            seen = {name}
            p = self.queues[name].parent
            while p:
                if p in seen:
                    raise SpecError(f"queue {name!r}.parent", f"parent chain loops back to {p!r}")
                seen.add(p)
                p = self.queues[p].parent

    def _depth(self, name: str) -> int:
        d = 0
        p = self.queues[name].parent
        while p:
            d += 1
            p = self.queues[p].parent
        return d

    def is_leaf(self, name: str) -> bool:
        return name in self.queues and not self.children.get(name)

    def ancestors(self, name: str) -> list[str]:
        """The queue and its ancestors, leaf first."""
        return self._ancestors[name]

    def _chain(self, name: str) -> list[str]:
        out = []
        while name:
            out.append(name)
            name = self.queues[name].parent
        return out

    def gpu_weight(self, model: str) -> float:
        return self.gpu_weights.get(model, 1.0)

    def reserve(self, name: str) -> Vector:
        """The part of the deserved quota a queue never lends (0 for resources without a quota)."""
        return self._reserve[name]

    def ceiling(self, name: str) -> Vector:
        """The most a queue may use: its limit and deserved + borrowing limit."""
        return self._ceiling[name]


def water_fill(room: Vector, weight: Vector, amount: float) -> Vector:
    """Share `amount` in proportion to `weight`, never past each one's `room` (room <= 0 or weight 0: none).

    The level L solves sum(min(room, L * weight)) = amount; found by sorting room / weight.
    """
    out = np.zeros(len(room))
    ok = (room > 1e-9) & (weight > 0)
    if not ok.any() or amount <= 0:
        return out
    idx = np.nonzero(ok)[0]
    r, w = room[idx], weight[idx]
    order = np.argsort(r / w, kind="stable")
    r, w = r[order], w[order]
    level_at = r / w  # each one is full once the level reaches this
    full_before = np.cumsum(r) - r  # given to those already full at that level
    w_after = np.cumsum(w[::-1])[::-1]  # weight of those not yet full
    used = full_before + level_at * w_after
    k = int(np.searchsorted(used, amount))
    if k >= len(r):
        give = r
    else:
        level = (amount - full_before[k]) / w_after[k]
        give = np.minimum(r, level * w)
    out[idx[order]] = give
    return out


def fair_shares(tree: QueueTree, capacity: Vector, demand: Mapping[str, Vector]) -> dict[str, Vector]:
    """Fair share of every queue, top-down, per resource.

    At each level: first every child gets its deserved quota (up to its demand; scaled down
    if the parent's share cannot cover them all); then the surplus goes to children by
    priority tier, highest first, and within a tier in proportion to over-quota weight
    (water-filling), never past a child's demand or ceiling.
    `demand` is per leaf (usage + pending requests); inner queues sum their children.
    """
    total: dict[str, Vector] = {}

    def subtree_demand(name: str) -> Vector:
        kids = tree.children.get(name, [])
        d = (
            demand.get(name, np.zeros(len(RESOURCES)))
            if not kids
            else sum((subtree_demand(k) for k in kids), np.zeros(len(RESOURCES)))
        )
        total[name] = np.minimum(d, tree.ceiling(name)) if name else d
        return total[name]

    subtree_demand("")
    out: dict[str, Vector] = {}

    def split(parent: str, share: Vector) -> None:
        kids = tree.children.get(parent, [])
        if not kids:
            return
        n = len(RESOURCES)
        give = {k: np.zeros(n) for k in kids}
        want = {k: total[k] for k in kids}
        # 1. deserved, capped by demand; scaled if over the parent's share
        base = {k: np.minimum(tree.deserved[k], want[k]) for k in kids}
        need = sum(base.values(), np.zeros(n))
        scale = np.where(need > share, share / np.maximum(need, 1e-12), 1.0)
        for k in kids:
            give[k] = base[k] * scale
        left = np.maximum(share - sum(give.values(), np.zeros(n)), 0.0)
        # 2. surplus by priority tier, weight-proportional water-filling
        tiers = sorted({tree.queues[k].priority for k in kids}, reverse=True)
        for tier in tiers:
            members = [k for k in kids if tree.queues[k].priority == tier]
            for r in range(n):
                if left[r] <= 1e-9:
                    continue
                w = np.array([tree.weight[k][r] for k in members])
                room = np.array([want[k][r] - give[k][r] for k in members])
                add = water_fill(room, w, float(left[r]))
                for k, a in zip(members, add, strict=True):
                    give[k][r] += a
                left[r] -= float(add.sum())
        for k in kids:
            out[k] = give[k]
            split(k, give[k])

    split("", capacity)
    return out
