"""Per-queue GPU share over time against fair share, and Jain's fairness index.

The replay tells this tracker when a job arrives, starts, stops and ends; at each sample it
computes every leaf queue's fair share of GPUs from the queue tree and the queues' demand
(running + waiting GPUs). Without a queue tree, the trace's queues are leaves of one flat tree
with equal weights and no quotas: fair share is then max-min fair (water-filling).
Jain's index is taken over the queues with demand, on usage / fair share (1 = perfectly fair).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from phalanx.core.model import MILLI
from phalanx.core.queues import GPU, RESOURCES, Queue, QueueTree, Vector, fair_shares


def flat_tree(queues: Iterable[str]) -> QueueTree:
    return QueueTree(Queue(q) for q in sorted(set(queues)))


def jain(x: np.ndarray) -> float:
    """Jain's index (sum x)^2 / (n sum x^2); 1 when every x is equal, 1/n when one takes all."""
    if not len(x):
        return 1.0
    sq = float((x * x).sum())
    return float(x.sum() ** 2 / (len(x) * sq)) if sq > 0 else 1.0


@dataclass
class QueueShares:
    tree: QueueTree
    capacity_gpus: float
    leaves: list[str] = field(init=False)
    times: list[float] = field(default_factory=list)
    use: list[np.ndarray] = field(default_factory=list)  # GPUs per leaf, per sample
    fair: list[np.ndarray] = field(default_factory=list)
    index: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.leaves = [q for q in self.tree.queues if self.tree.is_leaf(q)]
        self._pos = {q: k for k, q in enumerate(self.leaves)}
        self._running = np.zeros(len(self.leaves))
        self._waiting = np.zeros(len(self.leaves))
        self._last_key = b""
        self._last_fair = np.zeros(len(self.leaves))

    def arrive(self, queue: str, gpus: float) -> None:
        self._waiting[self._pos[queue]] += gpus

    def withdraw(self, queue: str, gpus: float) -> None:
        """Demand that goes away unserved: the part of an elastic job that never ran when it ends."""
        self._waiting[self._pos[queue]] -= gpus

    def start(self, queue: str, gpus: float) -> None:
        """Waiting GPUs start running (negative: an elastic job shrinks and wants them again)."""
        k = self._pos[queue]
        self._waiting[k] -= gpus
        self._running[k] += gpus

    def stop(self, queue: str, gpus: float, done: bool) -> None:
        """A running job ends (done) or is stopped and waits again."""
        k = self._pos[queue]
        self._running[k] -= gpus
        if not done:
            self._waiting[k] += gpus

    def sample(self, t: float) -> None:
        demand = self._running + np.maximum(self._waiting, 0.0)
        if len(self.leaves) == 1:  # one queue: its fair share is what it asks, up to everything
            fair = np.minimum(demand, self.capacity_gpus)
        else:
            key = demand.tobytes()
            if key != self._last_key:  # fair shares depend only on the demand
                self._last_key = key
                self._last_fair = self._fair(demand)
            fair = self._last_fair
        if self.times and self.times[-1] == t:
            self.times.pop(), self.use.pop(), self.fair.pop(), self.index.pop()
        self.times.append(t)
        self.use.append(self._running.copy())
        self.fair.append(fair)
        active = fair > 1e-9
        # fairness only means something while two or more queues want GPUs
        self.index.append(jain(self._running[active] / fair[active]) if active.sum() >= 2 else np.nan)

    def _fair(self, demand: np.ndarray) -> np.ndarray:
        cap = np.zeros(len(RESOURCES))
        cap[GPU] = self.capacity_gpus * MILLI  # the tree's quotas are in milli-GPU
        vec: dict[str, Vector] = {}
        for q, d in zip(self.leaves, demand, strict=True):
            v = np.zeros(len(RESOURCES))
            v[GPU] = d * MILLI
            vec[q] = v
        shares = fair_shares(self.tree, cap, vec)
        return np.array([shares[q][GPU] / MILLI if q in shares else 0.0 for q in self.leaves])

    def mean_index(self) -> float:
        """Time-weighted Jain's index over the time two or more queues wanted GPUs (nan if never)."""
        if len(self.times) < 2:
            return float("nan")
        dt = np.diff(np.array(self.times))
        idx = np.array(self.index[:-1])
        ok = ~np.isnan(idx) & (dt > 0)
        span = dt[ok].sum()
        return float((idx[ok] * dt[ok]).sum() / span) if span > 0 else float("nan")
