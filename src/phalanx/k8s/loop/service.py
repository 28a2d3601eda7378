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
import weakref
from typing import Any

import numpy as np

from phalanx.core.snapshot import RunClock, Snapshot, decay_history, gpu_seconds
from phalanx.k8s.client.api import Api, Conflict, NotFound
from phalanx.k8s.client.kinds import CONFIG_MAPS
from phalanx.k8s.loop.repeat_memory import RecentRecord, from_saved, recent_from_saved

log = logging.getLogger("phalanx.k8s")
Run = tuple[float, float | None, int]  # counted GPU-seconds, the run's start (None: counted whole), milli-GPU
CONFIGMAP = "phalanx-attained-service"  # in the lease namespace; the chart's Role names it
KEY = "service.json"


class AttainedService:
    def __init__(self, half_life_s: float = 0.0) -> None:
        self.served: dict[str, float] = {}  # GPU-seconds from runs that have ended
        # workloads running at the last cycle: what their total was made of then (counted, the run's
        # start or None, its milli-GPU), read at the clock of then (`_at`); noted again only for
        # workloads whose run or service changed since, so a cycle need not visit every running one
        self._runs: dict[str, Run] = {}
        self._at = 0.0
        self._seen: weakref.ref[Snapshot] | None = None  # the snapshot those were noted from
        self.half_life_s = half_life_s
        self.history: dict[str, np.ndarray] = {}  # queue -> decayed usage (cpu, memory, gpu)
        self.history_time: float | None = None
        # the repeat guard's memory as saved (phalanx.k8s.loop.repeat_memory): workload -> shape -> when
        self.evictions: dict[str, dict[str, float]] = {}
        self.recent: list[RecentRecord] = []  # the eviction budgets' hour: (when, workload, queue, GPU-s)

    def apply(self, snap: Snapshot, now: float | None = None) -> None:
        """Add earlier runs to every workload's attained service; remember who runs now; with a
        half-life, decay each queue's usage history towards its usage now and give it to `snap`.
        On the snapshot of the last call, only workloads whose run changed since
        (`Snapshot.runs_changed`) are looked at; on another one, every workload that ran."""
        workloads, running = snap.workloads, snap.running
        full = self._seen is None or self._seen() is not snap
        changed = snap.runs_changed
        for name in list(self._runs) if full else [n for n in changed if n in self._runs]:
            if name not in running and name in workloads:
                # its run ended (preempted, or a pod failed)
                self.served[name] = self._total(self._runs[name])
        for name in [n for n in self.served if n not in workloads]:
            del self.served[name]  # the workload is gone
        for name, served in self.served.items():
            entry = workloads.get(name)
            if entry is not None:
                entry.attained_base += served
                snap.serviced.add(name)  # reset with the next cycle's standing
                snap.ranks_moved.add(name)
        if full:
            self._runs = {}
        for name in running.keys() if full else changed | self.served.keys():
            entry = running.get(name)
            if entry is None:
                self._runs.pop(name, None)
            elif entry.run_since is not None and entry.run_clock is snap.run_clock:
                self._runs[name] = (entry.attained_base, entry.run_since, entry.gpu_milli)
            else:
                self._runs[name] = (entry.attained, None, 0)
        changed.clear()
        self._at, self._seen = snap.run_clock.now, weakref.ref(snap)
        if self.half_life_s > 0 and now is not None:
            if self.history_time is not None:
                dt = max(0.0, now - self.history_time)
                decay_history(self.history, snap.queue_usage, dt, self.half_life_s)
            self.history_time = now
            snap.queue_history = {q: v.copy() for q, v in self.history.items()}
            snap.history_time = now

    def tracked(self) -> int:
        """Workloads whose service is kept: runs that ended, and runs going on at the last cycle."""
        return len(self.served) + len(self._runs)

    def running_totals(self) -> dict[str, float]:
        """Each workload running at the last call, and its attained service then."""
        return {name: self._total(run) for name, run in self._runs.items()}

    def _total(self, run: Run) -> float:
        """A run's total as of the last call (what `WorkloadEntry.attained` read then)."""
        base, since, gpu_milli = run
        return base if since is None else base + gpu_seconds(gpu_milli, RunClock(self._at).ran(since))

    # ------------------------------------------------------------------ kept on the API
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "served": self.served,
            "running": self.running_totals(),
            "history": {q: [float(x) for x in v] for q, v in self.history.items()},
            "history_time": self.history_time,
            "evictions": self.evictions,
            "recent_evictions": [list(r) for r in self.recent],
        }

    def load(self, d: dict[str, Any]) -> None:
        """What an earlier leader saved; entries that do not read are skipped, not fatal."""
        self.served = _floats(d.get("served"))
        self._runs = {name: (total, None, 0) for name, total in _floats(d.get("running")).items()}
        self._seen = None
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
        self.recent = recent_from_saved(d.get("recent_evictions"))


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
