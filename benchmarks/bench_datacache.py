"""Input I/O in the simulator: GPU time lost waiting on input, without a cache, with a node cache
filled on first use, and with staging ahead (docs/benchmarks.md section 10).

The trace: Gavel's msr seed 0 (15,264 jobs from Philly, per-VC streams). Each job's dataset is
the one its own command line reads (`%s/data/imagenet/pytorch` -> imagenet); dataset sizes and
sample counts are the datasets' public figures (src/phalanx/sim/runtime.yaml, `io:`), epochs come
from iterations x batch size / samples. The cluster: Gavel's 500 V100 (63 nodes of 8).

    python benchmarks/bench_datacache.py [--limit N] [--profile phalanx] [--read-gbps 1.0]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.profiles import load_profile
from phalanx.sim.datacache import DataCache, dataset_sizes
from phalanx.sim.replay import replay
from phalanx.sim.runtime import RuntimeModel, default_runtime
from phalanx.sim.traces import gavel

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def jobs(limit: int) -> list:
    table = gavel.load_throughputs(TRACES / "gavel-traces" / "simulation_throughputs.json")
    out = []
    for f in sorted((TRACES / "gavel-traces" / "msr" / "seed=0").glob("*.trace")):
        out += gavel.load_trace(f, table)
    out.sort(key=lambda j: (j.submit, j.name))
    return out[:limit] if limit else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=0, help="first N jobs by arrival (0: all)")
    ap.add_argument("--profile", default="phalanx")
    ap.add_argument("--read-gbps", type=float, default=0.0, help="override io.read_gbps")
    ap.add_argument("--modes", default="none,first-use,ahead")
    ap.add_argument("--load", type=float, default=1.0, help="arrival-rate multiplier")
    ap.add_argument(
        "--per-queue", action="store_true", help="each VC reads its own copy of its datasets (<vc>/<dataset>)"
    )
    args = ap.parse_args()
    spec = default_runtime()
    if args.read_gbps:
        spec.io.read_gbps = args.read_gbps
    js = jobs(args.limit)
    if args.load != 1.0:
        t0 = min(j.submit for j in js)
        js = [dataclasses.replace(j, submit=t0 + (j.submit - t0) / args.load) for j in js]
    if args.per_queue:
        js = [dataclasses.replace(j, dataset=f"{j.queue}/{j.dataset}") if j.dataset else j for j in js]
    sizes = dataset_sizes(js, spec.io)
    nodes, levels = gavel.philly_cluster()
    readers = sum(1 for j in js if j.dataset)
    big = sorted({k.rsplit("/", 1)[-1] for k, v in sizes.items() if v > 1e11})
    print(f"{len(js):,} jobs, {readers:,} read one of {len(sizes)} datasets; over 100 GB: {', '.join(big)}")
    print(
        "| data cache | GPU-h lost to input waits | per job (GPU-s) | avg wait (s) | warm starts | "
        "staged (TB) | staged ahead on the nodes the gang got | avg JCT (s) | replay (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def row(mode: str, s: dict[str, Any], took: float) -> str:
        return (
            f"| {mode} | {s['io_wait_gpu_h']:,.1f} | {s['io_wait_gpu_s_per_job']:,.1f} | "
            f"{s['io_wait_avg_s']:,.1f} | "
            f"{s['io_warm_start_pct']:.1f} % | {s['io_staged_tb']:.2f} | {s['io_planned_right_pct']:.0f} % | "
            f"{s['avg_jct_s']:,.0f} | {took:.0f} |"
        )

    replay_modes(nodes, js, levels, spec, sizes, args.modes.split(","), args.profile, row)


def replay_modes(
    nodes: Any,
    js: Any,
    levels: Any,
    spec: Any,
    sizes: dict[str, float],
    modes: list[str],
    profile: str,
    row: Callable[[str, dict[str, Any], float], str],
) -> None:
    """Replay the same jobs once per data-cache mode, printing `row` of each summary as it ends."""
    for mode in modes:
        data = DataCache(spec.io, sizes, mode)
        t = time.perf_counter()
        res = replay(
            nodes,
            js,
            load_profile(profile),
            topology_levels=levels,
            runtime=RuntimeModel(spec),
            datasets={k: int(v) for k, v in sizes.items()},
            data_cache=data,
        )
        print(row(mode, res.summary(), time.perf_counter() - t), flush=True)


if __name__ == "__main__":
    main()
