"""A sweep's wall time on 1 process, on N local processes and on a Dask cluster of N workers (issue 36).

    python benchmarks/bench_sweep.py [--trace DIR|FILE] [--first 3000] [--workers 2]

The same grid (profiles x loads x seeds of the trace's first jobs) is run three ways with no cache:
in this process, on a local process pool, and on a Dask LocalCluster started here on loopback; the
figures of all three must be identical (the wall time each replay took aside). Default trace: the
Gavel msr seed 0 traces in ../shared (the issue's "first 3,000 Gavel jobs").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from phalanx.sim.inputs import default_cluster, load_jobs
from phalanx.sim.sweep import Sweep, Variant

GAVEL = Path(__file__).resolve().parents[2] / "shared" / "traces" / "gavel-traces" / "msr" / "seed=0"


def _figures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "replay_s"} for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=GAVEL)
    ap.add_argument("--first", type=int, default=3000)
    ap.add_argument("--profiles", default="phalanx,fifo,k8s-default")
    ap.add_argument("--loads", default="1,2")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ways", default="serial,local,dask")
    args = ap.parse_args()
    if not args.trace.exists():
        print(f"skipped: {args.trace} not found (the Gavel traces of ../shared/traces)", file=sys.stderr)
        return 0
    jobs = sorted(load_jobs(args.trace, "gavel"), key=lambda j: j.submit)[: args.first]
    cl = default_cluster("gavel", args.trace)
    variant = Variant("gavel-500xV100", cl.nodes, jobs, cl.levels)
    profiles = args.profiles.split(",")
    loads = [float(x) for x in args.loads.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    points = len(profiles) * len(loads) * len(seeds)
    print(f"{points} replays of the first {len(jobs)} jobs on {os.cpu_count()} cores: {', '.join(profiles)}")
    ways = {
        "serial": dict(workers=1),
        "local": dict(workers=args.workers),
        "dask": dict(workers=args.workers, dask="local"),
    }
    results: dict[str, tuple[float, list[dict[str, Any]]]] = {}
    for way in args.ways.split(","):
        t0 = time.perf_counter()
        rows = Sweep([variant], profiles, loads, seeds, **ways[way]).run()  # type: ignore[arg-type]
        results[way] = (time.perf_counter() - t0, rows)
        busy = sum(r["replay_s"] for r in rows)
        base, wall = results.get("serial", results[way])[0], results[way][0]
        print(f"{way:>7}: {wall:7.1f} s wall, {busy:7.1f} s in replays, {base / wall:.2f}x")
    figures = [_figures(rows) for _, rows in results.values()]
    same = all(f == figures[0] for f in figures)
    print("identical figures in every way:", "yes" if same else "NO")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
