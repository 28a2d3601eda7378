"""When will a waiting workload start? Play the cluster forward from the snapshot, then undo it all.

Running workloads end at their start plus their estimated run time (the workload's own
estimate, else the driver's per-queue history); at each end the profile's own cycle runs, as it
would then, and a waiting workload's forecast start is the first time it is placed whole. The
forecast is made in place on the driver's snapshot and undone exactly (every bind and release
goes through statements; finished workloads are hidden and shown again), because copying a
snapshot costs more than the forecast.

Guards that hold back an eviction a waiting workload needs (a minimum runtime, a quantum: the
`holds` of its Pending decision) end at known times, and pods still terminating are gone by
their grace period at the latest: the forecast plays the cycle at those times too, and a start
that a guard's end allows says so (`when default/low-0 may be preempted`).

What it cannot know it says: a workload that still waits when nothing is left that could end
(only workloads without an estimate run) gets no time and the names of those it waits on; one
that does not start once everything has ended gets the reason of its last try (and, if pods of
other schedulers hold GPUs, that they do); the forecast stops at a time budget or a number of
steps and says so.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from phalanx.core.decisions import TERMINATING, Pending
from phalanx.core.profile import Profile
from phalanx.core.session import Session
from phalanx.core.snapshot import Leaving, Snapshot, WorkloadEntry
from phalanx.core.statement import Op, Statement, undo

RuntimeOf = Callable[[WorkloadEntry], float | None]


@dataclass
class Forecast:
    starts: dict[str, float] = field(default_factory=dict)  # workload -> forecast start time
    nodes: dict[str, list[int]] = field(default_factory=dict)  # workload -> the nodes it starts on
    unknown: dict[str, str] = field(default_factory=dict)  # workload -> why there is no time
    because: dict[str, str] = field(default_factory=dict)  # workload -> the guard whose end lets it start
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

    Besides the ends of running workloads, the cluster is played forward to the ends of the
    guards that hold back an eviction a waiting workload needs (`Pending.holds`: a minimum
    runtime, a quantum) and to the times pods still terminating are gone at the latest.
    `out_of_time`: the driver's budget (the core keeps no clock); checked before every step.
    """
    out = Forecast()
    pending = [e for e in snap.pending_workloads() if not e.is_ready]
    waiting = {e.name for e in pending}
    want = waiting & targets if targets is not None else waiting
    if not want:
        return out
    log: list[list[Op] | WorkloadEntry | Leaving] = []  # undone in reverse
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
    leaving = list(snap.leaving)
    going = sorted(((max(now, lv.ends), k) for k, lv in enumerate(leaving)), reverse=True)
    last: dict[str, Pending] = {e.name: e.last_pending for e in pending if e.last_pending is not None}
    wakes: list[float] = []
    woken: set[float] = set()

    def wake_for(p: Pending, after: float) -> None:
        for h in p.holds:
            if h.until is not None and h.until > after and h.until not in woken:
                woken.add(h.until)
                heapq.heappush(wakes, h.until)

    for p in last.values():
        wake_for(p, now)
    rng = np.random.default_rng(0)
    foreign_left = snap.foreign_gpu_milli
    try:
        t = now
        while want - out.starts.keys() and (ends or wakes or going):
            if out.steps >= max_steps or (out_of_time is not None and out_of_time()):
                out.complete = False
                break
            t = min(
                x
                for x in (
                    ends[0][0] if ends else None,
                    wakes[0] if wakes else None,
                    going[-1][0] if going else None,
                )
                if x is not None
            )
            gone: set[str] = set()
            while ends and ends[0][0] <= t:
                _, name = heapq.heappop(ends)
                _finish(snap, snap.workloads[name], log)
            while going and going[-1][0] <= t:
                lv = leaving[going.pop()[1]]
                snap.let_go(lv)
                log.append(lv)
                gone.add(lv.owner)
            while wakes and wakes[0] <= t:
                heapq.heappop(wakes)
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
                    why = _lifted(last.get(name), t, gone)
                    if why:
                        out.because[name] = why
                    rt = runtime_of(e)
                    if rt is None:
                        blockers.append(name)
                    else:
                        heapq.heappush(ends, (t + rt, name))
            for name, p in session.pending.items():
                last[name] = p
                wake_for(p, t)
        foreign_left = snap.foreign_gpu_milli
    finally:
        for item in reversed(log):
            if isinstance(item, list):
                for op in reversed(item):
                    undo(snap, op)
            elif isinstance(item, Leaving):
                snap.let_go(item, gone=False)
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
            out.unknown[name] = _never(last.get(name), foreign_left)
    return out


def _lifted(p: Pending | None, t: float, gone: set[str]) -> str:
    """The guards whose end at `t` let the workload start (`when default/low-0 may be preempted`), if any."""
    if p is None:
        return ""
    ended = [
        h
        for h in p.holds
        if (h.until is not None and abs(h.until - t) < 1e-6) or (h.guard == TERMINATING and h.victim in gone)
    ]
    if not ended:
        return ""
    names = sorted({h.victim for h in ended if h.guard == ended[0].guard})
    who = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return ended[0].lifted(who, many=len(names) > 1)


def _never(p: Pending | None, foreign_milli: int) -> str:
    """Why a workload starts at no time even once everything Phalanx runs has ended, from its last reason."""
    why = f": {p.message}" if p is not None else ""
    if foreign_milli > 0:
        return (
            f"does not start while pods Phalanx does not schedule hold {foreign_milli / 1000:g} GPU(s), "
            f"which it cannot see end{why}"
        )
    if p is not None and p.unschedulable:
        return f"does not fit even when everything running has ended{why}"
    return f"does not start even when everything running has ended{why}"


def _finish(snap: Snapshot, entry: WorkloadEntry, log: list[list[Op] | WorkloadEntry | Leaving]) -> None:
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
