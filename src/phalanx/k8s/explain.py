"""Explanations written back: Events on pods, a condition on our PodGroups, status on our Queues.

Each is written only when its text changes, so a pod waiting for hours gets one Event, not
one per cycle.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from phalanx.core.decisions import CycleResult, Pending
from phalanx.core.queues import CPU, GPU, MEM, fair_shares
from phalanx.k8s import keys
from phalanx.k8s.api import Api
from phalanx.k8s.world import World

log = logging.getLogger("phalanx.k8s")
OUR_PODGROUPS = f"{keys.GROUP}/{keys.VERSION}/podgroups"
OUR_QUEUES = f"{keys.GROUP}/{keys.VERSION}/queues"


def describe(p: Pending) -> str:
    parts = [p.summary]
    for r in p.reasons:
        where = f" on {r.nodes} node(s)" if r.nodes else ""
        parts.append(f"{r.plugin}: {r.message}{where}")
    return "; ".join(x for x in parts if x)


class Explainer:
    def __init__(self, api: Api, max_events: int = 200) -> None:
        self.api = api
        self.max_events = max_events
        self.said: dict[str, str] = {}  # object key -> last message
        self.status: dict[str, Any] = {}

    def _event(
        self, key: str, obj: dict[str, Any], reason: str, message: str, warning: bool, budget: list[int]
    ) -> None:
        if self.said.get(key) == reason + message or budget[0] <= 0:
            return
        try:
            self.api.event(obj, reason, message, warning)
            self.said[key] = reason + message
            budget[0] -= 1
        except Exception as e:  # explanations must never stop scheduling
            log.info("could not write an event on %s: %s", key, e)

    def write(
        self,
        world: World,
        result: CycleResult | None,
        pod_objects: dict[str, dict[str, Any]],
        our_queues: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> None:
        budget = [self.max_events]
        for key, msg in world.pod_problems.items():
            if key in pod_objects:
                self._event(key, pod_objects[key], "InvalidRequest", msg, True, budget)
        for name, why in world.blocked.items():
            g = world.groups[name]
            text = "; ".join(why)
            for p in g.pods:
                if not p.node:
                    self._event(
                        p.key,
                        pod_objects.get(p.key, {"metadata": p.meta}),
                        "Unschedulable",
                        text,
                        True,
                        budget,
                    )
            self._podgroup(g.pod_group, "False", "Invalid", text)
        if result is None:
            return
        for b in result.binds:
            gpus = f" GPUs {','.join(map(str, b.gpus))}" if b.gpus else ""
            obj = pod_objects.get(b.task)
            if obj is not None:
                self._event(b.task, obj, "Scheduled", f"Bound to {b.node}{gpus}", False, budget)
        for ev in result.evictions:
            obj = pod_objects.get(ev.task)
            if obj is not None:
                self._event(ev.task, obj, "Preempted", ev.reason, True, budget)
        for pend in result.pending:
            group = world.groups.get(pend.workload)
            if group is None:
                continue
            text = describe(pend)
            for pod in group.pods:
                if not pod.node and pod.key in pod_objects:
                    self._event(pod.key, pod_objects[pod.key], "FailedScheduling", text, True, budget)
            self._podgroup(group.pod_group, "False", "Unschedulable", text)
        for name in {b.workload for b in result.binds}:
            placed = world.groups.get(name)
            if placed is not None:
                self._podgroup(placed.pod_group, "True", "Scheduled", f"{len(placed.pods)} pod(s) placed")
        self._queues(world, our_queues)

    def _podgroup(self, pg: dict[str, Any] | None, status: str, reason: str, message: str) -> None:
        if pg is None or not str(pg.get("apiVersion", "")).startswith(keys.GROUP):
            return  # other schedulers' PodGroups belong to their controllers
        meta = pg.get("metadata") or {}
        key = f"pg/{meta.get('namespace')}/{meta.get('name')}"
        body = {
            "phase": "Running" if status == "True" else "Pending",
            "conditions": [
                {
                    "type": "Scheduled",
                    "status": status,
                    "reason": reason,
                    "message": message[:1024],
                    "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            ],
        }
        if self.status.get(key) == (status, reason, message):
            return
        try:
            self.api.patch_status(OUR_PODGROUPS, str(meta.get("name")), str(meta.get("namespace")), body)
            self.status[key] = (status, reason, message)
        except Exception as e:
            log.info("could not write the status of %s: %s", key, e)

    def _queues(self, world: World, ours: set[str]) -> None:
        s = world.snapshot
        if world.tree is None or not ours:
            return
        fair = _fair(world)
        for name in world.tree.queues:
            if name not in ours:
                continue
            use = s.usage_of(name)
            pend = np.maximum(s.queue_pending.get(name, np.zeros(3)), 0)
            share = fair.get(name, np.zeros(3))
            body = {
                "allocated": _res(use),
                "requested": _res(use + pend),
                "fairShare": _res(share),
            }
            key = f"q/{name}"
            if self.status.get(key) == body:
                continue
            try:
                self.api.patch_status(OUR_QUEUES, name, None, body)
                self.status[key] = body
            except Exception as e:
                log.info("could not write the status of queue %s: %s", name, e)


def _res(v: np.ndarray) -> dict[str, str]:
    return {"gpu": f"{v[GPU] / 1000:g}", "cpu": f"{v[CPU] / 1000:g}", "memory": f"{int(v[MEM])}Mi"}


def _fair(world: World) -> dict[str, np.ndarray]:
    s = world.snapshot
    assert world.tree is not None
    demand = {
        q: s.queue_usage.get(q, np.zeros(3)) + np.maximum(s.queue_pending.get(q, np.zeros(3)), 0)
        for q in world.tree.queues
        if world.tree.is_leaf(q)
    }
    return fair_shares(world.tree, s.capacity_vector(), demand)
