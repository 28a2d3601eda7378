"""The dashboard's data: what the scheduler knows after a cycle, as JSON for the browser.

`Board` holds the latest state (built after a cycle, only while someone looks: a browser asked
within the last minute) and answers the dashboard's questions: the whole cluster in compact
form (every node with the used share of each GPU, pools, queues, waiting workloads with their
reason and forecast, recent decisions), and the details of one node, queue or workload.
Read-only: nothing here writes to the cluster. Given `visible` (which namespaces the caller may
list pods in, `phalanx.k8s.view.authn`), both answer only with those namespaces' workloads and pods.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phalanx.core.decisions import CycleResult
from phalanx.core.model import MILLI
from phalanx.core.queues import GPU
from phalanx.k8s.act.explain import describe
from phalanx.k8s.read.lifecycle import gang_status
from phalanx.k8s.read.world import World
from phalanx.k8s.view.holders import Holders, gpu_holders

log = logging.getLogger("phalanx.k8s")
WANTED_FOR_S = 60.0
Visible = Callable[[str], bool]  # namespace -> may the caller see it


def _ns(name: str) -> str | None:
    """The namespace of `ns/name` (workloads, pods), None for a cluster-scoped name."""
    return name.split("/", 1)[0] if "/" in name else None


def _shown(name: str, visible: Visible) -> bool:
    ns = _ns(name)
    return ns is None or visible(ns)


def _filter_state(state: dict[str, Any], visible: Visible) -> dict[str, Any]:
    out = dict(state)
    out["pending"] = [r for r in state.get("pending", []) if _shown(r["workload"], visible)]
    out["recent"] = [r for r in state.get("recent", []) if _shown(r["what"], visible)]
    spaces = state.get(PROBLEM_NAMESPACES, [])
    out["problems"] = [
        p for p, ns in zip(state.get("problems", []), spaces, strict=False) if ns is None or visible(ns)
    ]
    if "summary" in state:
        out["summary"] = {**state["summary"], "waiting": len(out["pending"])}
    return out


def _filter_detail(kind: str, d: dict[str, Any], visible: Visible) -> dict[str, Any] | None:
    if kind == "workload":
        return d if _shown(d["name"], visible) else None
    if kind == "queue":
        return {**d, "workloads": [w for w in d.get("workloads", []) if _shown(w, visible)]}
    if kind == "node":
        hidden = {"other": "a pod you may not see"}
        gpus = [
            {
                **g,
                "holders": [
                    h if _shown(str(h.get("pod", h.get("workload", ""))), visible) else hidden
                    for h in g.get("holders", [])
                ],
            }
            for g in d.get("gpus", [])
        ]
        return {**d, "gpus": gpus, "pods": [p for p in d.get("pods", []) if _shown(p, visible)]}
    return d


PROBLEM_NAMESPACES = "_problem_namespaces"  # kept beside "problems", never sent


@dataclass
class Board:
    mode: str = "live"  # "live" (served by the scheduler) or "read-only" (`phalanx dashboard`)
    pool_label: str = "phalanx.io/node-pool"
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=200))
    lock: threading.Lock = field(default_factory=threading.Lock)
    asked: float = -math.inf  # when a browser last asked (never, yet)
    building: threading.Event = field(default_factory=threading.Event)
    # the driver's clock (the scheduler's injected one): when asked, and whether someone still looks
    clock: Callable[[], float] = time.time
    # the last cycle's view was not built (nobody looked, or a build was still running): a browser
    # that asks now wants a cycle even where nothing changed (`Scheduler.quiet`)
    behind: bool = True
    _state: dict[str, Any] = field(default_factory=dict)
    _details: dict[str, dict[str, Any]] = field(default_factory=dict)

    def wanted(self) -> bool:
        return self.clock() - self.asked < WANTED_FOR_S

    def wants_cycle(self) -> bool:
        """Someone looks at a view older than the last cycle."""
        return self.behind and self.wanted()

    def reading(self) -> bool:
        """Whether a build on the dashboard's thread still reads an earlier cycle's world: the
        scheduler then leaves that snapshot to it and builds a new one (`phalanx.k8s.read.carry`)."""
        return self.building.is_set()

    def remember(self, now: float, kind: str, what: str, where: str, why: str = "") -> None:
        with self.lock:
            self.recent.appendleft({"t": now, "kind": kind, "what": what, "where": where, "why": why})

    def state_json(self, visible: Visible | None = None) -> bytes:
        """The whole state; with `visible`, only the workloads of the namespaces it allows."""
        self.asked = self.clock()
        with self.lock:
            body = self._state or {"mode": self.mode, "generated": 0, "warming_up": True}
        if visible is not None:
            body = _filter_state(body, visible)
        body = {k: v for k, v in body.items() if k != PROBLEM_NAMESPACES}
        return json.dumps(body, separators=(",", ":")).encode()

    def detail_json(self, kind: str, name: str, visible: Visible | None = None) -> bytes | None:
        self.asked = self.clock()
        with self.lock:
            d = self._details.get(f"{kind}/{name}")
        if d is not None and visible is not None:
            d = _filter_detail(kind, d, visible)
        return None if d is None else json.dumps(d, separators=(",", ":")).encode()

    def update_later(
        self, world: World, result: CycleResult | None, insight: dict[str, str], now: float
    ) -> None:
        """Build the state on a thread of its own (0.4 s at 5,000 nodes): the cycle does not wait.

        The world is the cycle's and is not changed after it: while a build runs, the scheduler does
        not keep that snapshot for its next cycle (`phalanx.k8s.read.carry`) but builds a new one;
        newer cycles are skipped rather than queued.
        """
        if self.building.is_set():
            self.behind = True
            return
        self.building.set()
        self.behind = False

        def run() -> None:
            try:
                self.update(world, result, insight, now)
            except Exception:
                log.exception("dashboard state failed")
            finally:
                self.building.clear()

        threading.Thread(target=run, name="dashboard", daemon=True).start()

    def update(self, world: World, result: CycleResult | None, insight: dict[str, str], now: float) -> None:
        self.show(*build(world, result, insight, now, self.pool_label))

    def show(self, state: dict[str, Any], details: dict[str, dict[str, Any]]) -> None:
        """The state to answer with from now on (one cycle's, or every shard's: `shard_board`)."""
        state["mode"] = self.mode
        with self.lock:
            state["recent"] = list(self.recent)
            self._state = state
            self._details = details


def build(
    world: World, result: CycleResult | None, insight: dict[str, str], now: float, pool_label: str
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The dashboard's state of one cycle, and the details of each node, queue and workload by
    `kind/name`; built from the world and the cycle's result alone."""
    s = world.snapshot
    details: dict[str, dict[str, Any]] = {}
    nodes, pools = _nodes(world, gpu_holders(s), pool_label, details)
    queues = _queues(world, details)
    reasons = _reasons(world, result)
    pending = _pending(world, reasons, insight)
    _workloads(world, reasons, insight, details)
    total = sum(len(row["gpus"]) for row in nodes)
    # objects that cannot be read, and pods of ours left out for another reason (a shard's: a pool
    # that no shard owns)
    left_out = world.problems | {
        f"Pod {k}": why for k, why in world.pod_problems.items() if f"Pod {k}" not in world.problems
    }
    state = {
        "generated": now,
        "summary": {
            "nodes": len(nodes),
            "gpus": total,
            "gpus_used": round(sum(sum(row["gpus"]) for row in nodes), 2),
            "running": len(s.running),
            "waiting": len(pending),
        },
        "pools": [{"name": k, **v} for k, v in sorted(pools.items())],
        "nodes": nodes,
        "queues": queues,
        "pending": pending,
        "problems": [left_out[k] for k in sorted(left_out)],
        # `Pod team-a/x` -> team-a: who may see each problem (`_filter_state`)
        PROBLEM_NAMESPACES: [_ns(k.split(" ", 1)[-1]) for k in sorted(left_out)],
    }
    return state, details


def _nodes(
    world: World, holders: Holders, pool_label: str, details: dict[str, dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Each node with the used share of each GPU, and the pools they add up to; each node's
    details (its GPUs' holders, its pods) go into `details`."""
    s = world.snapshot
    c = s.cluster
    reserved = {(slot[0], slot[1]) for slot in world.reservations}  # a GPU, or one of its MIG instances
    nodes: list[dict[str, Any]] = []
    pools: dict[str, dict[str, float]] = {}
    for i, n in enumerate(s.nodes):
        used = []
        gpus = []
        for j, gpu in enumerate(n.gpus):
            if gpu.mig_enabled:  # sliced: in use when any slice is
                share = 1.0 if holders.get((i, j)) else 0.0
            else:
                share = round(1 - float(c.gpu_milli_free[i, j]) / MILLI, 3)
            used.append(share)
            hs = [h.as_json() for h in holders.get((i, j), [])]
            if share > 0 and not hs:
                hs = [{"other": "another scheduler's pod"}]
            gpus.append(
                {
                    "index": gpu.index,
                    "model": gpu.model,
                    "memory_mib": gpu.memory_mib,
                    "mig": gpu.mig_enabled,
                    "used": share,
                    "holders": hs,
                    "reservation": (n.name, gpu.index) in reserved,
                }
            )
        pool = n.labels.get(pool_label) or n.gpu_model or "cpu"
        p = pools.setdefault(pool, {"nodes": 0, "gpus": 0, "used": 0.0})
        p["nodes"] += 1
        p["gpus"] += len(used)
        p["used"] += sum(used)
        ready = bool(c.node_ready[i])
        nodes.append({"name": n.name, "pool": pool, "gpus": used, "ready": ready})
        details[f"node/{n.name}"] = {
            "name": n.name,
            "pool": pool,
            "labels": dict(n.labels),
            "topology": dict(n.topology),
            "gpus": gpus,
            "pods": sorted(a.task.name for a in s.on_node[i].values()),
        }
    return nodes, pools


def _queues(world: World, details: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each queue's deserved, fair, used and waiting GPUs; its workloads go into its details."""
    s = world.snapshot
    queues: list[dict[str, Any]] = []
    if world.tree is None:
        return queues
    fair = s.fair_shares(world.tree)
    for name, q in world.tree.queues.items():
        row = {
            "name": name,
            "parent": q.parent,
            "deserved": float(world.tree.deserved[name][GPU]) / 1000,
            "fair": float(fair.get(name, np.zeros(3))[GPU]) / 1000,
            "used": float(s.usage_of(name)[GPU]) / 1000,
            "waiting": float(max(0.0, s.queue_pending.get(name, np.zeros(3))[GPU])) / 1000,
        }
        queues.append(row)
        members = [e.name for e in s.workloads.values() if e.workload.queue == name]
        details[f"queue/{name}"] = {**row, "workloads": sorted(members)}
    return queues


def _reasons(world: World, result: CycleResult | None) -> dict[str, str]:
    """Why each waiting workload waits: the cycle's reasons, then what kept the others out of it."""
    reasons = {p.workload: describe(p) for p in (result.pending if result else [])}
    for name, problems in world.blocked.items():
        reasons.setdefault(name, "; ".join(problems))
    return reasons


def _pending(world: World, reasons: dict[str, str], insight: dict[str, str]) -> list[dict[str, Any]]:
    s = world.snapshot
    pending = []
    for name, text in sorted(reasons.items()):
        grp = world.groups.get(name)
        entry = s.workloads.get(name)
        row = {
            "workload": name,
            "queue": entry.workload.queue if entry else (grp.queue if grp else ""),
            "pods": len(grp.pods) if grp else 0,
            "why": text,
            "forecast": insight.get(name, ""),
        }
        pending.append(row)
    return pending


def _workloads(
    world: World, reasons: dict[str, str], insight: dict[str, str], details: dict[str, dict[str, Any]]
) -> None:
    """Each workload's details: its state, gang phase, reasons, forecast and pods."""
    s = world.snapshot
    for name, e in s.workloads.items():
        grp = world.groups.get(name)
        gang = gang_status(world, name)
        details[f"workload/{name}"] = {
            "name": name,
            "queue": e.workload.queue,
            "priority": e.workload.priority,
            "state": "running" if e.is_ready else ("waiting" if name in reasons else "placing"),
            # the phase and members its PodGroup status says (`phalanx.k8s.read.lifecycle`)
            "phase": gang.phase if gang else "",
            "members": gang.text if gang else "",
            "why": reasons.get(name, ""),
            "forecast": insight.get(name, ""),
            "pods": [
                {
                    "pod": t.name,
                    "node": s.nodes[e.bound[t.name].node].name if t.name in e.bound else "",
                    "gpus": list(e.bound[t.name].devices.gpus) if t.name in e.bound else [],
                }
                for t in e.tasks
            ],
            "pod_group": bool(grp and grp.pod_group),
        }
