"""Time replay of a job trace through `run_cycle`: arrivals, completions, cycles, node failures.

A cycle runs after every batch of simultaneous events, at the core's wake-up (a guard's end,
a rank change: `phalanx.core.wake`), and every `cycle_interval` seconds while work is pending,
if set. A gang starts running once `min_available` of its tasks are
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

import heapq
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

import numpy as np

from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import Bind, CycleResult, Evict, Pending, Reason, Repartition
from phalanx.core.errors import SpecError
from phalanx.core.forecast import forecast
from phalanx.core.fragmentation import FragmentationIndex, TypeTable
from phalanx.core.model import Node
from phalanx.core.profile import Profile
from phalanx.core.queues import QueueTree
from phalanx.core.snapshot import Snapshot, TaskType, WorkloadEntry
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
    # what each of those evictions lost, in GPU-seconds: its work since the last checkpoint and its
    # restart (what the GPU-hour eviction budgets count; `worst_hour_lost_gpu_h` checks them)
    eviction_costs: list[float] = field(default_factory=list)
    evicted_gpus: float = 0.0  # GPUs held by the runs evicted, summed (what restarts would cost)
    # GPU-seconds spent starting evicted runs again (rendezvous, image, data loader, NCCL init):
    # counted, not yet played out in time (the run resumes at once)
    restart_gpu_s: float = 0.0

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

    def worst_hour_lost_gpu_h(self) -> float:
        """The most GPU-hours evictions lost (work and restarts) in any sliding hour: what a
        `cluster_gpu_hours` budget bounds, counted by the replay, not by the scheduler."""
        events = sorted(zip(self.eviction_times, self.eviction_costs, strict=True))
        worst = total = 0.0
        first = 0
        for t, cost in events:
            total += cost
            while events[first][0] <= t - 3600.0:
                total -= events[first][1]
                first += 1
            worst = max(worst, total)
        return worst / 3600

    def eta_errors(self) -> np.ndarray:
        """Forecast minus actual start (s) of the jobs forecast that started, and were forecast a time."""
        started = {j.spec.name: j.start for j in self.jobs if j.start is not None}
        errors = [t - started[n] for n, t in self.eta.items() if t is not None and n in started]
        return np.array(errors, dtype=np.float64)

    def end(self) -> float:
        """When the replay's work ended: the last completion, or the last arrival when later. Not
        the last cycle: a profile whose guards tick on while a job that never fits waits would
        otherwise be measured over a longer, idle span than one that stops at the last completion."""
        ends = [j.end for j in self.jobs if j.end is not None]
        return max([*ends, *(j.spec.submit for j in self.jobs)], default=0.0)

    def max_large_wait(self) -> float:
        """Longest wait of a gang of at least `large_gpus` GPUs (until the end for one never started)."""
        end = self.end()
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
            "lost_gpu_h_restart": self.restart_gpu_s / 3600,
            "evicted_gpus": self.evicted_gpus,
            "evictions_per_h_steady": self.evictions_per_hour()[0],
            "evictions_worst_hour": self.evictions_per_hour()[1],
            "lost_gpu_h_worst_hour": self.worst_hour_lost_gpu_h(),
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
            "io_egress_tb": d.egress_bytes() / 1e12,
            "io_egress_later_epochs_tb": d.later_epoch_bytes / 1e12,
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
        """Time-weighted GPU allocation from the first sample to the end (`end`)."""
        end = self.end()
        s = [x for x in self.samples if x.time <= end]
        if len(s) < 2:
            return 0.0
        t = np.array([x.time for x in s] + ([end] if s[-1].time < end else []))
        a = np.array([x.gpu_alloc for x in s] + ([s[-1].gpu_alloc] if s[-1].time < end else []))
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
    restart_cost: float = 60.0,
) -> ReplayResult:
    """Replay `jobs`; `estimates`: workloads carry their trace duration as the run-time estimate.

    `restart_cost`: seconds of its GPUs an evicted run costs to start again (a job's `restart_s`
    says otherwise), counted in `lost_gpu_h_restart`.

    `eta_every`: forecast the start of every n-th job that has to wait when it arrives
    (`phalanx.core.forecast`), to measure the forecast against when it really started.
    """
    settings = ReplaySettings(
        seed=seed,
        cycle_interval=cycle_interval,
        log=log,
        progress=progress,
        check=check,
        checkpoint_interval=checkpoint_interval,
        estimates=estimates,
        half_life=half_life,
        large_gpus=large_gpus,
        eta_every=eta_every,
        restart_cost=restart_cost,
    )
    inputs = ReplayInputs(
        nodes=nodes,
        jobs=jobs,
        topology_levels=topology_levels,
        datasets=datasets,
        runtime=runtime,
        outages=outages,
        queues=queues,
        data_cache=data_cache,
    )
    return ReplayRun(inputs, profile, settings).run()


@dataclass(frozen=True, slots=True)
class ReplayInputs:
    """What is replayed: the cluster, the trace and what happens to them (`replay`'s arguments)."""

    nodes: Sequence[Node]
    jobs: Sequence[JobSpec]
    topology_levels: Sequence[str] = ()
    datasets: dict[str, int] | None = None
    runtime: RuntimeModel | None = None
    outages: Sequence[NodeOutage] = ()
    queues: QueueTree | None = None
    data_cache: DataCache | None = None


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """How it is replayed and what is reported on the way (`replay`'s knobs, same defaults)."""

    seed: int = 0
    cycle_interval: float = 0.0
    log: IO[str] | None = None
    progress: Callable[[int, int], None] | None = None
    check: bool = False
    checkpoint_interval: float = 300.0
    estimates: bool = True
    half_life: float = 0.0
    large_gpus: int = 8
    eta_every: int = 0
    restart_cost: float = 60.0


class ReplayRun:
    """One replay's state under names, and one method per thing a batch of events sets off.

    `handle` is the recipe the engine calls for each batch of simultaneous events: apply the
    events, run a cycle, act on what it decided, sample, and ask for the next cycles.
    """

    def __init__(self, inputs: ReplayInputs, profile: Profile, settings: ReplaySettings) -> None:
        jobs, queues = inputs.jobs, inputs.queues
        _check_leaf_queues(jobs, queues)
        self.data = inputs.data_cache
        types = _task_types(jobs, self.data)
        self.snap = Snapshot(
            inputs.nodes if self.data is None else self.data.cluster(inputs.nodes),
            topology_levels=inputs.topology_levels,
            datasets=inputs.datasets,
            task_types=types,
            queues=queues,
        )
        self.model = inputs.runtime or RuntimeModel()
        if self.data is not None:  # the dynamic model replaces the static cache factor
            self.model = RuntimeModel(self.model.spec.model_copy(update={"cache": CacheSpec(enabled=False)}))
            self.data.attach(self.snap)
        self.profile = profile
        self.settings = settings
        self.rng = np.random.default_rng(settings.seed)
        self.eng = Engine()
        self.recs = {j.name: JobRecord(j) for j in jobs}
        if len(self.recs) != len(jobs):
            raise ValueError("duplicate job names in the trace")
        self.total_jobs = len(jobs)
        self._schedule_inputs(jobs, inputs.outages)
        self.cluster = c = self.snap.cluster
        self.metric = FragmentationIndex(c, TypeTable.build(types, c)) if types else None
        self.total_milli = max(1, c.total_shared_milli)
        gpus = int(c.shared_count.sum())
        self.out = ReplayResult(profile.name, gpus, list(self.recs.values()), large_gpus=settings.large_gpus)
        self.shares = QueueShares(queues or flat_tree(j.queue for j in jobs), float(c.shared_count.sum()))
        self.out.shares = self.shares
        self.out.data = self.data
        self.running: set[str] = set()
        self.finished = 0  # jobs completed, for `progress`
        self.interval_tick = -math.inf  # the latest --cycle-interval cycle asked for
        self.wake_ticks: list[float] = []  # the cycles outstanding for the core's wake-ups
        self.eta_seen = 0  # jobs that had to wait when they arrived
        # attained service and executed time are read only by dynamic orders (LAS, SRTF) and the decay
        # of queue history: without them, skip the walk over every running workload each cycle
        self.timed = settings.half_life > 0 or not all(o.static for o in profile.order)
        self.logged: dict[str, tuple[str, tuple[Reason, ...]]] = {}

    def _schedule_inputs(self, jobs: Sequence[JobSpec], outages: Sequence[NodeOutage]) -> None:
        """Every arrival, failure and recovery goes on the engine up front (an unknown node fails here)."""
        for j in sorted(jobs, key=lambda j: (j.submit, j.name)):
            self.eng.schedule(j.submit, Kind.ARRIVAL, j.name)
        for o in outages:
            self.snap.node_index(o.node)
            self.eng.schedule(o.start, Kind.NODE_FAIL, o.node)
            self.eng.schedule(o.end, Kind.NODE_RECOVER, o.node)

    def run(self) -> ReplayResult:
        """Until no event is left; then say which jobs deadlocked (partly placed) or starved."""
        self.eng.run(self.handle)
        for name, entry in self.snap.workloads.items():
            if 0 < len(entry.bound) < entry.workload.gang_size:
                self.out.deadlocked.append(name)
            elif self.recs[name].start is None:
                self.out.starved.append(name)
        return self.out

    def handle(self, batch: list[Event]) -> None:
        """One batch of simultaneous events, then one cycle and what follows from its decisions."""
        now = self.eng.now
        first = not self.out.samples
        changed = self._apply_events(batch, now) or first  # the devices changed (or nothing sampled yet)
        if self.timed:
            self.snap.advance(now, self.settings.half_life)
        if self.data is not None:
            self.data.advance(self.snap, now)
        result = run_cycle(self.snap, self.profile, now, self.rng, apply=True)
        self.out.cycles += 1
        self.out.evicted_tasks += len(result.evictions)
        self._stop_evicted(result, now)
        if self.settings.check:
            self.cluster.check_invariants()
        if self.settings.log is not None:
            _log(self.settings.log, now, result, self.logged)
        self._start_ready(result, now)
        self._resize_elastic(result, now)
        self._sample(now, changed or bool(result.binds) or bool(result.evictions))
        if self.data is not None:
            self.data.plan(self.snap, self.profile, now, self._runtime_for_plan)
        if self.settings.eta_every > 0:
            self._forecast_arrivals(batch, now)
        self._tick_for_wake(result, now)
        self._tick_for_interval(now)
        if self.settings.progress is not None:
            self.settings.progress(self.finished, self.total_jobs)

    # ------------------------------------------------------------------ events

    def _apply_events(self, batch: list[Event], now: float) -> bool:
        """Arrivals, completions, node failures and recoveries; True when one changed the devices."""
        changed = False
        for ev in batch:
            if ev.kind is Kind.ARRIVAL:
                self._arrive(ev.payload)
            elif ev.kind is Kind.COMPLETION:
                changed = self._complete(ev, now) or changed
            elif ev.kind is Kind.NODE_FAIL:
                changed = True
                self._fail_node(ev.payload, now)
            elif ev.kind is Kind.NODE_RECOVER:
                changed = True
                self.snap.set_node_ready(ev.payload, True)
        return changed

    def _arrive(self, name: str) -> None:
        spec = self.recs[name].spec
        st = self.settings
        w = spec.workload(st.checkpoint_interval, spec.duration if st.estimates else None)
        self.snap.add_workload(w if self.data is None else self.data.workload(w))
        self.shares.arrive(spec.queue, spec.gpu_amount)
        if self.data is not None:
            self.data.arrive(spec)

    def _complete(self, ev: Event, now: float) -> bool:
        """A job's completion, unless a stop or a resize since made this event stale (its token)."""
        name = ev.payload
        r = self.recs[name]
        if ev.token != r.token or name not in self.running:
            return False
        r.end = now
        self.running.discard(name)
        self.shares.stop(r.spec.queue, r.held, done=True)
        self.shares.withdraw(r.spec.queue, r.spec.gpu_amount - r.held)
        if self.data is not None:
            self.data.stop(r.spec, _bound_nodes(self.snap.workloads[name]))
        self.snap.remove_workload(name)
        self.finished += 1
        return True

    def _fail_node(self, node: str, now: float) -> None:
        """Every workload with a task on the node stops and gives back all its tasks."""
        snap = self.snap
        i = snap.node_index(node)
        for a in list(snap.on_node[i].values()):
            name = a.task.workload
            if name in self.running:
                self._stop(name, now, evicted=False)
            for other in list(snap.workloads[name].bound.values()):
                snap.release(other.task.name)
        snap.set_node_ready(node, False)

    # ------------------------------------------------------------------ what a cycle decided

    def _stop_evicted(self, result: CycleResult, now: float) -> None:
        for name in {e.workload for e in result.evictions}:
            # a gang below its minimum stops; an elastic one shrunk to its minimum runs on
            if name in self.running and not self.snap.workloads[name].is_ready:
                self._stop(name, now, evicted=True)

    def _start_ready(self, result: CycleResult, now: float) -> None:
        """A gang bound up to its minimum starts running: its run time is set by where it landed."""
        snap = self.snap
        for name in {b.workload for b in result.binds}:
            entry = snap.workloads[name]
            r = self.recs[name]
            if entry.is_ready and name not in self.running:
                r.run_time = self._run_time_of(name)
                if self.data is not None:
                    w = self.data.start(snap, r.spec, _bound_nodes(entry), now)
                    r.run_time += w
                    r.io_wait_s += w
                    r.io_wait_gpu_s += w * r.spec.gpu_amount
                r.level = self.model.span_level(snap, {a.node for a in entry.bound.values()})
                r.run_start = now
                if r.start is None:
                    r.start = now
                self.running.add(name)
                self._resize(r, len(entry.bound), now)

    def _resize_elastic(self, result: CycleResult, now: float) -> None:
        """An elastic job grew or shrank: its work so far is kept (the resize checkpoints in place)."""
        for name in {b.workload for b in result.binds} | {e.workload for e in result.evictions}:
            r = self.recs[name]
            if (
                name in self.running
                and r.run_start != now
                and len(self.snap.workloads[name].bound) != r.tasks
            ):
                if r.run_start is not None and r.run_time:
                    r.done = min(1.0, r.done + (now - r.run_start) * r.rate / r.run_time)
                r.run_start = now
                r.run_time = self._run_time_of(name)
                self._resize(r, len(self.snap.workloads[name].bound), now)

    def _stop(self, name: str, now: float, evicted: bool) -> None:
        """A running job loses its tasks: it keeps its work up to the last checkpoint and queues again."""
        r = self.recs[name]
        entry = self.snap.workloads[name]
        out = self.out
        if r.run_start is not None and r.run_time:
            ran = now - r.run_start
            every = entry.workload.checkpoint_interval
            if evicted and self.profile.preemption_cost == "none":
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
                cost = r.spec.restart_s if r.spec.restart_s is not None else self.settings.restart_cost
                out.restart_gpu_s += cost * r.held
                out.eviction_costs.append(lost + cost * r.held)
            else:
                out.lost_failure_gpu_s += lost
        r.run_start = None
        if self.data is not None:
            self.data.stop(r.spec, _bound_nodes(entry))
        r.token += 1
        r.restarts += 1
        r.evictions += int(evicted)
        self.running.discard(name)
        self.shares.stop(r.spec.queue, r.held, done=False)
        r.held = 0.0
        for other in list(entry.bound.values()):
            self.snap.release(other.task.name)

    def _run_time_of(self, name: str) -> float:
        """Run time at full size for the current placement (spread, cache, sharing)."""
        job = self.recs[name].spec
        shape = JobShape(job.gpus, job.duration, job.iterations, job.model, job.dataset)
        return self.model.run_time(self.snap, shape, list(self.snap.workloads[name].bound.values()))

    def _resize(self, r: JobRecord, tasks: int, now: float) -> None:
        """Run at tasks / task_count of full speed from now on, holding that many tasks' GPUs."""
        held = tasks * r.spec.gpus_per_task
        self.shares.start(r.spec.queue, held - r.held)
        r.held = held
        r.tasks = tasks
        r.token += 1
        left = (r.run_time or 0.0) * (1.0 - r.done) / r.rate
        self.eng.schedule(now + left, Kind.COMPLETION, r.spec.name, r.token)

    # ------------------------------------------------------------------ what is measured

    def _sample(self, now: float, devices_changed: bool) -> None:
        """GPU allocation, fragmentation (recomputed only when devices changed hands), queue shares."""
        out = self.out
        frag_rate = out.samples[-1].frag_rate if out.samples else 0.0
        if self.metric is not None and devices_changed:
            frag, idle = self.metric.summary()
            frag_rate = 100.0 * frag / idle if idle else 0.0
        alloc = 1.0 - float(self.cluster.gpu_free_total.sum()) / self.total_milli
        out.samples.append(
            Sample(now, alloc, frag_rate, len(self.snap.pending_workloads()), len(self.running))
        )
        self.shares.sample(now)

    def _runtime_for_plan(self, e: WorkloadEntry) -> float | None:
        """Running jobs end when the replay will end them (their run time with its slowdowns)."""
        return self.recs[e.name].run_time if e.name in self.running else e.workload.estimated_runtime

    def _forecast_arrivals(self, batch: list[Event], now: float) -> None:
        """Every `eta_every`-th arrival that must wait: its forecast start, to check against the real one."""
        waiting = []
        for ev in batch:
            if ev.kind is Kind.ARRIVAL and ev.payload not in self.running:
                self.eta_seen += 1
                if self.eta_seen % self.settings.eta_every == 0:
                    waiting.append(ev.payload)
        if waiting:
            f = forecast(self.snap, self.profile, now, targets=set(waiting), max_steps=400)
            for n in waiting:
                self.out.eta[n] = f.starts.get(n)

    # ------------------------------------------------------------------ the next cycles

    def _tick_for_wake(self, result: CycleResult, now: float) -> None:
        """The core's wake-up (a guard's end, a rank change, an action's own clock): a cycle then,
        unless one is already due by then (so waits do not multiply cycles)."""
        ticks = self.wake_ticks
        while ticks and ticks[0] <= now:
            heapq.heappop(ticks)
        wake = result.wake
        if wake is not None and not (ticks and ticks[0] <= wake.at):
            heapq.heappush(ticks, wake.at)
            self.eng.schedule(wake.at, Kind.TICK)

    def _tick_for_interval(self, now: float) -> None:
        """--cycle-interval: while work waits, a cycle every interval (one outstanding at a time)."""
        interval = self.settings.cycle_interval
        if interval > 0 and self.snap.pending_workloads() and self.interval_tick <= now:
            self.interval_tick = now + interval
            self.eng.schedule(now + interval, Kind.TICK)


def _check_leaf_queues(jobs: Sequence[JobSpec], queues: QueueTree | None) -> None:
    """Jobs wait only in leaf queues: a job naming an inner queue is the trace's error, said up front."""
    if queues is None:
        return
    for j in jobs:
        if not queues.is_leaf(j.queue):
            where = j.where or f"job {j.name}"
            raise SpecError(where, f"queue {j.queue!r} is not a leaf queue of the cluster's queue tree")


def _bound_nodes(entry: WorkloadEntry) -> list[int]:
    """The nodes a workload's bound tasks are on, each once, in order (the data cache's view)."""
    return sorted({a.node for a in entry.bound.values()})


def _task_types(jobs: Sequence[JobSpec], data: DataCache | None = None) -> list[TaskType]:
    """The trace's task-type distribution (for FGD scoring and the fragmentation metric), of the
    workloads as the replay makes them (`data` marks those reading the distributed cache)."""
    counts: dict[tuple[object, ...], tuple[object, int]] = {}
    for j in jobs:
        w = j.workload() if data is None else data.workload(j.workload())
        for ps in w.podsets:
            key = ps.request.shape_key
            req, n = counts.get(key, (ps.request, 0))
            counts[key] = (req, n + ps.count)
    return [TaskType(req, float(n)) for req, n in counts.values()]  # type: ignore[arg-type]


def _log(
    log: IO[str], now: float, result: CycleResult, logged: dict[str, tuple[str, tuple[Reason, ...]]]
) -> None:
    """Binds and evictions, and a pending reason only when it changes (its summary or reasons).

    A pending reason is compared as it stands, not as JSON: most of a backlog's reasons stay the
    same from one cycle to the next, and encoding each of them every cycle to find that out cost
    a twentieth of a long replay.
    """
    t = round(now, 6)
    said: list[Evict | Bind | Pending | Repartition] = [*result.evictions, *result.binds]
    for p in result.pending:
        key = (p.summary, p.reasons)
        if logged.get(p.workload) != key:
            logged[p.workload] = key
            said.append(p)
    said += result.repartitions
    for d in said:
        log.write(json.dumps({"t": t, **d.to_dict()}, separators=(",", ":")) + "\n")
