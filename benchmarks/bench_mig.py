"""Dynamic MIG (issue 42): a day of mixed inference and training on MIG-enabled A100s, replayed on
fixed partitions (the best of a few layouts an administrator would pick) and with the
`repartition` action recutting idle GPUs for what waits, same jobs, same run.

    python benchmarks/bench_mig.py [--nodes 8] [--hours 24] [--seed 0] [--recut-s 120]

The trace is synthetic (no public trace has MIG requests): inference pods asking 1g.10gb
(Poisson arrivals, a daily wave peaking in the day), a few 3g.40gb services, and training jobs
asking 7g.80gb (a whole GPU as one instance) in a wave peaking at night; durations exponential.
Printed: the share of the GPUs' compute slices allocated over the arrival window, the mean wait
of each kind of slice and of all, jobs not started by the end, and recuts (and per GPU-hour).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import time

import numpy as np

from phalanx.core.model import Gpu, MigInstance, Node
from phalanx.profiles import compile_profile
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import replay

LAYOUTS = {
    "7x1g": ["1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"],
    "1x7g": ["7g.80gb@0"],
    "3g+2g+1g": ["3g.40gb@0", "2g.20gb@4", "1g.10gb@6"],
}
MIXES = {  # fixed partitions: every GPU one layout, or half the GPUs each of two
    "all 7x1g": ("7x1g", "7x1g"),
    "all 1x7g": ("1x7g", "1x7g"),
    "all 3g+2g+1g": ("3g+2g+1g", "3g+2g+1g"),
    "half 7x1g, half 1x7g": ("7x1g", "1x7g"),
    "half 3g+2g+1g, half 1x7g": ("3g+2g+1g", "1x7g"),
}
COMPUTE = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3, "7g.80gb": 7}


def nodes(n: int, mix: tuple[str, str]) -> list[Node]:
    """`n` nodes of 8 A100-80GB, MIG on: GPUs 0-3 cut as the mix's first layout, 4-7 its second."""
    out = []
    for k in range(n):
        gpus = tuple(Gpu(j, "A100", 81920, j // 4, j // 2, 0, True) for j in range(8))
        inst = {
            j: tuple(MigInstance(p, int(st)) for p, _, st in (x.partition("@") for x in LAYOUTS[mix[j // 4]]))
            for j in range(8)
        }
        out.append(Node(f"a100-{k}", 96_000, 1_000_000, gpus, mig_instances=inst))
    return out


def trace(gpus: int, hours: float, seed: int, load: float = 0.85) -> list[JobSpec]:
    """Inference by day, training by night (the waves 12 h apart); at the waves' peaks `load` of the
    compute is asked (about 0.55 x it on average)."""
    rng = np.random.default_rng(seed)
    jobs: list[JobSpec] = []
    end = hours * 3600

    def wave(t: float, peak_h: float) -> float:  # 0.1 .. 1.0, highest at `peak_h` o'clock
        return 0.55 + 0.45 * math.cos(2 * math.pi * (t / 3600 - peak_h) / 24)

    kinds = (  # profile, mean run (s), share of the compute asked, the hour its wave peaks
        ("1g.10gb", 1800.0, 0.45, 14.0),
        ("3g.40gb", 3600.0, 0.10, 14.0),
        ("7g.80gb", 4 * 3600.0, 0.45, 2.0),
    )
    load = load * gpus * 7  # compute slices asked at the peak
    for prof, mean, share, peak in kinds:
        rate = load * share / (COMPUTE[prof] * mean)  # arrivals per second at the mean of the wave
        t = 0.0
        k = 0
        while True:
            t += rng.exponential(1 / (rate * 1.0))
            if t >= end:
                break
            if rng.random() > wave(t, peak) / 1.0:
                continue  # thinning: fewer arrivals off the wave's peak
            dur = float(max(60.0, rng.exponential(mean)))
            jobs.append(JobSpec(f"{prof.split('.')[0]}-{k}", t, dur, 1, mig=prof, queue="default"))
            k += 1
    return sorted(jobs, key=lambda j: j.submit)


def profile(dynamic: bool, recut_s: float, interval_s: float) -> object:
    actions: list[dict[str, object]] = [{"name": "allocate", "args": {"gang": True}}, {"name": "backfill"}]
    if dynamic:
        actions.append({"name": "repartition", "args": {"recut_s": recut_s, "min_interval_s": interval_s}})
    return compile_profile(
        {
            "name": "dynamic MIG" if dynamic else "fixed MIG",
            "tie_break": "name",
            "actions": actions,
            "order": [{"name": "priority"}],
            "scorers": [{"name": "binpack", "weight": 1}],
        }
    )


def measure(jobs: list[JobSpec], ns: list[Node], prof: object, window: float) -> dict[str, float]:
    log = io.StringIO()
    t0 = time.process_time()
    res = replay(ns, jobs, prof, log=log, checkpoint_interval=0.0)  # type: ignore[arg-type]
    cpu = time.process_time() - t0
    slices = 7 * sum(len(n.gpus) for n in ns)
    used = 0.0
    waits: dict[str, list[float]] = {}
    late = 0
    for r in res.jobs:
        kind = r.spec.mig.split(".")[0]
        if r.start is None:
            late += 1
            waits.setdefault(kind, []).append(window - r.spec.submit)
            continue
        waits.setdefault(kind, []).append(r.start - r.spec.submit)
        end = r.end if r.end is not None else window
        used += max(0.0, min(end, window) - min(r.start, window)) * COMPUTE[r.spec.mig]
    recuts = sum(1 for line in log.getvalue().splitlines() if json.loads(line)["kind"] == "repartition")
    out = {"alloc": 100 * used / (slices * window), "late": late, "recuts": recuts, "cpu": cpu}
    out["recuts_per_gpu_h"] = recuts / (sum(len(n.gpus) for n in ns) * window / 3600)
    for kind, ws in waits.items():
        out[f"wait {kind}"] = float(np.mean(ws))
    out["wait all"] = float(np.mean([w for ws in waits.values() for w in ws]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load", type=float, default=0.85, help="share of the compute asked at the waves' peaks")
    ap.add_argument("--recut-s", type=float, default=120.0, help="seconds a recut takes (GPU out of service)")
    ap.add_argument("--interval-s", type=float, default=1800.0, help="a GPU is recut at most once in this")
    args = ap.parse_args()
    gpus = 8 * args.nodes
    jobs = trace(gpus, args.hours, args.seed, args.load)
    window = args.hours * 3600
    by_kind = {k: sum(1 for j in jobs if j.mig.startswith(k)) for k in ("1g", "3g", "7g")}
    print(
        f"{len(jobs):,} jobs on {args.nodes} x 8 A100-80GB (MIG) over {args.hours:g} h: "
        + ", ".join(f"{n:,} x {k}" for k, n in by_kind.items())
        + f"; load {args.load:g}; recut {args.recut_s:g} s, at most once a GPU in {args.interval_s:g} s;"
        + f" seed {args.seed}\n"
    )
    head = "| partitions | compute allocated (%) | mean wait 1g / 3g / 7g (s) | mean wait (s) | not started"
    print(head + " | recuts (/GPU-h) | CPU (s) |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for name, mix in MIXES.items():
        m = measure(jobs, nodes(args.nodes, mix), profile(False, 0, 0), window)
        rows.append((name, m))
    best = max(rows, key=lambda r: r[1]["alloc"])
    for start in (best[0], "half 3g+2g+1g, half 1x7g"):  # from the best fixed one, and from a poor one
        dyn = measure(
            jobs, nodes(args.nodes, MIXES[start]), profile(True, args.recut_s, args.interval_s), window
        )
        rows.append((f"dynamic, cut as {start} at first", dyn))
        if start == best[0]:
            first = dyn
    for name, m in rows:
        waits = " / ".join(f"{m.get(f'wait {k}', 0):,.0f}" for k in ("1g", "3g", "7g"))
        print(
            f"| {name} | {m['alloc']:.1f} | {waits} | {m['wait all']:,.0f} | {m['late']:.0f} | "
            f"{m['recuts']:.0f} ({m['recuts_per_gpu_h']:.3f}) | {m['cpu']:.1f} |"
        )
    gain = first["alloc"] / best[1]["alloc"] - 1
    print(f"\ndynamic from the best fixed partition ({best[0]}) vs it: {100 * gain:+.1f} % compute allocated")


if __name__ == "__main__":
    main()
