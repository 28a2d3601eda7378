"""What the operator is told beyond "why": when a waiting workload should start, and what would start it now.

After each cycle the snapshot is played forward (`phalanx.core.forecast`) within a time budget,
and for the first waiting workloads the smallest change that would let them start now is
checked (`phalanx.actions.whatif`). A start that a guard's end allows says so (`expected to
start around 14:40 UTC, when default/low-0 may be preempted`). Run times: the workload's
estimate (`phalanx.io/estimated-runtime`, PodGroup `estimatedRuntimeSeconds`), else the median
run time of the last pods of its queue that finished (`RunTimes`). The forecast time is said
as a wall-clock time rounded to a step that grows with the wait, so an Event is rewritten only
when the forecast really moves.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from phalanx.actions.whatif import fits_now_if
from phalanx.core.forecast import forecast
from phalanx.core.profile import Profile
from phalanx.core.snapshot import Snapshot, WorkloadEntry
from phalanx.k8s import keys
from phalanx.k8s.read.pods import timestamp


@dataclass
class RunTimes:
    """Run times of finished pods, per queue (the last `keep`), for workloads without an estimate."""

    keep: int = 50
    by_queue: dict[str, deque[float]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)

    def observe(self, pods: list[dict[str, Any]], default_queue: str) -> None:
        for p in pods:
            status = p.get("status") or {}
            if status.get("phase") != "Succeeded":
                continue
            meta = p.get("metadata") or {}
            uid = str(meta.get("uid") or "")
            if not uid or uid in self.seen:
                continue
            started = timestamp(status.get("startTime"))
            ends = [
                timestamp(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
                for c in status.get("containerStatuses") or []
            ]
            if not started or not ends or not all(ends):
                continue
            self.seen.add(uid)
            labels = {**(meta.get("annotations") or {}), **(meta.get("labels") or {})}
            queue = next((str(labels[k]) for k in keys.QUEUE_KEYS if k in labels), default_queue)
            self.by_queue.setdefault(queue, deque(maxlen=self.keep)).append(max(ends) - started)

    def median(self, queue: str) -> float | None:
        runs = self.by_queue.get(queue)
        return statistics.median(runs) if runs else None


def wall(t: float) -> str:
    """A time on the wall clock, to the second: `14:32:10 UTC` (with the date when it is not today)."""
    fmt = "%H:%M:%S UTC" if time.gmtime(t)[:3] == time.gmtime()[:3] else "%Y-%m-%d %H:%M:%S UTC"
    return time.strftime(fmt, time.gmtime(t))


def clock(start: float, now: float) -> str:
    """`around 14:30 UTC` (rounded more coarsely the further away), or `now`."""
    wait = start - now
    if wait < 60:
        return "now"
    step = 60 if wait < 3600 else 600 if wait < 6 * 3600 else 3600
    rounded = round(start / step) * step
    fmt = "%H:%M UTC" if wait < 20 * 3600 else "%Y-%m-%d %H:%M UTC"
    return "around " + time.strftime(fmt, time.gmtime(rounded))


@dataclass
class Insight:
    texts: dict[str, str] = field(default_factory=dict)  # waiting workload -> what the operator is told
    starts: dict[str, float] = field(default_factory=dict)  # waiting workload -> forecast start
    nodes: dict[str, list[int]] = field(default_factory=dict)  # waiting workload -> nodes it starts on


def insights(
    snap: Snapshot,
    profile: Profile,
    now: float,
    waiting: list[str],
    runtimes: RunTimes,
    budget_s: float = 0.2,
    max_whatif: int = 10,
) -> Insight:
    """A sentence per waiting workload: its forecast start, and what would start it now."""
    if not waiting:
        return Insight()
    t0 = time.perf_counter()

    def runtime_of(e: WorkloadEntry) -> float | None:
        return e.workload.estimated_runtime or runtimes.median(e.workload.queue)

    stop_at = t0 + budget_s * 0.7
    f = forecast(snap, profile, now, runtime_of, lambda: time.perf_counter() > stop_at, targets=set(waiting))
    out: dict[str, str] = {}
    for k, name in enumerate(waiting):
        if name in f.starts:
            because = f", {f.because[name]}" if name in f.because else ""
            text = f"expected to start {clock(f.starts[name], now)}{because} (forecast)"
        else:
            text = f"no start forecast: {f.unknown.get(name, 'unknown')}"
        if k < max_whatif and time.perf_counter() - t0 < budget_s and name in snap.workloads:
            ifs = fits_now_if(snap, profile, now, name, when=wall)
            if ifs:
                text += "; " + "; ".join(ifs)
        out[name] = text
    return Insight(out, dict(f.starts), dict(f.nodes))
