"""What a cycle tells the operator: the dashboard's record, the /metrics figures, and the holds of
preemptors whose victims are still on their way out."""

from __future__ import annotations

from phalanx.core.decisions import DISRUPTION_BUDGET, TERMINATING, Bind, CycleResult, Hold
from phalanx.k8s.act.executor import Outcome
from phalanx.k8s.read.world import World
from phalanx.k8s.view.board import Board
from phalanx.k8s.view.server import Metrics


def board_cycle(
    b: Board,
    world: World,
    result: CycleResult,
    out: Outcome,
    binds: dict[str, Bind],
    insight: dict[str, str],
    now: float,
) -> None:
    """The dashboard's view of this cycle: its decisions always, the whole state while someone looks."""
    for task in out.bound:
        bind = binds.get(task)
        b.remember(
            now,
            "bound",
            task,
            bind.node if bind else "",
            f"GPUs {list(bind.gpus)}" if bind and bind.gpus else "",
        )
    for ev in result.evictions:
        if ev.task in out.evicted:
            b.remember(now, "evicted", ev.task, ev.node, ev.reason)
    for workload, why in out.broken.items():
        b.remember(now, "undone", workload, "", why)
    if b.wanted():
        b.update_later(world, result, insight, now)  # a view: built aside, never holds up a cycle


def cycle_metrics(
    m: Metrics, world: World, result: CycleResult, out: Outcome, seconds: float, pool_label: str
) -> None:
    """The cycle's figures on /metrics: time, waiting, binds, GPUs allocated per queue and pool."""
    m.cycle.observe(seconds)
    m.pending.set(len(result.pending) + len(world.blocked))
    m.binds.inc(len(out.bound))
    m.evictions.inc(len(out.evicted))
    m.broken.inc(len(out.broken))
    s = world.snapshot
    per_queue: dict[str, float] = {}
    for a in s.allocations.values():
        q = s.workloads[a.task.workload].workload.queue
        per_queue[q] = per_queue.get(q, 0.0) + len(a.devices.gpus) * a.devices.milli / 1000
    for q, v in per_queue.items():
        m.queue_gpus.labels(q).set(v)
    c = s.cluster
    pools: dict[str, list[int]] = {}
    for i, n in enumerate(s.nodes):
        pool = n.labels.get(pool_label) or n.gpu_model or "cpu"
        pools.setdefault(pool, []).append(i)
    for pool, idx in pools.items():
        total = float(c.gpu_count[idx].sum()) * 1000
        free = float(c.gpu_free_total[idx].sum())
        m.pool_gpus.labels(pool).set((total - free) / total if total else 0.0)


def held_preemptors(result: CycleResult, out: Outcome, binds: dict[str, Bind]) -> dict[str, tuple[Hold, ...]]:
    """Preemptors whose binds wait for their victims this cycle: each victim terminating, or its
    eviction refused (a PodDisruptionBudget), said as holds of the preemptor."""
    waiting = {binds[t].workload for t in out.deferred if t in binds}
    held: dict[str, list[Hold]] = {}
    for ev in result.evictions:
        if ev.by not in waiting:
            continue
        action = "reclaim" if ev.reason.startswith("reclaimed") else "preempt"
        if ev.task in out.refusals:
            hold = Hold(action, DISRUPTION_BUDGET, ev.task, None, detail=out.refusals[ev.task])
        elif ev.task in out.evicted:
            hold = Hold(action, TERMINATING, ev.task, None)
        else:
            continue
        held.setdefault(ev.by, []).append(hold)
    return {name: tuple(hs) for name, hs in held.items()}
