"""When will a waiting workload start? Play the cluster forward from the snapshot, then undo it all.

Running workloads end at their start plus their estimated run time (the workload's own
estimate, else the driver's per-queue history); at each end the profile's own cycle runs, as it
would then, and a waiting workload's forecast start is the first time it is placed whole. The
forecast is made in place on the driver's snapshot and undone exactly (every bind and release
goes through statements; finished workloads are hidden and shown again), because copying a
snapshot costs more than the forecast.

What it cannot know it says: a workload that still waits when nothing is left that could end
(only workloads without an estimate run) gets no time and the names of those it waits on; the
forecast stops at a time budget or a number of steps and says so.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from phalanx.core.profile import Profile
from phalanx.core.session import Session
from phalanx.core.snapshot import Snapshot, WorkloadEntry
from phalanx.core.statement import Op, Statement, undo

RuntimeOf = Callable[[WorkloadEntry], float | None]


@dataclass
class Forecast:
    starts: dict[str, float] = field(default_factory=dict)  # workload -> forecast start time
    nodes: dict[str, list[int]] = field(default_factory=dict)  # workload -> the nodes it starts on
    unknown: dict[str, str] = field(default_factory=dict)  # workload -> why there is no time
    steps: int = 0
    complete: bool = True  # False: cut short by the budget; later starts may be missing


def estimated_runtime(entry: WorkloadEntry) -> float | None:
    return entry.workload.estimated_runtime


def forecast(
    snap: Snapshot,
    profile: Profile,
    now: float,
    runtime_of: RuntimeOf = estimated_runtime,
    out_of_time: Callable[[], bool] | None = None,
    max_steps: int = 200,
    targets: set[str] | None = None,
) -> Forecast:
    """Forecast start times of the waiting workloads (of `targets`, if given); `snap` is unchanged after.

    `out_of_time`: the driver's budget (the core keeps no clock); checked before every step.
    """
    out = Forecast()
    waiting = {e.name for e in snap.pending_workloads() if not e.is_ready}
    want = waiting & targets if targets is not None else waiting
    if not want:
        return out
    log: list[list[Op] | WorkloadEntry] = []  # operations, or a finished workload hidden; undone in reverse
    saved = {e.name: dict(e.cache) for e in snap.workloads.values()}  # order plugins keep state there
    ends: list[tuple[float, str]] = []
    blockers: list[str] = []
    for e in snap.running.values():
        rt = runtime_of(e)
        if rt is None:
            blockers.append(e.name)
            continue
        started = min(a.since for a in e.bound.values())
        heapq.heappush(ends, (max(now, started + rt), e.name))
    rng = np.random.default_rng(0)
    try:
        t = now
        while want - out.starts.keys() and ends:
            if out.steps >= max_steps or (out_of_time is not None and out_of_time()):
                out.complete = False
                break
            t = ends[0][0]
            while ends and ends[0][0] <= t:
                _, name = heapq.heappop(ends)
                _finish(snap, snap.workloads[name], log)
            session = Session(snap, profile, t, rng)
            for action in profile.actions:
                action.execute(session)
            ops = list(session.committed)
            session.keep()
            log.append(ops)
            out.steps += 1
            for name in {op.alloc.task.workload for op in ops if op.kind == "bind"}:
                e = snap.workloads[name]
                if e.is_ready and name in waiting and name not in out.starts:
                    out.starts[name] = t
                    out.nodes[name] = sorted({a.node for a in e.bound.values()})
                    rt = runtime_of(e)
                    if rt is None:
                        blockers.append(name)
                    else:
                        heapq.heappush(ends, (t + rt, name))
    finally:
        for item in reversed(log):
            if isinstance(item, list):
                for op in reversed(item):
                    undo(snap, op)
            else:
                snap._set_pending(item, True)
        for e in snap.workloads.values():
            e.cache.clear()
            e.cache.update(saved.get(e.name, {}))
    for name in sorted(want - out.starts.keys()):
        if not out.complete:
            out.unknown[name] = "not within the forecast's budget"
        elif blockers:
            shown = ", ".join(sorted(blockers)[:3]) + (" ..." if len(blockers) > 3 else "")
            out.unknown[name] = f"waits on running workloads without a run-time estimate ({shown})"
        else:
            out.unknown[name] = "does not fit even when everything running has ended"
    return out


def _finish(snap: Snapshot, entry: WorkloadEntry, log: list[list[Op] | WorkloadEntry]) -> None:
    """The workload ends: its devices are free, and it does not wait to run again."""
    stmt = Statement(snap)
    for a in list(entry.bound.values()):
        stmt.evict(a, "forecast: ended")
    log.append(stmt.commit())
    snap._set_pending(entry, False)
    log.append(entry)


def eta_text(start: float | None, now: float, why: str = "") -> str:
    """`in about 12 min`, `now`, or why there is no time."""
    if start is None:
        return f"unknown: {why}" if why else "unknown"
    wait = max(0.0, start - now)
    if wait < 1:
        return "now"
    for unit, secs in (("d", 86400), ("h", 3600), ("min", 60)):
        if wait >= secs:
            return f"in about {math.ceil(wait / secs * 10) / 10:g} {unit}"
    return f"in about {math.ceil(wait)} s"
