"""Per-node copies against a distributed cache in the Gavel replay, datasets sized from job sizes
(issue 33 item 6; docs/benchmarks.md section 27).

The trace and cluster are those of bench_datacache.py: Gavel's msr seed 0 (15,264 jobs from
Philly) on its 500 V100 (125 nodes of 4, `gavel.philly_cluster`). Datasets are sized from each
job's size, not from the public datasets (which all fit a node): a job reads its whole dataset once
per epoch at `--mb-per-gpu-s` per GPU, so its dataset is GPUs x duration / epochs x that rate,
rounded up to a power of two GB; jobs of one VC with the same trace dataset and size share it
(`<vc>/<dataset>/<GB>`). Epochs: runtime.yaml's default (10) for every job. Both modes replay the
same jobs, one after the other.

    python benchmarks/bench_distcache.py [--limit N] [--capacity-gb 7680] [--mb-per-gpu-s 50]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from bench_datacache import jobs as gavel_jobs
from bench_datacache import replay_modes
from phalanx.sim.datacache import dataset_sizes
from phalanx.sim.jobs import JobSpec
from phalanx.sim.runtime import IoSpec, default_runtime
from phalanx.sim.traces import gavel


def sized(js: list[JobSpec], io: IoSpec, mb_per_gpu_s: float) -> list[JobSpec]:
    """Each reading job's dataset sized from its GPUs and duration, shared within a VC by size."""
    out = []
    for j in js:
        if not j.dataset:
            out.append(j)
            continue
        need_gb = j.gpus * j.duration / io.epochs * mb_per_gpu_s / 1e3
        gb = 2 ** max(0, math.ceil(math.log2(max(need_gb, 1.0))))
        name = f"{j.queue}/{j.dataset}/{gb}"
        out.append(dataclasses.replace(j, dataset=name, dataset_bytes=int(gb * 1e9)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=0, help="first N jobs by arrival (0: all)")
    ap.add_argument("--profile", default="phalanx")
    ap.add_argument("--mb-per-gpu-s", type=float, default=50.0, help="input read rate per GPU")
    ap.add_argument("--capacity-gb", type=float, default=0.0, help="override io.capacity_gb (cache per node)")
    ap.add_argument("--group", default="", help="override io.distributed.group")
    ap.add_argument("--replicas", type=int, default=0, help="override io.distributed.replicas")
    ap.add_argument("--modes", default="first-use,distributed")
    args = ap.parse_args()
    spec = default_runtime()
    spec.io.samples = {}  # the sized datasets are not the public ones: runtime.yaml's default epochs
    if args.capacity_gb:
        spec.io.capacity_gb = args.capacity_gb
    if args.group:
        spec.io.distributed.group = args.group
    if args.replicas:
        spec.io.distributed.replicas = args.replicas
    js = sized(gavel_jobs(args.limit), spec.io, args.mb_per_gpu_s)
    sizes = dataset_sizes(js, spec.io)
    nodes, levels = gavel.philly_cluster()
    cap = spec.io.capacity_gb * 1e9
    readers = [j for j in js if j.dataset]
    over = [j for j in readers if sizes[j.dataset] > cap]
    print(
        f"{len(js):,} jobs; {len(readers):,} read one of {len(sizes)} datasets "
        f"({sum(sizes.values()) / 1e15:.2f} PB in all); {len(over):,} jobs read one larger than a node's "
        f"cache ({spec.io.capacity_gb:,.0f} GB); largest {max(sizes.values()) / cap:.1f}x a node, "
        f"group of {len(nodes)} nodes holds {len(nodes)}x"
    )
    print(
        "| data cache | GPU-h lost to input waits | avg wait (s) | warm starts | from the source (TB) | "
        "... in epochs 2+ (TB) | copied into caches (TB) | avg JCT (s) | replay (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def row(mode: str, s: dict[str, Any], took: float) -> str:
        return (
            f"| {mode} | {s['io_wait_gpu_h']:,.1f} | {s['io_wait_avg_s']:,.1f} | "
            f"{s['io_warm_start_pct']:.1f} % | {s['io_egress_tb']:,.1f} | "
            f"{s['io_egress_later_epochs_tb']:,.1f} | {s['io_staged_tb']:,.1f} | {s['avg_jct_s']:,.0f} | "
            f"{took:.0f} |"
        )

    replay_modes(nodes, js, levels, spec, sizes, args.modes.split(","), args.profile, row)


if __name__ == "__main__":
    main()
