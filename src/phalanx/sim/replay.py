"""Time replay of a job trace through `run_cycle`: arrivals, completions, cycles, node failures.

A cycle runs after every batch of simultaneous events (and every `cycle_interval` seconds
while work is pending, if set). A gang starts running once `min_available` of its tasks are
bound; its run time comes from the runtime model (spread, cache, sharing) at that moment.
A node failure or an eviction (preempt, reclaim, consolidate) stops a job: it keeps the work
up to its last checkpoint (every `checkpoint_interval` seconds of run; 0 keeps nothing), loses
the rest, and queues again. An elastic job (`min_tasks`) runs at bound / total tasks of full
speed; when it grows or shrinks its work so far is kept (the resize checkpoints in place).
Per-queue GPU use is tracked against fair share (`QueueShares`).
Attained service and executed time advance before every cycle, for LAS and SRTF orders.
The replay ends when no event is left: jobs still waiting then are starved,
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
from phalanx.core.decisions import CHECKPOINT, CycleResult
from phalanx.core.errors import SpecError
from phalanx.core.forecast import forecast
from phalanx.core.fragmentation import FragmentationIndex, TypeTable
from phalanx.core.model import Node
from phalanx.core.profile import Profile
from phalanx.core.queues import QueueTree
from phalanx.core.snapshot import Snapshot, TaskType
from phalanx.sim.datacache import DataCache
from phalanx.sim.engine import Engine, Event, Kind
from phalanx.sim.jobs import JobSpec
from phalanx.sim.runtime import CacheSpec, JobShape, RuntimeModel
from phalanx.sim.tenancy import QueueShares, flat_tree


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
    evictions: int = 0
    lost_gpu_s: float = 0.0  # GPU-seconds of work thrown away by stops
    level: str = ""
    tasks: int = 0  # tasks running (an elastic job may run fewer than it has)
    held: float = 0.0  # GPUs held while running
    io_wait_s: float = 0.0  # seconds its runs waited on input (the data cache model)
    io_wait_gpu_s: float = 0.0

    @property
    def rate(self) -> float:
        """Share of full speed: an elastic job at its minimum runs slower."""
        return self.tasks / self.spec.task_count if self.tasks else 1.0

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
    shares: QueueShares | None = None
    evicted_tasks: int = 0
    lost_preempt_gpu_s: float = 0.0
    lost_failure_gpu_s: float = 0.0
    large_gpus: int = 8
    eta: dict[str, float | None] = field(default_factory=dict)  # job -> forecast start when it arrived
    data: DataCache | None = None
    eviction_times: list[float] = field(default_factory=list)  # when each evicted run stopped
    evicted_gpus: float = 0.0  # GPUs held by the runs evicted, summed (what restarts would cost)

    def evictions_per_hour(self) -> tuple[float, float]:
        """Evictions per hour over the middle half of completions (steady state), and in the worst hour."""
        ends = sorted(j.end for j in self.jobs if j.end is not None)
        if len(ends) < 4 or not self.eviction_times:
            return 0.0, 0.0
        lo, hi = ends[len(ends) // 4], ends[3 * len(ends) // 4]
        t = np.array(self.eviction_times)
        steady = float(((t >= lo) & (t < hi)).sum()) / max((hi - lo) / 3600, 1e-9)
        worst = float(np.bincount(((t - t.min()) // 3600).astype(np.int64)).max())
        return steady, worst

    def eta_errors(self) -> np.ndarray:
        """Forecast minus actual start (s) of the jobs forecast that started, and were forecast a time."""
        started = {j.spec.name: j.start for j in self.jobs if j.start is not None}
        errors = [t - started[n] for n, t in self.eta.items() if t is not None and n in started]
        return np.array(errors, dtype=np.float64)

    def max_large_wait(self) -> float:
        """Longest wait of a gang of at least `large_gpus` GPUs (until the end for one never started)."""
        end = self.samples[-1].time if self.samples else 0.0
        waits = [
            (j.wait if j.wait is not None else end - j.spec.submit)
            for j in self.jobs
            if j.spec.gpu_amount >= self.large_gpus
        ]
        return max(waits, default=math.nan)

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
            "evictions": sum(j.evictions for j in self.jobs),
            "evicted_tasks": self.evicted_tasks,
            "lost_gpu_h_preempt": self.lost_preempt_gpu_s / 3600,
            "lost_gpu_h_failure": self.lost_failure_gpu_s / 3600,
            "evicted_gpus": self.evicted_gpus,
            "evictions_per_h_steady": self.evictions_per_hour()[0],
            "evictions_worst_hour": self.evictions_per_hour()[1],
            "max_wait_large_s": self.max_large_wait(),
            "jain_index": self.shares.mean_index() if self.shares is not None else math.nan,
            **self._eta_summary(),
            **self._io_summary(),
            "cycles": self.cycles,
        }

    def _io_summary(self) -> dict[str, float | int | str]:
        d = self.data
        if d is None:
            return {}
        readers = [j for j in self.jobs if j.spec.dataset and j.start is not None]
        lost = sum(j.io_wait_gpu_s for j in self.jobs)
        return {
            "data_cache": d.mode,
            "io_wait_gpu_h": lost / 3600,
            "io_wait_avg_s": sum(j.io_wait_s for j in readers) / len(readers) if readers else math.nan,
            "io_wait_gpu_s_per_job": lost / len(readers) if readers else math.nan,
            "io_warm_start_pct": 100.0 * d.warm_starts / d.starts if d.starts else math.nan,
            "io_staged_tb": d.staged_bytes / 1e12,
            "io_planned_right_pct": 100.0 * d.planned_right / d.planned_starts
            if d.planned_starts
            else math.nan,
        }

    def _eta_summary(self) -> dict[str, float | int]:
        if not self.eta:
            return {}
        err = self.eta_errors()
        return {
            "eta_forecasts": len(self.eta),
            "eta_no_time": sum(1 for v in self.eta.values() if v is None),
            "eta_mae_s": float(np.abs(err).mean()) if len(err) else math.nan,
            "eta_median_abs_s": float(np.median(np.abs(err))) if len(err) else math.nan,
            "eta_bias_s": float(err.mean()) if len(err) else math.nan,
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
    queues: QueueTree | None = None,
    checkpoint_interval: float = 300.0,
    estimates: bool = True,
    half_life: float = 0.0,
    large_gpus: int = 8,
    eta_every: int = 0,
    data_cache: DataCache | None = None,
) -> ReplayResult:
    """Replay `jobs`; `estimates`: workloads carry their trace duration as the run-time estimate.

    `eta_every`: forecast the start of every n-th job that has to wait when it arrives
    (`phalanx.core.forecast`), to measure the forecast against when it really started.
    """
    if queues is not None:
        for j in jobs:
            if not queues.is_leaf(j.queue):
                where = j.where or f"job {j.name}"
                raise SpecError(where, f"queue {j.queue!r} is not a leaf queue of the cluster's queue tree")
    types = _task_types(jobs)
    snap = Snapshot(
        nodes, topology_levels=topology_levels, datasets=datasets, task_types=types, queues=queues
    )
    model = runtime or RuntimeModel()
    if data_cache is not None:  # the dynamic model replaces the static cache factor
        model = RuntimeModel(model.spec.model_copy(update={"cache": CacheSpec(enabled=False)}))
        data_cache.attach(snap)
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
    out = ReplayResult(profile.name, int(c.shared_count.sum()), list(recs.values()), large_gpus=large_gpus)
    shares = QueueShares(queues or flat_tree(j.queue for j in jobs), float(c.shared_count.sum()))
    out.shares = shares
    out.data = data_cache
    running: set[str] = set()
    finished = 0
    tick_at: list[float] = []
    rank_ticks: set[float] = set()
    checkpoint_tick = [-math.inf]  # the cycle outstanding for evictions that wait for checkpoints
    eta_seen = [0]  # jobs that had to wait when they arrived
    # attained service and executed time are read only by dynamic orders (LAS, SRTF) and the decay
    # of queue history: without them, skip the walk over every running workload each cycle
    timed = half_life > 0 or not all(getattr(o, "static", False) for o in profile.order)
    logged: dict[str, str] = {}

    def stop(name: str, now: float, evicted: bool) -> None:
        """A running job loses its tasks: it keeps its work up to the last checkpoint and queues again."""
        r = recs[name]
        entry = snap.workloads[name]
        if r.run_start is not None and r.run_time:
            ran = now - r.run_start
            every = entry.workload.checkpoint_interval
            if evicted and profile.preemption_cost == "none":
                kept = ran  # the paper-exact profiles: preemption is free
            else:
                kept = math.floor(ran / every) * every if every > 0 else 0.0
            r.done = min(1.0, r.done + kept * r.rate / r.run_time)
            lost = (ran - kept) * r.held
            r.lost_gpu_s += lost
            if evicted:
                out.lost_preempt_gpu_s += lost
                out.eviction_times.append(now)
                out.evicted_gpus += r.held
            else:
                out.lost_failure_gpu_s += lost
        r.run_start = None
        if data_cache is not None:
            data_cache.stop(r.spec, sorted({a.node for a in entry.bound.values()}))
        r.token += 1
        r.restarts += 1
        r.evictions += int(evicted)
        running.discard(name)
        shares.stop(r.spec.queue, r.held, done=False)
        r.held = 0.0
        for other in list(entry.bound.values()):
            snap.release(other.task.name)

    def run_time_of(name: str) -> float:
        """Run time at full size for the current placement (spread, cache, sharing)."""
        job = recs[name].spec
        shape = JobShape(job.gpus, job.duration, job.iterations, job.model, job.dataset)
        return model.run_time(snap, shape, list(snap.workloads[name].bound.values()))

    def resize(r: JobRecord, tasks: int, now: float) -> None:
        """Run at tasks / task_count of full speed from now on, holding that many tasks' GPUs."""
        held = tasks * r.spec.gpus_per_task
        shares.start(r.spec.queue, held - r.held)
        r.held = held
        r.tasks = tasks
        r.token += 1
        left = (r.run_time or 0.0) * (1.0 - r.done) / r.rate
        eng.schedule(now + left, Kind.COMPLETION, r.spec.name, r.token)

    def handle(batch: list[Event]) -> None:
        nonlocal finished
        now = eng.now
        changed = not out.samples  # a completion or a node event changed the devices
        for ev in batch:
            if ev.kind is Kind.ARRIVAL:
                spec = recs[ev.payload].spec
                snap.add_workload(spec.workload(checkpoint_interval, spec.duration if estimates else None))
                shares.arrive(spec.queue, spec.gpu_amount)
                if data_cache is not None:
                    data_cache.arrive(spec)
            elif ev.kind is Kind.COMPLETION:
                r = recs[ev.payload]
                if ev.token == r.token and ev.payload in running:
                    r.end = now
                    running.discard(ev.payload)
                    shares.stop(r.spec.queue, r.held, done=True)
                    shares.withdraw(r.spec.queue, r.spec.gpu_amount - r.held)
                    if data_cache is not None:
                        data_cache.stop(
                            r.spec, sorted({a.node for a in snap.workloads[ev.payload].bound.values()})
                        )
                    snap.remove_workload(ev.payload)
                    finished += 1
                    changed = True
            elif ev.kind is Kind.NODE_FAIL:
                changed = True
                i = snap.node_index(ev.payload)
                for a in list(snap.on_node[i].values()):
                    name = a.task.workload
                    if name in running:
                        stop(name, now, evicted=False)
                    for other in list(snap.workloads[name].bound.values()):
                        snap.release(other.task.name)
                snap.set_node_ready(ev.payload, False)
            elif ev.kind is Kind.NODE_RECOVER:
                changed = True
                snap.set_node_ready(ev.payload, True)
        if timed:
            snap.advance(now, half_life)
        if data_cache is not None:
            data_cache.advance(snap, now)
        result = run_cycle(snap, profile, now, rng, apply=True)
        out.cycles += 1
        out.evicted_tasks += len(result.evictions)
        for name in {e.workload for e in result.evictions}:
            # a gang below its minimum stops; an elastic one shrunk to its minimum runs on
            if name in running and not snap.workloads[name].is_ready:
                stop(name, now, evicted=True)
        # victims guarded by a checkpoint window: one cycle when the earliest waiting preemptor's
        # victims line up (one such cycle outstanding at a time, so waits do not multiply cycles)
        due = min(
            (
                h.until
                for p in result.pending
                for h in p.holds
                if h.guard == CHECKPOINT and h.until is not None and h.until > now
            ),
            default=math.inf,
        )
        if due < math.inf and not (now < checkpoint_tick[0] <= due):
            checkpoint_tick[0] = due
            eng.schedule(due, Kind.TICK)
        if check:
            c.check_invariants()
        if log is not None:
            _log(log, now, result, logged)
        for name in {b.workload for b in result.binds}:
            entry = snap.workloads[name]
            r = recs[name]
            if entry.is_ready and name not in running:
                r.run_time = run_time_of(name)
                if data_cache is not None:
                    w = data_cache.start(snap, r.spec, sorted({a.node for a in entry.bound.values()}), now)
                    r.run_time += w
                    r.io_wait_s += w
                    r.io_wait_gpu_s += w * r.spec.gpu_amount
                r.level = model.span_level(snap, {a.node for a in entry.bound.values()})
                r.run_start = now
                if r.start is None:
                    r.start = now
                running.add(name)
                resize(r, len(entry.bound), now)
        for name in {b.workload for b in result.binds} | {e.workload for e in result.evictions}:
            r = recs[name]
            if name in running and r.run_start != now and len(snap.workloads[name].bound) != r.tasks:
                # an elastic job grew or shrank: its work so far is kept (the resize checkpoints in place)
                if r.run_start is not None and r.run_time:
                    r.done = min(1.0, r.done + (now - r.run_start) * r.rate / r.run_time)
                r.run_start = now
                r.run_time = run_time_of(name)
                resize(r, len(snap.workloads[name].bound), now)
        frag_rate = out.samples[-1].frag_rate if out.samples else 0.0
        if metric is not None and (changed or result.binds or result.evictions):
            frag, idle = metric.summary()  # only when the devices changed hands
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
        shares.sample(now)
        if data_cache is not None:
            # running jobs end when the replay will end them (their run time with its slowdowns)
            data_cache.plan(
                snap,
                profile,
                now,
                lambda e: recs[e.name].run_time if e.name in running else e.workload.estimated_runtime,
            )
        if eta_every > 0:
            waiting = []
            for ev in batch:
                if ev.kind is Kind.ARRIVAL and ev.payload not in running:
                    eta_seen[0] += 1
                    if eta_seen[0] % eta_every == 0:
                        waiting.append(ev.payload)
            if waiting:
                f = forecast(snap, profile, now, targets=set(waiting), max_steps=400)
                for n in waiting:
                    out.eta[n] = f.starts.get(n)
        changes = [o for o in profile.order if hasattr(o, "next_change")]
        if changes and snap.pending_workloads():
            # an order that changes with time run (LAS levels): a cycle when a running workload's
            # rank changes, as the policy defines it, not only at the next arrival or completion
            soon = min(
                (
                    t
                    for o in changes
                    for e in snap.running.values()
                    if (t := o.next_change(e, now)) is not None
                ),
                default=math.inf,
            )
            if soon < math.inf and soon > now and soon not in rank_ticks:
                rank_ticks.add(soon)
                eng.schedule(soon, Kind.TICK)
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
