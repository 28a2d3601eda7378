"""Victims and the evict-then-place transaction shared by preempt, reclaim and consolidate.

Evictions are simulated before they are committed: victims are evicted one by one inside a
statement, and after each the preemptor's gang is tried; only if it then fits is anything
committed. Otherwise the statement is discarded and nothing happens.

Two guards beyond the minimum runtime (`Guards`, both off by default): `checkpoint_window`
lets a workload that checkpoints be a victim only within that many seconds after a checkpoint
(its checkpoints are every `checkpoint_interval` seconds from the start of its run), so an
eviction throws away at most the window's work; `repeat_window` keeps a workload from being
evicted again for a preemptor of the same shape (demand key) within that many seconds.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from phalanx.actions import budget as budgets
from phalanx.actions.budget import NO_BUDGET, Budget
from phalanx.actions.gang import _place_gang, upper_bound
from phalanx.core.model import GpuKind, Task
from phalanx.core.session import Session
from phalanx.core.snapshot import Allocation, WorkloadEntry


@dataclass(frozen=True, slots=True)
class Guards:
    """Victim guards of an action (0: off); see the module docstring."""

    checkpoint_window: float = 0.0
    repeat_window: float = 0.0
    budget: Budget = NO_BUDGET  # evictions an hour, per queue and cluster (`phalanx.actions.budget`)
    # seconds of its GPUs a restart costs a victim that does not say (`Workload.restart_s`): counted
    # with its lost work in the victim order, so that of two victims that lose the same work, the
    # one with fewer GPUs to restart goes first (0: restarts are free, as before)
    restart_s: float = 0.0


NO_GUARDS = Guards()


@dataclass(frozen=True, slots=True)
class Victim:
    """Tasks to evict together: a whole workload, or the optional tasks of an elastic one."""

    entry: WorkloadEntry
    allocs: tuple[Allocation, ...]
    lost_work: float  # GPU-seconds since the last checkpoint
    shrink: bool  # only tasks beyond min_available (the workload keeps running)
    started: float = 0.0  # when the workload's run began
    restart: float = 0.0  # GPU-seconds its restart costs (`Guards.restart_s`)

    @property
    def cost(self) -> float:
        """What evicting it costs: the work lost and the restart, in GPU-seconds."""
        return self.lost_work + self.restart

    @property
    def name(self) -> str:
        return self.entry.name


def run_start(entry: WorkloadEntry) -> float:
    return min(a.since for a in entry.bound.values())


# a reported checkpoint later than the clock by more than this is not believed (a clock skew,
# local time written as UTC): it would make the job look just checkpointed for hours
REPORT_SKEW_S = 60.0


def reported_checkpoint(entry: WorkloadEntry, now: float) -> float | None:
    """The workload's reported last checkpoint, if it falls in this run (at or after its first
    bind) and not after `now` beyond `REPORT_SKEW_S`; clamped to `now`."""
    last = entry.workload.last_checkpoint
    if last is None or not entry.bound or last > now + REPORT_SKEW_S:
        return None
    if last < min(a.since for a in entry.bound.values()):
        return None  # from an earlier run: this one restarted since
    return min(last, now)


def checkpoint_origin(entry: WorkloadEntry, now: float) -> float:
    """Where the running workload's checkpoint clock starts: its last reported checkpoint
    (`reported_checkpoint`), else when its last task was bound (a gang runs once all are up)."""
    last = reported_checkpoint(entry, now)
    return last if last is not None else max(a.since for a in entry.bound.values())


def since_checkpoint(now: float, entry: WorkloadEntry) -> float | None:
    """Seconds since the running workload's last checkpoint (None: it does not checkpoint).

    Checkpoints come every `checkpoint_interval` from `checkpoint_origin`: a reported one sets
    the phase, and one due since is taken to have happened (the report may lag a cycle).
    """
    interval = entry.workload.checkpoint_interval
    if not interval > 0 or not entry.bound:
        return None
    ran = max(0.0, now - checkpoint_origin(entry, now))
    return ran - math.floor(ran / interval) * interval


def repeated_until(session: Session, entry: WorkloadEntry, shape: object, window: float) -> float | None:
    """Until when the repeat guard protects `entry` from preemptors of `shape` (None: it does not)."""
    if window <= 0:
        return None
    shapes = session.snapshot.evicted_for.get(entry.name)
    if not shapes:  # most never were evicted: no need to hash the shape (a deep tuple)
        return None
    at = shapes.get(shape)  # type: ignore[call-overload]
    return at + window if at is not None and session.clock < at + window else None


def _gpus(a: Allocation) -> float:
    return (
        len(a.devices.gpus) * a.devices.milli / 1000 if a.devices.mig is None else a.devices.mig_compute / 7
    )


def restart_cost(entry: WorkloadEntry, allocs: tuple[Allocation, ...], default_s: float) -> float:
    """GPU-seconds the evicted tasks' restart costs: the workload's own restart time, else the
    action's default, times their GPUs."""
    own = entry.workload.restart_s
    seconds = own if own is not None else default_s
    return seconds * sum(max(_gpus(a), 0.001) for a in allocs) if seconds > 0 else 0.0


def whole_cost(session: Session, entry: WorkloadEntry, guards: Guards) -> float:
    """GPU-seconds evicting the whole running workload costs: its lost work and its restart."""
    allocs = tuple(entry.bound.values())
    return lost_work(session, entry, allocs) + restart_cost(entry, allocs, guards.restart_s)


def lost_work(session: Session, entry: WorkloadEntry, allocs: tuple[Allocation, ...]) -> float:
    """GPUs x seconds since the last checkpoint (since the start when checkpoints are unknown).

    Checkpoints come every interval from each task's bind, or, when the workload reported one
    (`reported_checkpoint`), every interval from that; a task bound after the last of them
    loses what it did since its bind.
    """
    now = session.clock
    interval = entry.workload.checkpoint_interval
    reported = reported_checkpoint(entry, now)
    if reported is not None and interval > 0:
        reported += math.floor((now - reported) / interval) * interval
    total = 0.0
    for a in allocs:
        if reported is not None:
            last = max(a.since, reported)
        else:
            since = a.since
            last = since + math.floor((now - since) / interval) * interval if interval > 0 else since
        total += max(_gpus(a), 0.001) * max(0.0, now - last)
    return total


def victims(
    session: Session,
    eligible: Callable[[WorkloadEntry], bool],
    min_runtime: float,
    queues: Iterable[str] | None = None,
    guards: Guards = NO_GUARDS,
    shape: object = None,
    exempt: Callable[[WorkloadEntry], bool] | None = None,
) -> Iterator[Victim]:
    """Evictable units, elastic surplus first, then by least lost work, lower priority, newer, name.

    Lazy: callers stop as soon as enough is freed. With `queues`, only those queues are looked
    at (and only their victims are worked out). `guards` leave out victims not just after a
    checkpoint and victims evicted lately for a preemptor of `shape`, unless `exempt`.
    """
    running = session.snapshot.running
    names = set(queues) if queues is not None else set(_running_by_queue(session))
    lists = [queue_victims(session, q, min_runtime, guards.restart_s) for q in sorted(names)]
    pool: Iterable[Victim] = lists[0] if len(lists) == 1 else heapq.merge(*lists, key=victim_order)
    window, repeat, now = guards.checkpoint_window, guards.repeat_window, session.clock
    budget = guards.budget
    spent = budgets.spent
    return (
        v
        for v in pool
        if v.entry.workload.name in running
        and v.entry.workload.name not in session.streamed  # already handed out: its binds are final
        and eligible(v.entry)
        and (
            (
                (repeat <= 0 or repeated_until(session, v.entry, shape, repeat) is None)
                # a shrink keeps the work done (the resize checkpoints in place): no wait
                and (window <= 0 or v.shrink or (since_checkpoint(now, v.entry) or 0.0) <= window)
                and (not budget.on or spent(session, budget, v.entry.workload.queue, cost=v.cost) is None)
            )
            or (exempt is not None and exempt(v.entry))
        )
    )


def victim_order(v: Victim) -> tuple[object, ...]:
    return (not v.shrink, v.cost, v.entry.workload.priority, -v.started, v.name)


def peek(victims: Iterator[Victim]) -> Iterator[Victim] | None:
    """The same victims, or None if there are none."""
    first = next(victims, None)
    return None if first is None else itertools.chain((first,), victims)


def _running_by_queue(session: Session) -> dict[str, list[WorkloadEntry]]:
    """Running preemptible workloads by queue, as at the first call in the cycle."""
    cached = session.memo.get("running-by-queue")
    if cached is None:
        out: dict[str, list[WorkloadEntry]] = {}
        for entry in session.snapshot.running.values():
            if entry.workload.preemptible:
                out.setdefault(entry.workload.queue, []).append(entry)
        session.memo["running-by-queue"] = cached = out
    return cached  # type: ignore[return-value]


def lowest_priority(session: Session, queue: str, preemptible_only: bool = True) -> float:
    """The lowest priority among the queue's running (preemptible) workloads (inf if none), per cycle."""
    if not preemptible_only:
        memo = session.memo.get("lowest-priority-any")
        lowest: dict[str, float]
        if isinstance(memo, dict):
            lowest = memo
        else:
            lowest = {}
            for e in session.snapshot.running.values():
                q = e.workload.queue
                lowest[q] = min(lowest.get(q, math.inf), e.workload.priority)
            session.memo["lowest-priority-any"] = lowest
        return float(lowest.get(queue, math.inf))
    key = ("lowest-priority", queue)
    cached = session.memo.get(key)
    if cached is None:
        running = _running_by_queue(session).get(queue, ())
        session.memo[key] = cached = min((e.workload.priority for e in running), default=math.inf)
    return cached  # type: ignore[return-value]


def queue_victims(session: Session, queue: str, min_runtime: float, restart_s: float = 0.0) -> list[Victim]:
    """A queue's evictable units in victim order, worked out once per cycle.

    Kept for the cycle: the clock does not move within it, workloads placed during it are too
    new to evict, and `evict_for` skips allocations that have changed since.
    """
    key = ("victims", min_runtime, queue, restart_s)
    cached = session.memo.get(key)
    if cached is not None:
        return cached  # type: ignore[return-value]
    out: list[Victim] = []
    now = session.clock
    for entry in _running_by_queue(session).get(queue, ()):
        if not entry.bound:  # evicted earlier in this cycle (the listing is the cycle's first)
            continue
        started = run_start(entry)
        if now - started < min_runtime:
            continue
        w = entry.workload
        bound = sorted(entry.bound.values(), key=lambda a: (-a.since, a.task.name))
        extra = len(bound) - w.gang_size
        if extra > 0 and not (w.preempt_whole or w.subgroups):  # those go whole or not at all
            allocs = tuple(bound[:extra])
            cost = restart_cost(entry, allocs, restart_s)
            out.append(Victim(entry, allocs, lost_work(session, entry, allocs), True, started, cost))
        allocs = tuple(bound)
        cost = restart_cost(entry, allocs, restart_s)
        out.append(Victim(entry, allocs, lost_work(session, entry, allocs), False, started, cost))
    out.sort(key=victim_order)
    session.memo[key] = out
    return out


def by_node(session: Session, tasks: list[Task], candidates: Iterable[Victim]) -> Iterable[Victim]:
    """The candidates node by node, cheapest node first, for tasks of several whole GPUs each.

    Taking victims by least lost work across the cluster frees GPUs on many nodes before one
    node has room for a task of 8 GPUs (hundreds of simulated evictions per try). Here victims
    are read in victim order until a few nodes each have room for a task (their first victims
    on that node, plus what is free there); those nodes come first, cheapest first, then the
    rest in plain order. Smaller tasks keep the plain order.
    """
    need = max((t.request.gpu.devices for t in tasks if t.request.gpu.kind is GpuKind.WHOLE), default=0)
    if need <= 1:
        return candidates
    free = session.snapshot.cluster.gpu_whole_free
    want = 2 * len(tasks) + 2
    state: dict[int, tuple[int, float, list[Victim]]] = {}
    done: list[tuple[float, int, list[Victim]]] = []
    pool: list[Victim] = []
    it = iter(candidates)
    for v in it:
        pool.append(v)
        for n in {a.node for a in v.allocs}:
            have, cost, take = state.get(n) or (int(free[n]), 0.0, [])
            if have >= need:
                continue
            have += sum(len(a.devices.gpus) for a in v.allocs if a.node == n and a.devices.milli >= 1000)
            take = [*take, v]
            state[n] = (have, cost + v.cost, take)
            if have >= need:
                done.append((cost + v.cost, n, take))
        if len(done) >= want:
            break
    done.sort(key=lambda r: (r[0], r[1]))
    out: list[Victim] = []
    seen: set[int] = set()
    for v in [v for _, _, take in done for v in take] + pool:
        if id(v) not in seen:  # a victim on two nodes comes once
            seen.add(id(v))
            out.append(v)
    return itertools.chain(out, it)


def evict_for(
    session: Session,
    preemptor: WorkloadEntry,
    tasks: list[Task],
    candidates: Iterable[Victim],
    reason: str,
    allow: Callable[[Victim, list[Victim]], bool] | None = None,
    accept: Callable[[list[Victim]], bool] | None = None,
) -> list[Victim] | None:
    """Evict candidates in order until the gang is admitted and fits; commit and return the victims.

    The greedy pass may evict victims on nodes the gang then does not use; a second pass
    evicts only those on the gang's nodes, and is kept if the gang still fits. If it never
    fits, nothing changes. `accept` sees the victims that would be evicted in the end and may
    refuse them all (then nothing changes either).
    """
    taken, used = _attempt(
        session, preemptor, tasks, by_node(session, tasks, candidates), reason, allow, commit=False
    )
    if taken is None:
        return None
    needed = [v for v in taken if any(a.node in used for a in v.allocs)]
    if len(needed) < len(taken):
        fewer, _ = _attempt(session, preemptor, tasks, needed, reason, allow, commit=accept is None)
        if fewer is not None and accept is None:
            budgets.note(session, fewer)
            return fewer
        if fewer is not None:
            taken = fewer
    if accept is not None and not accept(taken):
        return None
    again, _ = _attempt(session, preemptor, tasks, taken, reason, allow, commit=True)
    if again is not None:
        budgets.note(session, again)
    return again


def _attempt(
    session: Session,
    preemptor: WorkloadEntry,
    tasks: list[Task],
    candidates: Iterable[Victim],
    reason: str,
    allow: Callable[[Victim, list[Victim]], bool] | None,
    commit: bool,
) -> tuple[list[Victim] | None, set[int]]:
    """Evict in order until the gang fits; (victims, the gang's nodes), committed only with `commit`.

    A placement try is costly, so after a failed one the next waits for twice as many more
    victims (1, 2, 4, ...), and one last try follows the last victim. The extra victims this
    may take are dropped again by `evict_for`'s second pass when they are not on the gang's nodes.
    """
    stmt = session.statement()
    taken: list[Victim] = []
    gone: set[str] = set()
    gap, next_at, tried_at = 1, 0, -1

    def fits() -> set[int] | None:
        # the filtered bound skips tries a filter is bound to refuse (e.g. room only on reserved
        # nodes); the plain bound below decides when to try, so the tries and their outcomes are
        # those as without it (a profile that draws random numbers draws fewer: other draws later)
        if upper_bound(session, tasks, filtered=True) < len(tasks):
            return None
        if session.admit(preemptor, tasks) is not None:
            return None
        if not _place_gang(session, preemptor, tasks, outer=stmt, explain=False).placed:
            return None
        return {preemptor.bound[t.name].node for t in tasks}

    def done(used: set[int]) -> tuple[list[Victim], set[int]]:
        if commit:
            stmt.commit()
        else:
            stmt.discard()
        return taken, used

    for v in candidates:
        current = session.snapshot.allocations
        allocs = [a for a in v.allocs if a.task.name not in gone and current.get(a.task.name) is a]
        if not allocs or (allow is not None and not allow(v, taken)):
            continue
        share = v.cost / len(allocs)  # what the GPU-hour budgets count, spread over its tasks
        for a in allocs:
            stmt.evict(a, reason, preemptor.name, share)
            gone.add(a.task.name)
        taken.append(v)
        if len(taken) < next_at or upper_bound(session, tasks) < len(tasks):
            continue
        tried_at = len(taken)
        used = fits()
        if used is not None:
            return done(used)
        next_at, gap = len(taken) + gap, gap * 2
    if taken and tried_at < len(taken):
        used = fits()
        if used is not None:
            return done(used)
    stmt.discard()
    return None, set()
