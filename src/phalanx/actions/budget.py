"""Eviction budgets: at most so many workloads evicted, or GPU-hours lost, an hour, per queue and
in the whole cluster.

Every eviction is a restart that someone pays for (rendezvous, image pull, data loader, NCCL
init, the work since the last checkpoint). Preempt and reclaim take `budget: {queue: N, cluster:
M, queue_gpu_hours: G, cluster_gpu_hours: H}`: a victim is not evicted when its queue had N of its
workloads evicted in the last hour (by any action), or the cluster M; nor when the GPU-hours its
eviction loses (its work since the last checkpoint and its restart, as the victim order counts
them: `Victim.cost`) would take its queue's hour past G, or the cluster's past H. A victim that
alone would lose more than such a budget is never evicted under it (the budget says what an hour
may lose at most). A waiting workload that needs it is told which budget holds it back and when
it frees (`QUEUE_BUDGET`, `CLUSTER_BUDGET`, `QUEUE_GPU_BUDGET`, `CLUSTER_GPU_BUDGET` holds; the
cycle wakes then). A preemptor of higher priority than its victim is never held (priority
preempts at once, as with the action's other guards), and such evictions still count.

The hour is read from the snapshot's recent evictions (`Snapshot.recent_evictions`) plus those
this cycle has made so far. A workload evicted counts once per eviction, whatever its pods; its
GPU-hours are those of all its evicted pods. Consolidate's moves count too (their lost work).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx.core.decisions import CLUSTER_BUDGET, CLUSTER_GPU_BUDGET, QUEUE_BUDGET, QUEUE_GPU_BUDGET, Hold
from phalanx.core.session import Session
from phalanx.core.snapshot import WINDOW_S, WorkloadEntry

if TYPE_CHECKING:
    from phalanx.actions.evict import Victim

Allow = Callable[["Victim", list["Victim"]], bool]
HOUR = 3600.0
Spent = tuple[str, float, float]  # (guard, when it frees: inf for never, the budget's limit)


@dataclass(frozen=True, slots=True)
class Budget:
    """Evictions an hour, and GPU-hours lost an hour: per queue (of its workloads) and in the
    cluster; 0 is no limit."""

    queue: int = 0
    cluster: int = 0
    queue_gpu_hours: float = 0.0
    cluster_gpu_hours: float = 0.0

    @property
    def on(self) -> bool:
        return self.queue > 0 or self.cluster > 0 or self.queue_gpu_hours > 0 or self.cluster_gpu_hours > 0

    @property
    def by_cost(self) -> bool:
        """A GPU-hour budget is asked: victims' costs are worked out for it."""
        return self.queue_gpu_hours > 0 or self.cluster_gpu_hours > 0

    @staticmethod
    def parse(d: Mapping[str, object] | None) -> Budget:
        """From a profile's `budget:` mapping; a wrong key or value says which."""
        if d is None:
            return Budget()
        if not isinstance(d, Mapping):
            raise ValueError(
                "budget must be a mapping like {queue: 6, cluster: 30} (evictions an hour) or "
                "{cluster_gpu_hours: 50} (GPU-hours lost an hour)"
            )
        known = ("queue", "cluster", "queue_gpu_hours", "cluster_gpu_hours")
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"budget: unknown key {unknown[0]!r} (known: {', '.join(known)})")
        out: dict[str, float] = {}
        for k, v in d.items():
            if k.endswith("_gpu_hours"):
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                    raise ValueError(f"budget.{k} must be a number of GPU-hours lost an hour >= 0, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"budget.{k} must be a whole number of evictions an hour >= 0, got {v!r}")
            out[k] = v
        return Budget(**out)  # type: ignore[arg-type]


NO_BUDGET = Budget()


class _Tally:
    """This cycle's evictions so far, by the victims' queues ('' counts them all): how many, and
    the GPU-seconds they lose."""

    __slots__ = ("cost", "count")

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.cost: dict[str, float] = {}

    def add(self, queue: str, cost: float) -> None:
        for q in (queue, ""):
            self.count[q] = self.count.get(q, 0) + 1
            self.cost[q] = self.cost.get(q, 0.0) + cost


def _cycle(session: Session) -> _Tally:
    got = session.memo.get("budget-cycle")
    if not isinstance(got, _Tally):
        got = session.memo["budget-cycle"] = _Tally()
    return got


def note(session: Session, victims: list[Victim]) -> None:
    """Count evictions just committed in this cycle (each workload once, with all its cost)."""
    tally = _cycle(session)
    cost: dict[str, float] = {}
    queue: dict[str, str] = {}
    for v in victims:
        cost[v.name] = cost.get(v.name, 0.0) + v.cost
        queue[v.name] = v.entry.workload.queue
    for name, c in cost.items():
        tally.add(queue[name], c)


Past = list[tuple[float, float]]  # (when, GPU-seconds lost) of the hour's evictions, oldest first


def _hour(session: Session) -> tuple[dict[str, Past], Past]:
    """The evictions of the last hour, by queue and all, sorted (per cycle)."""
    got = session.memo.get("budget-hour")
    if isinstance(got, tuple):
        return got
    by_queue: dict[str, Past] = {}
    every: Past = []
    for t, _, q, cost in session.snapshot.recent_evictions(session.clock):
        by_queue.setdefault(q, []).append((t, cost))
        every.append((t, cost))
    for past in by_queue.values():
        past.sort()
    every.sort()
    session.memo["budget-hour"] = out = (by_queue, every)
    return out


def _frees_at(past: Past, now_count: int, limit: int, now: float) -> float | None:
    """When one more eviction fits under `limit` (None: it fits now); `now_count` happen at `now`."""
    if len(past) + now_count < limit:
        return None
    times = [t for t, _ in past] + [now] * now_count  # past is sorted and before now
    return times[len(times) - limit] + WINDOW_S


def _cost_frees_at(
    past: Past, now_cost: float, cost: float, limit_h: float, now: float, room: bool = False
) -> float | None:
    """When an eviction losing `cost` GPU-seconds fits under `limit_h` GPU-hours an hour (None: it
    fits now; inf: never, it alone loses more); `now_cost` is lost at `now`. With `room`: when the
    hour has any room left at all (what it lost is below the budget)."""
    limit = limit_h * HOUR

    def fits(total: float) -> bool:
        return total < limit if room else total <= limit

    total = sum(c for _, c in past) + now_cost + cost
    if fits(total):
        return None
    if cost > limit:
        return math.inf
    for t, c in past:  # the oldest leave the hour first
        total -= c
        if fits(total):
            return t + WINDOW_S
    return now + WINDOW_S  # what this cycle evicted leaves the hour last


def _later(out: Spent | None, guard: str, at: float | None, limit: float) -> Spent | None:
    return out if at is None or (out is not None and out[1] >= at) else (guard, at, limit)


def spent(
    session: Session,
    budget: Budget,
    queue: str,
    more_queue: int = 0,
    more_cluster: int = 0,
    cost: float = 0.0,
    more_cost: tuple[float, float] = (0.0, 0.0),
) -> Spent | None:
    """(guard, when it frees, the budget) if one more eviction of `queue`'s workloads, losing `cost`
    GPU-seconds, would go over a budget, after `more_*` not committed yet (`more_cost`: the
    queue's and the cluster's GPU-seconds); the latest-freeing one if several; None if none."""
    if not budget.on:
        return None
    by_queue, every = _hour(session)
    tally = _cycle(session)
    now = session.clock
    out: Spent | None = None
    if budget.queue:
        at = _frees_at(by_queue.get(queue, []), tally.count.get(queue, 0) + more_queue, budget.queue, now)
        out = _later(out, QUEUE_BUDGET, at, budget.queue)
    if budget.cluster:
        at = _frees_at(every, tally.count.get("", 0) + more_cluster, budget.cluster, now)
        out = _later(out, CLUSTER_BUDGET, at, budget.cluster)
    if budget.queue_gpu_hours:
        now_cost = tally.cost.get(queue, 0.0) + more_cost[0]
        at = _cost_frees_at(by_queue.get(queue, []), now_cost, cost, budget.queue_gpu_hours, now)
        out = _later(out, QUEUE_GPU_BUDGET, at, budget.queue_gpu_hours)
    if budget.cluster_gpu_hours:
        now_cost = tally.cost.get("", 0.0) + more_cost[1]
        at = _cost_frees_at(every, now_cost, cost, budget.cluster_gpu_hours, now)
        out = _later(out, CLUSTER_GPU_BUDGET, at, budget.cluster_gpu_hours)
    return out


def until(at: float) -> float | None:
    """A budget's end as a hold says it: None when it never frees for this victim."""
    return None if math.isinf(at) else at


def admits(
    session: Session,
    budget: Budget,
    exempt: Callable[[WorkloadEntry], bool] | None,
    inner: Allow | None,
) -> Allow | None:
    """`inner` (an eviction's own allow), and the budget counting the victims taken before this one."""
    if not budget.on:
        return inner

    def allow(v: Victim, taken: list[Victim]) -> bool:
        if inner is not None and not inner(v, taken):
            return False
        entry = v.entry
        if exempt is not None and exempt(entry):
            return True
        q = entry.workload.queue
        others = [t for t in taken if t.entry.name != entry.name]
        names = {t.entry.name: t.entry.workload.queue for t in others}
        same = sum(1 for wq in names.values() if wq == q)
        cost_q = sum(t.cost for t in others if t.entry.workload.queue == q)
        cost_all = sum(t.cost for t in others)
        mine = v.cost + sum(t.cost for t in taken if t.entry.name == entry.name)
        return spent(session, budget, q, same, len(names), mine, (cost_q, cost_all)) is None

    return allow


def cluster_hold(session: Session, budget: Budget, action: str) -> Hold | None:
    """The whole cluster's budget spent: one hold until it frees, with no victim named. Working out
    which victims a waiting workload would need (a what-if each) says nothing more then, and with
    most preemptors held it was most of a replay's time."""
    by_count = by_cost = None
    tally, now = _cycle(session), session.clock
    if budget.cluster:
        by_count = _frees_at(_hour(session)[1], tally.count.get("", 0), budget.cluster, now)
    if budget.cluster_gpu_hours:
        lost = tally.cost.get("", 0.0)
        by_cost = _cost_frees_at(_hour(session)[1], lost, 0.0, budget.cluster_gpu_hours, now, room=True)
    if by_count is not None and (by_cost is None or by_count >= by_cost):
        return Hold(action, CLUSTER_BUDGET, "", by_count, float(budget.cluster))
    if by_cost is not None:
        return Hold(action, CLUSTER_GPU_BUDGET, "", by_cost, float(budget.cluster_gpu_hours))
    return None


def queues_hold(session: Session, budget: Budget, action: str, queues: set[str]) -> Hold | None:
    """Every queue the victims could come from has its budget spent: one hold until the first frees,
    with no victim named (as `cluster_hold`: the what-if would only name the same budgets, and with a
    tight queue budget it was most of a replay's time)."""
    if not (budget.queue or budget.queue_gpu_hours) or not queues:
        return None
    frees = []
    guards = set()
    for q in sorted(queues):
        got = _queue_spent(session, budget, q)
        if got is None:
            return None
        guards.add(got[0])
        frees.append(got[1])
    if len(guards) > 1:
        return None  # spent in different ways: the what-if names each
    guard = guards.pop()
    limit = budget.queue if guard == QUEUE_BUDGET else budget.queue_gpu_hours
    return Hold(action, guard, "", min(frees), float(limit), ", ".join(sorted(queues)))


def _queue_spent(session: Session, budget: Budget, queue: str) -> tuple[str, float] | None:
    """The queue's own budget left no room for any eviction: (guard, when it frees)."""
    by_queue, _ = _hour(session)
    tally = _cycle(session)
    past, now = by_queue.get(queue, []), session.clock
    out: tuple[str, float] | None = None
    if budget.queue:
        at = _frees_at(past, tally.count.get(queue, 0), budget.queue, now)
        if at is not None:
            out = (QUEUE_BUDGET, at)
    if budget.queue_gpu_hours:
        at = _cost_frees_at(past, tally.cost.get(queue, 0.0), 0.0, budget.queue_gpu_hours, now, room=True)
        if at is not None and (out is None or at > out[1]):
            out = (QUEUE_GPU_BUDGET, at)
    return out
