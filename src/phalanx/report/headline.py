"""What the report and the terminal say won, and only when the data says so.

The FGD protocol runs every profile on the same seeds, and a seed fixes the pod sequence and
the node order, so the profiles are compared seed by seed: profile A beats B when the mean of
the per-seed differences A - B is larger than the half-width of its 95 % interval (Student's t,
n - 1 degrees of freedom). Otherwise they tie, and the headline says so, with the spread.

The time replay's headline is its average JCT; where the profile that allocates the most GPUs
is not the fastest, one sentence says why, from the replay's own records: allocation counts
GPUs held, not work done.

Pure: no matplotlib, so that the terminal summary can use it without loading a plotting stack.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from phalanx.sim.experiment import FgdExperiment
from phalanx.sim.fgd import as_array
from phalanx.sim.replay import ReplayResult

# two-sided 95 % quantiles of Student's t by degrees of freedom (beyond 30: 1.96)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


@dataclass(frozen=True)
class Spread:
    """Per-seed values of one profile: their mean, min, max, and the 95 % interval of the mean."""

    mean: float
    lo: float
    hi: float
    half: float  # half-width of the 95 % interval of the mean; nan with fewer than two seeds
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        v = np.asarray([x for x in values if x == x], dtype=np.float64)
        if not len(v):
            return cls(math.nan, math.nan, math.nan, math.nan, 0)
        return cls(float(v.mean()), float(v.min()), float(v.max()), _half(v), len(v))


def _half(v: np.ndarray) -> float:
    if len(v) < 2:
        return math.nan
    return t975(len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v))


@dataclass(frozen=True)
class Comparison:
    """A against B over the same seeds: the mean per-seed difference A - B and its 95 % interval."""

    diff: float
    half: float  # nan with fewer than two seeds
    n: int

    @property
    def verdict(self) -> str:
        """'win' (A ahead by more than the interval), 'loss', 'tie', or 'unknown' (one seed)."""
        if self.n < 2 or self.half != self.half:
            return "unknown"
        if self.diff - self.half > 0:
            return "win"
        if self.diff + self.half < 0:
            return "loss"
        return "tie"


def compare(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """Paired by seed: a[k] and b[k] come from the same seed."""
    d = np.asarray([x - y for x, y in zip(a, b, strict=True) if x == x and y == y], dtype=np.float64)
    if not len(d):
        return Comparison(math.nan, math.nan, 0)
    return Comparison(float(d.mean()), _half(d), len(d))


def per_seed(exp: FgdExperiment, x: int = 100, which: int = 0) -> dict[str, list[float]]:
    """Per profile, one value per seed (in seed order) at arrived load x: allocation (0) or frag rate (2)."""
    return {prof: [float(as_array(r.discrete()[which])[x]) for r in runs] for prof, runs in exp.runs.items()}


def lead_cells(values: Mapping[str, Sequence[float]]) -> dict[str, str]:
    """Per profile, ranked by mean: its per-seed lead over the next one, e.g. '+0.01 ±0.18 over fgd: tie'."""
    means = {p: Spread.of(v).mean for p, v in values.items()}
    ranked = sorted((p for p in values if means[p] == means[p]), key=lambda p: (-means[p], p))
    out = {}
    for p, nxt in pairwise(ranked):
        c = compare(values[p], values[nxt])
        half = f" ±{c.half:.2f}" if c.half == c.half else ""
        word = {"win": "ahead", "loss": "behind", "tie": "tie", "unknown": "one seed"}[c.verdict]
        out[p] = f"{c.diff:+.2f}{half} over {nxt}: {word}"
    return out


def fgd_headline(name: str, values: Mapping[str, Sequence[float]]) -> str:
    """The FGD protocol's headline from per-seed GPU allocation % at full load, per profile."""
    spreads = {p: Spread.of(v) for p, v in values.items()}
    ranked = sorted((p for p in values if spreads[p].n), key=lambda p: (-spreads[p].mean, p))
    if not ranked:
        return ""
    lead = ranked[0]
    m = spreads[lead]
    n = m.n
    where = f"On the FGD protocol ({name})"
    if len(ranked) == 1:
        return f"{where}, {lead} allocates {m.mean:.2f} % of the GPUs at full load."
    cmp = {p: compare(values[lead], values[p]) for p in ranked[1:]}
    if n < 2:
        runner = ranked[1]
        return (
            f"{where}, {lead} allocates the most GPUs at full load: {m.mean:.2f} %, against "
            f"{runner}'s {spreads[runner].mean:.2f} %, on one seed: no spread over seeds to tell "
            "a win from noise (run more seeds, e.g. --seed 42-51)."
        )
    tied = [p for p in ranked[1:] if cmp[p].verdict != "win"]
    behind = [p for p in ranked[1:] if p not in tied]
    nxt = behind[0] if behind else ""
    # the tied group is ahead of the next one only when each of them beats it, seed by seed
    ahead = bool(nxt) and all(compare(values[p], values[nxt]).verdict == "win" for p in tied)
    tail = f", ahead of {nxt} ({spreads[nxt].mean:.2f} %)" if ahead else ""
    if not tied:
        c = cmp[ranked[1]]
        return (
            f"{where}, {lead} allocates the most GPUs at full load: {m.mean:.2f} %, ahead of "
            f"{ranked[1]} ({spreads[ranked[1]].mean:.2f} %) by {c.diff:.2f} points, more than the "
            f"spread over {n} seeds (95 % interval of the per-seed difference ±{c.half:.2f})."
        )
    group = [lead, *tied]
    names = " and ".join([", ".join(group[:-1]), group[-1]])
    vals = " vs ".join(f"{spreads[p].mean:.2f} %" for p in group)
    if len(tied) == 1:
        c = cmp[tied[0]]
        why = (
            f"{abs(c.diff):.2f} points apart, within the spread over {n} seeds: ±{c.half:.2f} points, "
            "the 95 % interval of the per-seed difference"
        )
    else:
        half = max(cmp[p].half for p in tied)
        why = f"apart by less than the spread over {n} seeds: up to ±{half:.2f} points at 95 %"
    return f"{where}, {names} tie at full load ({vals}: {why}){tail}."


def _best(
    rows: Sequence[Mapping[str, object]], key: str, high: bool
) -> tuple[str, float, list[tuple[str, float]]]:
    vals = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and v == v:
            vals.append((str(r["profile"]), float(v)))
    vals.sort(key=lambda x: -x[1] if high else x[1])
    return (vals[0][0], vals[0][1], vals[1:]) if vals else ("", math.nan, [])


TIE_SHARE = 0.005  # a lead under half a per cent of the JCT, in a single run, is not a lead


def replay_headline(name: str, rows: Sequence[Mapping[str, object]]) -> str:
    """The time replay's headline: the lowest average JCT (one run: the replay has one seed).

    A profile's average JCT counts only the jobs it completed, so profiles are ranked only among
    those that completed the most jobs; the others are named with what they completed."""
    done = completed_counts(rows)
    top = max((c for c, _ in done.values()), default=0)
    behind = {p: cn for p, cn in done.items() if cn[0] < top}
    if not behind:
        return _jct_headline(name, rows, "")
    ranked = [r for r in rows if str(r["profile"]) not in behind]
    jobs = max(n for _, n in done.values())
    every = f"all {jobs:,} jobs" if top == jobs else f"{top:,} of {jobs:,} jobs"
    return f"{_jct_headline(name, ranked, every)} {_behind_sentence(behind)}"


def completed_counts(rows: Sequence[Mapping[str, object]]) -> dict[str, tuple[int, int]]:
    """Per profile: (jobs completed, jobs), where the rows say both."""
    out = {}
    for r in rows:
        c, n = r.get("completed"), r.get("jobs")
        if isinstance(c, int) and isinstance(n, int):
            out[str(r["profile"])] = (c, n)
    return out


def _behind_sentence(behind: Mapping[str, tuple[int, int]]) -> str:
    """E.g. 'fifo finished 1 of 3 jobs: its average JCT counts only those, so it is not compared.'"""
    order = sorted(behind.items(), key=lambda x: (-x[1][0], x[0]))
    some = [f"{p} finished {c:,} of {n:,} jobs" for p, (c, n) in order if c]
    none = [f"{p} finished none of the {n:,} jobs" for p, (c, n) in order if not c]
    out = []
    if some:
        its = "its average JCT counts" if len(some) == 1 else "their average JCTs count"
        they = "it is" if len(some) == 1 else "they are"
        out.append(f"{_and(some)}: {its} only those, so {they} not compared.")
    if none:
        out.append(f"{_and(none)}.")
    return " ".join(out)


def _and(parts: Sequence[str]) -> str:
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def _jct_headline(name: str, rows: Sequence[Mapping[str, object]], every: str) -> str:
    """The lowest average JCT among `rows`; `every`: what they all finished, when others did not."""
    who, v, rest = _best(rows, "avg_jct_s", high=False)
    among = f"among the profiles that finished {every}, " if every else ""
    if not who:
        return f"In the time replay of {name}, no profile finished {every}." if every else ""
    if rest:
        other, ov = rest[0]
        if ov - v <= TIE_SHARE * ov:  # would read "0 % below": one run cannot tell them apart
            tied = [who, *(p for p, x in rest if x - v <= TIE_SHARE * x)]
            names = ", ".join(tied[:-1]) + f" and {tied[-1]}"
            return (
                f"In the time replay of {name} (one run, no spread over seeds), {among}{names} tie on "
                f"average job completion time ({seconds(v)}, within {100 * TIE_SHARE:.1f} % of the lowest)."
            )
        return (
            f"In the time replay of {name} (one run, no spread over seeds), {among}{who} has the lowest "
            f"average job completion time, {seconds(v)}, "
            f"{100 * (ov - v) / ov:.0f} % below {other} ({seconds(ov)})."
        )
    if every:
        return (
            f"In the time replay of {name}, only {who} finished {every}, "
            f"with an average job completion time of {seconds(v)}."
        )
    return f"In the time replay of {name}, {who} has an average job completion time of {seconds(v)}."


def seconds(v: float) -> str:
    if v >= 86400:
        return f"{v / 86400:,.1f} days"
    if v >= 3600:
        return f"{v / 3600:,.1f} h"
    return f"{v:,.0f} s"


@dataclass(frozen=True)
class GpuTime:
    """Where one replay's allocated GPU-time went, in GPU-seconds."""

    held: float  # integral of GPUs allocated over the replay
    work: float  # the trace's work: GPUs x duration of the jobs that completed
    slower: float  # runs longer than the trace's duration (runtime model: spread, cache, sharing)
    not_running: float  # held by jobs not running yet: gangs partly placed, waiting for their other tasks
    clean: bool  # every job ran once, rigid, to completion: slower and not_running are exact


def gpu_time(res: ReplayResult) -> GpuTime:
    s = res.samples
    t = np.array([x.time for x in s], dtype=np.float64)
    a = np.array([x.gpu_alloc for x in s], dtype=np.float64)
    held = float((a[:-1] * np.diff(t)).sum()) * res.total_gpus if len(s) > 1 else 0.0
    done = [j for j in res.jobs if j.end is not None and j.start is not None]
    work = sum(j.spec.gpu_amount * j.spec.duration for j in done)
    clean = len(done) == len(res.jobs) and all(
        j.evictions == 0 and j.restarts == 0 and j.spec.min_tasks == 0 for j in res.jobs
    )
    if not clean:
        return GpuTime(held, work, math.nan, math.nan, False)
    ran = sum(
        j.spec.gpu_amount * (j.end - j.start) for j in done if j.end is not None and j.start is not None
    )
    return GpuTime(held, work, ran - work, held - ran, True)


def split_sentence(rows: Sequence[Mapping[str, object]], results: Mapping[str, ReplayResult]) -> str:
    """One sentence where the profile allocating the most GPUs is not the one with the lowest JCT."""
    alloc = _values(rows, "gpu_alloc_pct")
    jct = _values(rows, "avg_jct_s")
    if len(alloc) < 2 or not jct:
        return ""
    top = max(alloc, key=lambda p: (alloc[p], p))
    fast = min(jct, key=lambda p: (jct[p], p))
    if top == fast or top not in jct or fast not in alloc or alloc[top] - alloc[fast] < 0.5:
        return ""
    done = completed_counts(rows)
    if done.get(top, (0, 0))[0] != done.get(fast, (0, 0))[0]:  # JCTs over different jobs: no story
        return ""
    a, b = gpu_time(results[top]), gpu_time(results[fast])
    if not (a.work > 0 and b.work > 0):
        return ""
    why = (
        f"{top} allocates the most GPUs ({alloc[top]:.1f} % vs {fast}'s {alloc[fast]:.1f} %) yet finishes "
        f"jobs later (average JCT {jct[top]:,.0f} s vs {jct[fast]:,.0f} s) because allocation counts "
        f"GPUs held, not work done: it held {_pct(a.held - a.work, a.work)} more GPU-time than the "
        f"trace's work ({fast}: {_pct(b.held - b.work, b.work)} more)"
    )
    if a.clean:
        parts = []
        if a.not_running > 0.005 * a.work:
            parts.append(
                f"{_pct(a.not_running, a.work)} held by gangs partly placed, waiting for their other tasks"
            )
        if a.slower > 0.005 * a.work:
            parts.append(f"{_pct(a.slower, a.work)} by runs that its placement slowed (runtime model)")
        if parts:
            why += ": " + " and ".join(parts)
    return why + "."


def _pct(x: float, of: float) -> str:
    return f"{100 * x / of:.0f} %"


def _values(rows: Sequence[Mapping[str, object]], key: str) -> dict[str, float]:
    out = {}
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and v == v:
            out[str(r["profile"])] = float(v)
    return out
