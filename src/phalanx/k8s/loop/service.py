"""Attained service across runs: what LAS orders by, kept by the scheduler between cycles.

The world is read from the API every cycle, so it only knows the current run of a workload
(GPUs x time since its pods started). A workload that was preempted and waits again would then
count as fresh, rank first under LAS and preempt its preemptor in turn. The scheduler keeps
each workload's service from its earlier runs here and adds it; and each queue's time-decayed
usage (the fair-share history, `fairshare`'s `history_weight`).

It keeps the repeat guard's memory too (who was evicted for which preemptor shape, and when).
All three survive a restart or a new leader: the leader writes them to one ConfigMap beside its
Lease (`CONFIGMAP`, at most once per `AdapterConfig.service_save_s`) and reads them back when
it starts to lead. At worst the service of the last minute before a crash is lost.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from phalanx.core.snapshot import Snapshot, decay_history
from phalanx.k8s.client.api import Api, Conflict, NotFound
from phalanx.k8s.client.kinds import CONFIG_MAPS
from phalanx.k8s.loop.repeat_memory import from_saved

log = logging.getLogger("phalanx.k8s")
CONFIGMAP = "phalanx-attained-service"  # in the lease namespace; the chart's Role names it
KEY = "service.json"


class AttainedService:
    def __init__(self, half_life_s: float = 0.0) -> None:
        self.served: dict[str, float] = {}  # GPU-seconds from runs that have ended
        self._running: dict[str, float] = {}  # total as of the last cycle, for workloads running then
        self.half_life_s = half_life_s
        self.history: dict[str, np.ndarray] = {}  # queue -> decayed usage (cpu, memory, gpu)
        self.history_time: float | None = None
        # the repeat guard's memory as saved (phalanx.k8s.loop.repeat_memory): workload -> shape -> when
        self.evictions: dict[str, dict[str, float]] = {}

    def apply(self, snap: Snapshot, now: float | None = None) -> None:
        """Add earlier runs to every workload's attained service; remember who runs now; with a
        half-life, decay each queue's usage history towards its usage now and give it to `snap`."""
        for name, total in self._running.items():
            if name not in snap.running and name in snap.workloads:
                self.served[name] = total  # its run ended (preempted, or a pod failed)
        for name in [n for n in self.served if n not in snap.workloads]:
            del self.served[name]  # the workload is gone
        for name, served in self.served.items():
            entry = snap.workloads.get(name)
            if entry is not None:
                entry.attained += served
                snap.serviced.add(name)  # reset with the next cycle's standing
        self._running = {name: e.attained for name, e in snap.running.items()}
        if self.half_life_s > 0 and now is not None:
            if self.history_time is not None:
                dt = max(0.0, now - self.history_time)
                decay_history(self.history, snap.queue_usage, dt, self.half_life_s)
            self.history_time = now
            snap.queue_history = {q: v.copy() for q, v in self.history.items()}
            snap.history_time = now

    def tracked(self) -> int:
        """Workloads whose service is kept: runs that ended, and runs going on at the last cycle."""
        return len(self.served) + len(self._running)

    # ------------------------------------------------------------------ kept on the API
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "served": self.served,
            "running": self._running,
            "history": {q: [float(x) for x in v] for q, v in self.history.items()},
            "history_time": self.history_time,
            "evictions": self.evictions,
        }

    def load(self, d: dict[str, Any]) -> None:
        """What an earlier leader saved; entries that do not read are skipped, not fatal."""
        self.served = _floats(d.get("served"))
        self._running = _floats(d.get("running"))
        self.history = {}
        for q, v in (d.get("history") or {}).items() if isinstance(d.get("history"), dict) else []:
            try:
                a = np.asarray(v, dtype=float)
            except (TypeError, ValueError):
                continue
            if a.shape == (3,) and np.isfinite(a).all():
                self.history[str(q)] = a
        t = d.get("history_time")
        self.history_time = float(t) if isinstance(t, int | float) else None
        self.evictions = from_saved(d.get("evictions"))


def _floats(d: Any) -> dict[str, float]:
    if not isinstance(d, dict):
        return {}
    return {str(k): float(v) for k, v in d.items() if isinstance(v, int | float) and v == v and v >= 0}


class ServiceStore:
    """The ConfigMap `CONFIGMAP` in `namespace`: one JSON document."""

    def __init__(self, api: Api, namespace: str, name: str = CONFIGMAP) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self._known: dict[str, Any] | None = None  # the object as last read or written

    def read(self) -> dict[str, Any] | None:
        obj = self.api.get(CONFIG_MAPS, self.name, self.namespace)
        self._known = obj
        if obj is None:
            return None
        try:
            d = json.loads((obj.get("data") or {}).get(KEY, "{}"))
        except ValueError:
            log.warning(
                "ConfigMap %s/%s: %s does not read as JSON; starting afresh", self.namespace, self.name, KEY
            )
            return None
        return d if isinstance(d, dict) else None

    def write(self, d: dict[str, Any]) -> None:
        data = {KEY: json.dumps(d, separators=(",", ":"), sort_keys=True)}
        if self._known is None:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": {"app.kubernetes.io/managed-by": "phalanx"},
                },
                "data": data,
            }
            try:
                self._known = self.api.create(CONFIG_MAPS, body, self.namespace)
                return
            except Exception:
                self._known = self.api.get(CONFIG_MAPS, self.name, self.namespace)  # made meanwhile?
                if self._known is None:
                    raise
        obj = {**self._known, "data": data}
        try:
            self._known = self.api.replace(CONFIG_MAPS, obj)  # the leader is the only writer
        except NotFound:  # deleted meanwhile: make it again
            self._known = None
            self.write(d)
        except Conflict:  # written meanwhile (a hand edit, a former leader): ours is newer
            self._known = self.api.get(CONFIG_MAPS, self.name, self.namespace)
            if self._known is None:
                raise
            self._known = self.api.replace(CONFIG_MAPS, {**self._known, "data": data})
