"""What a cycle tells the operator: the dashboard's record, the /metrics figures, and the holds of
preemptors whose victims are still on their way out."""

from __future__ import annotations

import numpy as np

from phalanx.core.decisions import DISRUPTION_BUDGET, TERMINATING, Bind, CycleResult, Hold
from phalanx.core.model import Node
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
    else:
        b.behind = True


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
    for q, milli in s.queue_gpu_milli.items():  # kept by the snapshot as binds and evictions go
        m.queue_gpus.labels(q).set(milli / 1000)
    c = s.cluster
    names, of_node = _pools(s.nodes, pool_label)
    total = np.bincount(of_node, weights=c.gpu_count, minlength=len(names)) * 1000
    free = np.bincount(of_node, weights=c.gpu_free_total, minlength=len(names))
    for k, pool in enumerate(names):
        m.pool_gpus.labels(pool).set(float((total[k] - free[k]) / total[k]) if total[k] else 0.0)


_POOLS: dict[str, tuple[list[Node], list[str], np.ndarray]] = {}  # pool label -> the last nodes' pools


def _pools(nodes: list[Node], pool_label: str) -> tuple[list[str], np.ndarray]:
    """Each node's pool (its pool label, else its GPU model, else "cpu"), worked out again only when
    the snapshot's nodes are another list (a kept snapshot keeps its list)."""
    hit = _POOLS.get(pool_label)
    if hit is not None and hit[0] is nodes:
        return hit[1], hit[2]
    names: dict[str, int] = {}
    of_node = [names.setdefault(n.labels.get(pool_label) or n.gpu_model or "cpu", len(names)) for n in nodes]
    out = (list(names), np.array(of_node, dtype=np.int64))
    _POOLS[pool_label] = (nodes, *out)
    return out


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
