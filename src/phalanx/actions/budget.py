"""Eviction budgets: at most so many workloads evicted an hour, per queue and in the whole cluster.

Every eviction is a restart that someone pays for (rendezvous, image pull, data loader, NCCL
init, the work since the last checkpoint). Preempt and reclaim take `budget: {queue: N, cluster:
M}`: a victim is not evicted when its queue had N of its workloads evicted in the last hour (by
any action), or the cluster M. A waiting workload that needs it is told which budget holds it
back and when it frees (`QUEUE_BUDGET`, `CLUSTER_BUDGET` holds; the cycle wakes then). A
preemptor of higher priority than its victim is never held (priority preempts at once, as with
the action's other guards), and such evictions still count.

The hour is read from the snapshot's recent evictions (`Snapshot.recent_evictions`) plus those
this cycle has made so far. A workload evicted counts once per eviction, whatever its pods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx.core.decisions import CLUSTER_BUDGET, QUEUE_BUDGET, Hold
from phalanx.core.session import Session
from phalanx.core.snapshot import WINDOW_S, WorkloadEntry

if TYPE_CHECKING:
    from phalanx.actions.evict import Victim

Allow = Callable[["Victim", list["Victim"]], bool]


@dataclass(frozen=True, slots=True)
class Budget:
    """Evictions an hour: per queue (of its workloads) and in the cluster; 0 is no limit."""

    queue: int = 0
    cluster: int = 0

    @property
    def on(self) -> bool:
        return self.queue > 0 or self.cluster > 0

    @staticmethod
    def parse(d: Mapping[str, object] | None) -> Budget:
        """From a profile's `budget:` mapping; a wrong key or value says which."""
        if d is None:
            return Budget()
        if not isinstance(d, Mapping):
            raise ValueError("budget must be a mapping like {queue: 6, cluster: 30} (evictions an hour)")
        unknown = sorted(set(d) - {"queue", "cluster"})
        if unknown:
            raise ValueError(f"budget: unknown key {unknown[0]!r} (known: queue, cluster)")
        out = {}
        for k, v in d.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"budget.{k} must be a whole number of evictions an hour >= 0, got {v!r}")
            out[k] = v
        return Budget(**out)


NO_BUDGET = Budget()


def _cycle(session: Session) -> dict[str, int]:
    """This cycle's evictions so far, by the victims' queues ('' counts them all)."""
    got = session.memo.get("budget-cycle")
    if not isinstance(got, dict):
        got = {}
        session.memo["budget-cycle"] = got
    return got


def note(session: Session, entries: list[WorkloadEntry]) -> None:
    """Count evictions just committed in this cycle (each workload once)."""
    counts = _cycle(session)
    for e in {e.name: e for e in entries}.values():
        q = e.workload.queue
        counts[q] = counts.get(q, 0) + 1
        counts[""] = counts.get("", 0) + 1


def _hour(session: Session) -> tuple[dict[str, list[float]], list[float]]:
    """Times of the evictions of the last hour, by queue and all, sorted (per cycle)."""
    got = session.memo.get("budget-hour")
    if isinstance(got, tuple):
        return got
    by_queue: dict[str, list[float]] = {}
    every: list[float] = []
    for t, _, q in session.snapshot.recent_evictions(session.clock):
        by_queue.setdefault(q, []).append(t)
        every.append(t)
    for times in by_queue.values():
        times.sort()
    every.sort()
    session.memo["budget-hour"] = out = (by_queue, every)
    return out


def _frees_at(past: list[float], now_count: int, limit: int, now: float) -> float | None:
    """When one more eviction fits under `limit` (None: it fits now); `now_count` happen at `now`."""
    if len(past) + now_count < limit:
        return None
    times = past + [now] * now_count  # past is sorted and before now
    return times[len(times) - limit] + WINDOW_S


def spent(
    session: Session, budget: Budget, queue: str, more_queue: int = 0, more_cluster: int = 0
) -> tuple[str, float, int] | None:
    """(guard, when it frees, the budget) if one more eviction of `queue`'s workloads (after `more_*`
    not committed yet) would go over a budget; the later-freeing one if both; None if neither."""
    if not budget.on:
        return None
    by_queue, every = _hour(session)
    cycle = _cycle(session)
    now = session.clock
    out: tuple[str, float, int] | None = None
    if budget.queue:
        at = _frees_at(by_queue.get(queue, []), cycle.get(queue, 0) + more_queue, budget.queue, now)
        if at is not None:
            out = (QUEUE_BUDGET, at, budget.queue)
    if budget.cluster:
        at = _frees_at(every, cycle.get("", 0) + more_cluster, budget.cluster, now)
        if at is not None and (out is None or at > out[1]):
            out = (CLUSTER_BUDGET, at, budget.cluster)
    return out


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
        others = {t.entry.name: t.entry for t in taken if t.entry.name != entry.name}
        q = entry.workload.queue
        same = sum(1 for e in others.values() if e.workload.queue == q)
        return spent(session, budget, q, same, len(others)) is None

    return allow


def cluster_hold(session: Session, budget: Budget, action: str) -> Hold | None:
    """The whole cluster's budget spent: one hold until it frees, with no victim named. Working out
    which victims a waiting workload would need (a what-if each) says nothing more then, and with
    most preemptors held it was most of a replay's time."""
    if not budget.cluster:
        return None
    _, every = _hour(session)
    at = _frees_at(every, _cycle(session).get("", 0), budget.cluster, session.clock)
    return None if at is None else Hold(action, CLUSTER_BUDGET, "", at, float(budget.cluster))


def queues_hold(session: Session, budget: Budget, action: str, queues: set[str]) -> Hold | None:
    """Every queue the victims could come from has its budget spent: one hold until the first frees,
    with no victim named (as `cluster_hold`: the what-if would only name the same budgets, and with a
    tight queue budget it was most of a replay's time)."""
    if not budget.queue or not queues:
        return None
    frees = []
    for q in sorted(queues):
        got = spent(session, budget, q)
        if got is None or got[0] != QUEUE_BUDGET:
            return None
        frees.append(got[1])
    return Hold(action, QUEUE_BUDGET, "", min(frees), float(budget.queue), ", ".join(sorted(queues)))
