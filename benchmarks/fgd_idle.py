"""Where the idle GPUs sit at the end of one FGD-protocol run (x = 130): hole sizes, starved nodes.

    python benchmarks/fgd_idle.py [--profile phalanx] [--seed 42] [--pods openb_pod_list_default.csv]

Prints idle GPUs by size of the hole they sit in, how much of each sits on nodes with under
2 free cores, the nodes that keep whole GPUs free (and their free CPU and memory), how many
pods of each GPU share were placed, and which pod shapes failed most.
"""

from __future__ import annotations

import argparse
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np

from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile
from phalanx.sim.fgd import run_fgd
from phalanx.sim.traces.openb import load_nodes, load_pods

OPENB = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-gpu-v2023-openb" / "csv"
BUCKETS = [(1, 50), (50, 150), (150, 200), (200, 500), (500, 1000), (1000, 1001)]


def report(snap: Snapshot) -> None:
    c = snap.cluster
    count = np.array([len(n.gpus) for n in c.nodes])
    real = np.arange(c.gpu_milli_free.shape[1])[None, :] < count[:, None]
    free = np.where(real, c.gpu_milli_free, 0)
    starved = c.cpu_free < 2000
    print(f"idle GPUs {free.sum() / 1000:.1f} of {count.sum():,}")
    for lo, hi in BUCKETS:
        sel = (free >= lo) & (free < hi)
        low = free[sel & starved[:, None]].sum() / 1000
        idle = free[sel].sum() / 1000
        print(
            f"  holes [{lo}, {hi}) milli: {sel.sum():5d} GPUs, {idle:6.1f} idle, {low:5.1f} on nodes <2 cores"
        )
    for i in np.nonzero((free == 1000).any(axis=1))[0]:
        n = c.nodes[i]
        print(
            f"  {n.name}: {(free[i] == 1000).sum()} of {count[i]} GPUs free, "
            f"{c.cpu_free[i] / 1000:.1f} cores, {c.mem_free[i] / 1024:.0f} GiB free"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="phalanx")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--pods", default="openb_pod_list_default.csv")
    args = ap.parse_args()
    nodes = load_nodes(OPENB / "openb_node_list_gpu_node.csv")
    pods = load_pods(OPENB / args.pods)
    log = io.StringIO()
    run_fgd(nodes, pods, load_profile(args.profile), seed=args.seed, log=log, at_end=report)
    placed: Counter[int] = Counter()
    failed: Counter[str] = Counter()
    shapes = {p.name: p for p in pods}
    for line in log.getvalue().splitlines():
        d = json.loads(line)
        if d.get("kind") == "bind" and len(d.get("gpus", [])) == 1:
            placed[int(d["gpu_milli"])] += 1
        elif d.get("kind") == "failed":
            p = shapes.get(str(d["workload"]).split("-tuned-")[0])
            failed[f"{p.num_gpu}x{p.gpu_milli}m {p.cpu_milli // 1000}c" if p else str(d["workload"])] += 1
    print("placed single-GPU pods by milli-GPU:", dict(sorted(placed.items())))
    print("most failed shapes:", failed.most_common(8))


if __name__ == "__main__":
    main()
