"""Reclaim: a queue short of what it is owed takes capacity back from queues that borrowed.

`owed: deserved` (default, Kueue's reclaim within a cohort): a queue below its deserved
quota may evict workloads of queues above theirs, never taking them below it. The surplus
beyond deserved quotas is shared by the allocation order (queues furthest below their fair
share go first), not by evictions, so queues do not take turns evicting each other.
`owed: fair` (KAI-like): the same with the fair share (never below deserved) in place of
the deserved quota: fairer surplus, more evictions.
`transfer: true`: a queue below what it is owed may end above it, but never richer (relative
to what each is owed) than a queue it takes from, so big gangs of a poor queue can reclaim.
Elastic surplus goes first, then the least lost work. Nothing is evicted unless the
preemptor then fits. A queue that finds no victims because a guard protects them (the minimum
runtime, a workload that is not preemptible) is told which guard and until when (`actions.holds`).
`checkpoint_window` and `repeat_window` are the victim guards of `actions.evict.Guards` (see
`Preempt`): with `repeat_window` two queues cannot take the same workloads back and forth.
`budget: {queue: N, cluster: M}` caps the evictions an hour (`actions.budget`). `margin: m`
(hysteresis, a fraction of what is owed): a queue reclaims only below (1 - m) x what it is owed,
and only from queues above (1 + m) x theirs, so two queues near their shares do not trade
workloads back and forth.
`max_loss_per_gpu: S` (seconds; 0 is off) weighs a reclaim's cost against its gain where the gain
is fairness beyond a guarantee: a reclaim that takes the queue above its deserved quota may make
its victims lose (their work since the last checkpoint plus their restart, as the victim order
counts them, over the victims evicted in the end) at most S seconds of GPU time for each GPU the
waiting workload gets back. One that would lose more waits, and the waiting workload is told what
it would lose (`RECLAIM_COST`). Up to its deserved quota a queue reclaims whatever it costs (as in
Kueue and KAI, the quota is a guarantee).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from phalanx.actions import budget as budgets
from phalanx.actions import holds
from phalanx.actions.budget import Budget
from phalanx.actions.evict import Guards, Victim, evict_for, peek, victims
from phalanx.actions.gang import gang_tasks
from phalanx.actions.leaving import past_leaving
from phalanx.core.decisions import RECLAIM_COST, Hold
from phalanx.core.model import MILLI, Task
from phalanx.core.queues import GPU
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry

EPS = 1e-6


class Reclaim:
    name = "reclaim"

    def __init__(
        self,
        min_runtime: float = 0.0,
        max_preemptors: int = 16,
        owed: str = "deserved",
        transfer: bool = False,
        checkpoint_window: float = 0.0,
        repeat_window: float = 0.0,
        budget: dict[str, object] | None = None,
        restart_s: float = 0.0,
        margin: float = 0.0,
        max_loss_per_gpu: float = 0.0,
    ) -> None:
        if checkpoint_window < 0 or repeat_window < 0 or not 0 <= restart_s < float("inf"):
            raise ValueError("checkpoint_window, repeat_window and restart_s must be >= 0 s")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must be a fraction of what a queue is owed in [0, 1), got {margin!r}")
        self.margin = margin
        if (
            isinstance(max_loss_per_gpu, bool)
            or not isinstance(max_loss_per_gpu, int | float)
            or not 0.0 <= max_loss_per_gpu < float("inf")
        ):
            raise ValueError(f"max_loss_per_gpu must be seconds of GPU time >= 0, got {max_loss_per_gpu!r}")
        self.max_loss_per_gpu = max_loss_per_gpu
        self.guards = Guards(checkpoint_window, repeat_window, Budget.parse(budget), restart_s)
        if owed not in ("deserved", "fair"):
            raise ValueError("owed must be 'deserved' or 'fair'")
        self.min_runtime = min_runtime
        self.max_preemptors = max_preemptors
        self.owed = owed
        self.transfer = transfer

    def execute(self, session: Session) -> None:
        s = session.snapshot
        tree = s.queues
        if tree is None:
            return
        zero = np.zeros(3)
        if self.owed == "fair":
            fair = session.fair_shares()
            owed = {q: np.maximum(fair.get(q, zero), tree.deserved[q]) for q in tree.queues}
        else:
            owed = dict(tree.deserved)
        tries = 0
        failed: set[object] = set()  # (queue, demand) that could not reclaim: their likes cannot either
        waiting = session.pending_by_queue()
        low, high = 1.0 - self.margin, 1.0 + self.margin
        short = [q for q in waiting if s.usage_of(q)[GPU] < low * owed[q][GPU] - EPS]
        for entry in past_leaving(session, session.pending_for_eviction(short)):  # see preempt
            if tries >= self.max_preemptors:
                break
            q = entry.workload.queue
            if s.usage_of(q)[GPU] >= low * owed[q][GPU] - EPS or (q, entry.demand_key) in failed:
                continue  # owed nothing any more, or alike ones found no victims
            gang, _ = gang_tasks(entry)
            if not gang:  # placed earlier in this cycle
                continue
            ask = session.request_of(gang)
            after = s.usage_of(q)[GPU] + ask[GPU]
            # with transfer, a queue below what it is owed may end above it, but never richer
            # (relative to what each is owed) than a queue it takes from: every move narrows the gap
            if not self.transfer and after > owed[q][GPU] + EPS:
                continue
            level = after / owed[q][GPU] if owed[q][GPU] > EPS else float("inf")
            over = {
                name
                for name in tree.queues
                if tree.is_leaf(name) and name != q and s.usage_of(name)[GPU] > high * owed[name][GPU] + EPS
            }
            if not over:
                continue

            def keeps_deserved(v: Victim, taken: list[Victim], level: float = level) -> bool:
                """After evicting v (earlier victims are already out), its queue keeps what it is owed."""
                vq = v.entry.workload.queue
                still = [a for a in v.allocs if a.task.name in s.allocations]
                left = s.usage_of(vq)[GPU] - sum(s.alloc_vector(a)[GPU] for a in still)
                if left < owed[vq][GPU] - EPS:
                    return False
                return not self.transfer or left >= level * owed[vq][GPU] - EPS

            shape = entry.demand_key
            cands = peek(
                victims(session, partial(_in_queues, over), self.min_runtime, over, self.guards, shape)
            )
            if cands is None:
                failed.add((q, entry.demand_key))
                self._hold(session, entry, gang, over, keeps_deserved)
                continue
            tries += 1
            allow = budgets.admits(session, self.guards.budget, None, keeps_deserved)
            # the cost is weighed above the queue's deserved quota only: that quota is its guarantee
            beyond = after > tree.deserved[q][GPU] + EPS
            worth = Worth(session, gang, self.max_loss_per_gpu) if self.max_loss_per_gpu and beyond else None
            why = f"reclaimed by queue {q} for {entry.name}"
            taken = evict_for(session, entry, gang, cands, why, allow, worth)
            if taken is not None:
                session.pending.pop(entry.name, None)
                continue
            failed.add((q, entry.demand_key))
            if worth is not None and worth.refused:  # room was there; the cost held it back
                holds.note(session, entry, (worth.hold(self.name),))
                continue
            self._hold(session, entry, gang, over, keeps_deserved)

    def _hold(
        self,
        session: Session,
        entry: WorkloadEntry,
        gang: list[Task],
        over: set[str],
        allow: Callable[[Victim, list[Victim]], bool],
    ) -> None:
        """No victims made room: if guarded ones would, say which guard holds each back, and until when."""
        spent = budgets.cluster_hold(session, self.guards.budget, self.name) or budgets.queues_hold(
            session, self.guards.budget, self.name, over
        )
        if spent is not None:
            holds.note(session, entry, (spent,))
            return
        if not holds.budget(session, self.name):
            return
        guarded = []
        for v in holds.running_in(session, over):
            detail = f"queue {v.workload.queue}"
            shape = entry.demand_key
            hold = holds.guard_of(session, self.name, v, self.min_runtime, detail, self.guards, shape)
            if hold is not None:
                guarded.append((holds.as_victim(session, v), hold))
        shape = entry.demand_key
        free = victims(session, partial(_in_queues, over), self.min_runtime, over, self.guards, shape)
        window = self.guards.checkpoint_window
        holds.note(session, entry, holds.held_back(session, entry, gang, free, guarded, allow, window))


class Worth:
    """The cost rule: the victims a reclaim would evict in the end may lose at most what the GPUs
    it gives back are worth; remembers the set it refused, and says so as a hold."""

    def __init__(self, session: Session, gang: list[Task], per_gpu: float) -> None:
        s = session.snapshot
        self.gpus = sum(s.gpu_milli_asked(session.effective(t.request)) for t in gang) / MILLI
        self.per_gpu = per_gpu
        self.refused: list[Victim] = []

    def __call__(self, taken: list[Victim]) -> bool:
        if sum(v.cost for v in taken) <= self.gpus * self.per_gpu + EPS:
            return True
        self.refused = taken
        return False

    def hold(self, action: str) -> Hold:
        names = sorted({v.name for v in self.refused})
        who = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        lost_h = sum(v.cost for v in self.refused) / 3600.0
        detail = f"{lost_h:.2f} GPU-h for {self.gpus:g} GPU{'s' if self.gpus != 1 else ''}"
        return Hold(action, RECLAIM_COST, who, None, self.per_gpu, detail)


def _in_queues(queues: set[str], entry: WorkloadEntry) -> bool:
    return entry.workload.queue in queues
