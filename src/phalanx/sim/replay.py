"""Time replay of a job trace through `run_cycle`: arrivals, completions, cycles, node failures.

A cycle runs after every batch of simultaneous events (and every `cycle_interval` seconds
while work is pending, if set). A gang starts running once `min_available` of its tasks are
bound; its run time comes from the runtime model (spread, cache, sharing) at that moment.
A node failure stops the jobs on it; they keep the work done so far (checkpointed) and
queue again. The replay ends when no event is left: jobs still waiting then are starved,
and jobs partly placed but never started are deadlocked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

import numpy as np

from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import CycleResult
from phalanx.core.fragmentation import FragmentationIndex, TypeTable
from phalanx.core.model import Node
from phalanx.core.profile import Profile
from phalanx.core.snapshot import Snapshot, TaskType
from phalanx.sim.engine import Engine, Event, Kind
from phalanx.sim.jobs import JobSpec
from phalanx.sim.runtime import JobShape, RuntimeModel


@dataclass(frozen=True, slots=True)
class NodeOutage:
    node: str
    start: float
    end: float


@dataclass
class JobRecord:
    spec: JobSpec
    start: float | None = None
    end: float | None = None
    run_time: float | None = None
    done: float = 0.0  # fraction of the work completed before the current run
    run_start: float | None = None
    token: int = 0
    restarts: int = 0
    level: str = ""

    @property
    def jct(self) -> float | None:
        return None if self.end is None else self.end - self.spec.submit

    @property
    def wait(self) -> float | None:
        return None if self.start is None else self.start - self.spec.submit


@dataclass
class Sample:
    time: float
    gpu_alloc: float  # allocated share of all GPUs, 0..1
    frag_rate: float  # FGD fragmentation rate of idle GPU, %
    pending: int
    running: int


@dataclass
class ReplayResult:
    profile: str
    total_gpus: int
    jobs: list[JobRecord]
    samples: list[Sample] = field(default_factory=list)
    deadlocked: list[str] = field(default_factory=list)
    starved: list[str] = field(default_factory=list)
    cycles: int = 0

    def completed(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.end is not None]

    def summary(self) -> dict[str, float | int | str]:
        done = self.completed()
        jct = np.array([j.jct for j in done if j.jct is not None], dtype=np.float64)
        wait = np.array([j.wait for j in self.jobs if j.wait is not None], dtype=np.float64)
        t0 = min((j.spec.submit for j in self.jobs), default=0.0)
        makespan = max((j.end for j in done if j.end is not None), default=t0) - t0
        return {
            "profile": self.profile,
            "jobs": len(self.jobs),
            "completed": len(done),
            "avg_jct_s": float(jct.mean()) if len(jct) else math.nan,
            "median_jct_s": float(np.median(jct)) if len(jct) else math.nan,
            "p95_jct_s": float(np.percentile(jct, 95)) if len(jct) else math.nan,
            "avg_wait_s": float(wait.mean()) if len(wait) else math.nan,
            "median_wait_s": float(np.median(wait)) if len(wait) else math.nan,
            "p95_wait_s": float(np.percentile(wait, 95)) if len(wait) else math.nan,
            "makespan_s": makespan if len(done) == len(self.jobs) else math.nan,
            "gpu_alloc_pct": 100 * self.time_avg_alloc(),
            "deadlocked": len(self.deadlocked),
            "starved": len(self.starved),
            "restarts": sum(j.restarts for j in self.jobs),
            "cycles": self.cycles,
        }

    def time_avg_alloc(self) -> float:
        """Time-weighted GPU allocation from the first arrival to the last completion."""
        s = self.samples
        if len(s) < 2:
            return 0.0
        t = np.array([x.time for x in s])
        a = np.array([x.gpu_alloc for x in s])
        span = t[-1] - t[0]
        return float((a[:-1] * np.diff(t)).sum() / span) if span > 0 else float(a[-1])


def replay(
    nodes: Sequence[Node],
    jobs: Sequence[JobSpec],
    profile: Profile,
    *,
    topology_levels: Sequence[str] = (),
    datasets: dict[str, int] | None = None,
    runtime: RuntimeModel | None = None,
    seed: int = 0,
    cycle_interval: float = 0.0,
    outages: Sequence[NodeOutage] = (),
    log: IO[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    check: bool = False,
) -> ReplayResult:
    types = _task_types(jobs)
    snap = Snapshot(nodes, topology_levels=topology_levels, datasets=datasets, task_types=types)
    model = runtime or RuntimeModel()
    rng = np.random.default_rng(seed)
    eng = Engine()
    recs = {j.name: JobRecord(j) for j in jobs}
    if len(recs) != len(jobs):
        raise ValueError("duplicate job names in the trace")
    for j in sorted(jobs, key=lambda j: (j.submit, j.name)):
        eng.schedule(j.submit, Kind.ARRIVAL, j.name)
    for o in outages:
        snap.node_index(o.node)
        eng.schedule(o.start, Kind.NODE_FAIL, o.node)
        eng.schedule(o.end, Kind.NODE_RECOVER, o.node)
    c = snap.cluster
    metric = FragmentationIndex(c, TypeTable.build(types, c)) if types else None
    total = max(1, c.total_shared_milli)
    out = ReplayResult(profile.name, int(c.shared_count.sum()), list(recs.values()))
    running: set[str] = set()
    finished = 0
    tick_at: list[float] = []
    logged: dict[str, str] = {}

    def stop(name: str, now: float) -> None:
        """A running job loses its tasks (node failure, eviction): keep its progress, queue it again."""
        r = recs[name]
        if r.run_start is not None and r.run_time:
            r.done = min(1.0, r.done + (now - r.run_start) / r.run_time * (1.0 - r.done))
        r.run_start = None
        r.token += 1
        r.restarts += 1
        running.discard(name)

    def handle(batch: list[Event]) -> None:
        nonlocal finished
        now = eng.now
        for ev in batch:
            if ev.kind is Kind.ARRIVAL:
                snap.add_workload(recs[ev.payload].spec.workload())
            elif ev.kind is Kind.COMPLETION:
                r = recs[ev.payload]
                if ev.token == r.token and ev.payload in running:
                    r.end = now
                    running.discard(ev.payload)
                    snap.remove_workload(ev.payload)
                    finished += 1
            elif ev.kind is Kind.NODE_FAIL:
                i = snap.node_index(ev.payload)
                for a in list(snap.on_node[i].values()):
                    name = a.task.workload
                    if name in running:
                        stop(name, now)
                    for other in list(snap.workloads[name].bound.values()):
                        snap.release(other.task.name)
                snap.set_node_ready(ev.payload, False)
            elif ev.kind is Kind.NODE_RECOVER:
                snap.set_node_ready(ev.payload, True)
        result = run_cycle(snap, profile, now, rng)
        snap.apply(result, now)
        out.cycles += 1
        if check:
            c.check_invariants()
        for e in result.evictions:
            if e.workload in running:
                stop(e.workload, now)
        if log is not None:
            _log(log, now, result, logged)
        for name in {b.workload for b in result.binds}:
            entry = snap.workloads[name]
            r = recs[name]
            if entry.is_ready and name not in running:
                allocs = list(entry.bound.values())
                job = r.spec
                shape = JobShape(job.gpus, job.duration, job.iterations, job.model, job.dataset)
                r.run_time = model.run_time(snap, shape, allocs)
                r.level = model.span_level(snap, {a.node for a in allocs})
                r.run_start = now
                if r.start is None:
                    r.start = now
                running.add(name)
                eng.schedule(now + r.run_time * (1.0 - r.done), Kind.COMPLETION, name, r.token)
        frag_rate = 0.0
        if metric is not None:
            frag, idle = metric.summary()
            frag_rate = 100.0 * frag / idle if idle else 0.0
        out.samples.append(
            Sample(
                now,
                1.0 - float(c.gpu_free_total.sum()) / total,
                frag_rate,
                len(snap.pending_workloads()),
                len(running),
            )
        )
        if cycle_interval > 0 and snap.pending_workloads() and (not tick_at or tick_at[-1] <= now):
            tick_at.append(now + cycle_interval)
            eng.schedule(now + cycle_interval, Kind.TICK)
        if progress is not None:
            progress(finished, len(jobs))

    eng.run(handle)
    for name, entry in snap.workloads.items():
        if 0 < len(entry.bound) < entry.workload.gang_size:
            out.deadlocked.append(name)
        elif recs[name].start is None:
            out.starved.append(name)
    return out


def _task_types(jobs: Sequence[JobSpec]) -> list[TaskType]:
    """The trace's task-type distribution (for FGD scoring and the fragmentation metric)."""
    counts: dict[tuple[object, ...], tuple[object, int]] = {}
    for j in jobs:
        w = j.workload()
        for ps in w.podsets:
            key = ps.request.shape_key
            req, n = counts.get(key, (ps.request, 0))
            counts[key] = (req, n + ps.count)
    return [TaskType(req, float(n)) for req, n in counts.values()]  # type: ignore[arg-type]


def _log(log: IO[str], now: float, result: CycleResult, logged: dict[str, str]) -> None:
    """Binds and evictions, and a pending reason only when it changes."""
    for d in result.to_dicts():
        if d["kind"] == "pending":
            name = str(d["workload"])
            key = json.dumps(d["reasons"], sort_keys=True) + str(d["summary"])
            if logged.get(name) == key:
                continue
            logged[name] = key
        log.write(json.dumps({"t": round(now, 6), **d}, separators=(",", ":")) + "\n")
