"""Reference schedulers written from the textbook definitions, sharing no code with Phalanx.

A count-only cluster of `gpus` GPUs; jobs (name, gpus, submit, duration). At each event time
every arrival and completion at that time is taken in, then the policy decides. Ties in any
order go to the earlier submit, then the smaller name. Preemption, where a policy has it, is
free: a paused job keeps all its progress. Returns each job's completion time.

- strict FIFO: in submit order, start jobs from the head while they fit; the first that does not
  fit blocks every job behind it.
- fit-first FIFO: in submit order, start every job that fits (later ones may pass a blocked one).
- SJF: shortest job (duration) first, fit-first, never preempted.
- SRTF: at every event, re-plan from empty in order of remaining time, fit-first; a running job
  that does not make the cut is paused (Tiresias' `shortest`).
- 2D-LAS (Tiresias' `dlas-gpu`, without starvation promotion): one FIFO list per level of
  attained service (GPUs x seconds run; a job enters level k+1 when it reaches thresholds[k]).
  Arrivals join the end of level 0; a job that crosses a threshold moves to the end of the next
  level's list (a running job's crossing is an event). At every event, re-plan from empty going
  through the lists, level 0 first, fit-first; then the jobs left waiting move to the back of
  their list, keeping their order, so running jobs stay ahead of waiting ones in their level.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

EPS = 1e-9


@dataclass(frozen=True)
class Job:
    name: str
    gpus: int
    submit: float
    duration: float


def _nonpreemptive(
    jobs: list[Job], gpus: int, key: Callable[[Job], tuple[object, ...]], strict: bool
) -> dict[str, float]:
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.name))
    ends: list[tuple[float, str]] = []
    done: dict[str, float] = {}
    waiting: list[Job] = []
    free = gpus
    by = {j.name: j for j in jobs}
    k = 0
    while k < len(arrivals) or ends:
        t = min(arrivals[k].submit if k < len(arrivals) else math.inf, ends[0][0] if ends else math.inf)
        while ends and ends[0][0] == t:
            _, name = heapq.heappop(ends)
            free += by[name].gpus
        while k < len(arrivals) and arrivals[k].submit == t:
            waiting.append(arrivals[k])
            k += 1
        waiting.sort(key=key)
        rest = []
        blocked = False
        for j in waiting:
            if not blocked and j.gpus <= free:
                free -= j.gpus
                done[j.name] = t + j.duration
                heapq.heappush(ends, (done[j.name], j.name))
            else:
                blocked = blocked or strict
                rest.append(j)
        waiting = rest
    return done


def strict_fifo(jobs: list[Job], gpus: int) -> dict[str, float]:
    return _nonpreemptive(jobs, gpus, lambda j: (j.submit, j.name), strict=True)


def fit_first_fifo(jobs: list[Job], gpus: int) -> dict[str, float]:
    return _nonpreemptive(jobs, gpus, lambda j: (j.submit, j.name), strict=False)


def sjf(jobs: list[Job], gpus: int) -> dict[str, float]:
    return _nonpreemptive(jobs, gpus, lambda j: (j.duration, j.submit, j.name), strict=False)


def _replan(
    jobs: list[Job],
    gpus: int,
    rank: Callable[[Job, float, float], tuple[object, ...]],
    jump: Callable[[Job, float], float],
) -> dict[str, float]:
    """Re-plan from empty at every event; `rank(job, executed, attained)`; `jump(job, executed)`: seconds
    of running until the job's rank changes by itself (inf if never)."""
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.name))
    executed: dict[str, float] = {}
    running: set[str] = set()
    done: dict[str, float] = {}
    k = 0
    now = 0.0
    while k < len(arrivals) or executed:
        # the next event: an arrival, a completion, or a running job's rank changing
        nxt = arrivals[k].submit if k < len(arrivals) else math.inf
        by = {j.name: j for j in arrivals[:k]}
        for name in running:
            j = by[name]
            nxt = min(nxt, now + j.duration - executed[name], now + jump(j, executed[name]))
        for name in running:
            executed[name] += nxt - now
        now = nxt
        for name in [n for n in running if by[n].duration - executed[n] <= EPS]:
            done[name] = now
            running.discard(name)
            del executed[name]
        while k < len(arrivals) and arrivals[k].submit == now:
            executed[arrivals[k].name] = 0.0
            k += 1
        by = {j.name: j for j in arrivals[:k]}
        order = sorted(
            executed, key=lambda n: (*rank(by[n], executed[n], by[n].gpus * executed[n]), by[n].submit, n)
        )
        free = gpus
        running = set()
        for n in order:
            if by[n].gpus <= free:
                free -= by[n].gpus
                running.add(n)
    return done


def srtf(jobs: list[Job], gpus: int) -> dict[str, float]:
    return _replan(jobs, gpus, lambda j, ex, at: (j.duration - ex,), lambda j, ex: math.inf)


def las2d(jobs: list[Job], gpus: int, thresholds: tuple[float, ...] = (3250.0, 7200.0)) -> dict[str, float]:
    def level(attained: float) -> int:
        return sum(1 for t in thresholds if attained >= t - EPS)

    arrivals = sorted(jobs, key=lambda j: (j.submit, j.name))
    lists: list[list[str]] = [[] for _ in range(len(thresholds) + 1)]
    where: dict[str, int] = {}
    executed: dict[str, float] = {}
    running: set[str] = set()
    done: dict[str, float] = {}
    by = {j.name: j for j in jobs}
    k = 0
    now = 0.0
    while k < len(arrivals) or executed:
        nxt = arrivals[k].submit if k < len(arrivals) else math.inf
        for n in running:
            j = by[n]
            nxt = min(nxt, now + j.duration - executed[n])
            above = [t for t in thresholds if t > j.gpus * executed[n] + EPS]
            if above:
                nxt = min(nxt, now + (above[0] - j.gpus * executed[n]) / j.gpus)
        for n in running:
            executed[n] += nxt - now
        now = nxt
        for n in [n for n in running if by[n].duration - executed[n] <= EPS]:
            done[n] = now
            running.discard(n)
            del executed[n]
            lists[where.pop(n)].remove(n)
        while k < len(arrivals) and arrivals[k].submit == now:
            n = arrivals[k].name
            executed[n] = 0.0
            lists[0].append(n)
            where[n] = 0
            k += 1
        for n in [n for lst in lists for n in lst]:  # crossings, in list order
            lv = level(by[n].gpus * executed[n])
            if lv != where[n]:
                lists[where[n]].remove(n)
                lists[lv].append(n)
                where[n] = lv
        free = gpus
        running = set()
        for lst in lists:
            for n in lst:
                if by[n].gpus <= free:
                    free -= by[n].gpus
                    running.add(n)
        for i, lst in enumerate(lists):
            lists[i] = [n for n in lst if n in running] + [n for n in lst if n not in running]
    return done
