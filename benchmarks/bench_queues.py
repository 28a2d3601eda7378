"""Queue benchmark (issue 5): one full cycle with 50 queues in 3 levels, 5,000 nodes, 20,000 pending.

Setup: 2 divisions > 6 departments > 42 team queues (50 queues), deserved GPU quotas that sum
to the cluster, uneven over-quota weights, some limits. 5,000 nodes x 8 H100. A fill phase
places running workloads until about 90% of the GPUs are in use, with some queues far over
their fair share (so reclaim has work). Then 20,000 workloads (1-8 GPUs per task, gangs of
up to 4 tasks, priorities 0-2) are pending and one cycle of `phalanx-queues` (reserve,
allocate, reclaim, preempt, consolidate, backfill) runs; we time it, an hour later in
simulated time so the 10-minute minimum runtime does not protect the running workloads.
The fill itself (a cold cycle placing everything from empty) is timed too.

    python benchmarks/bench_queues.py [--nodes 5000] [--pending 20000] [--fill 0.9] [--seed 3]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import CycleResult
from phalanx.core.model import Gpu, GpuRequest, Node, PodSet, TaskRequest, Workload
from phalanx.core.queues import Queue, QueueTree, ResourceQuota
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile


def tree(total_gpus: int, rng: np.random.Generator) -> tuple[QueueTree, list[str]]:
    queues: list[Queue] = []
    leaves: list[str] = []
    per_leaf = total_gpus * 1000 / 42
    for d in range(2):
        queues.append(Queue(f"div{d}", quotas={"gpu": ResourceQuota(per_leaf * 21)}))
        for k in range(3):
            dep = f"div{d}-dep{k}"
            queues.append(Queue(dep, f"div{d}", quotas={"gpu": ResourceQuota(per_leaf * 7)}))
            for t in range(7):
                name = f"{dep}-team{t}"
                limit = per_leaf * 3 if t == 6 else float("inf")
                w = float(rng.choice([0.5, 1.0, 2.0]))
                queues.append(
                    Queue(name, dep, quotas={"gpu": ResourceQuota(per_leaf, limit, w)}, priority=t % 2)
                )
                leaves.append(name)
    return QueueTree(queues), leaves


def nodes(n: int) -> list[Node]:
    return [
        Node(
            f"node-{i:05d}",
            224_000,
            2048 * 1024,
            tuple(Gpu(j, "H100", 81920, pcie_switch=j // 2) for j in range(8)),
            topology={"rack": f"rack-{i // 32:04d}"},
        )
        for i in range(n)
    ]


def workload(name: str, queue: str, t: float, rng: np.random.Generator) -> Workload:
    per = int(rng.choice([1, 1, 2, 4, 8], p=[0.35, 0.15, 0.2, 0.15, 0.15]))
    tasks = int(rng.choice([1, 1, 1, 2, 4])) if per >= 4 else 1
    req = TaskRequest(per * 12_000, per * 65536, GpuRequest.whole(per))
    return Workload(
        name,
        (PodSet("w", tasks, req),),
        min_available=tasks,
        queue=queue,
        priority=int(rng.choice([0, 0, 1, 2])),
        creation_time=t,
        checkpoint_interval=1800.0,
    )


def timed(snap: Snapshot, profile_name: str, clock: float) -> tuple[float, CycleResult]:
    profile = load_profile(profile_name)
    t0 = time.perf_counter()
    result = run_cycle(snap, profile, clock, np.random.default_rng(0))
    dt = time.perf_counter() - t0
    snap.apply(result, clock)
    return dt, result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pending", type=int, default=20_000)
    ap.add_argument("--fill", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--profile", default="phalanx-queues", help="the queue profile timed (name or YAML path)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    ns = nodes(args.nodes)
    qt, leaves = tree(8 * args.nodes, rng)
    snap = Snapshot(ns, topology_levels=["rack"], queues=qt)
    # fill: a third of the teams ask for 3x their share, the rest for a little
    heavy = set(leaves[::3])
    want = {q: (3.0 if q in heavy else 0.3) for q in leaves}
    scale = args.fill * 8 * args.nodes / sum(want[q] * 8 * args.nodes / 42 for q in leaves)
    k = 0
    for q in leaves:
        budget = want[q] * scale * 8 * args.nodes / 42
        while budget > 0:
            w = workload(f"run-{k:06d}", q, float(k) * 1e-3, rng)
            snap.add_workload(w)
            budget -= w.podsets[0].count * w.podsets[0].request.gpu.devices
            k += 1
    fill_s, fill = timed(snap, "phalanx", 0.0)
    used = 1 - snap.cluster.gpu_free_total.sum() / (8000 * args.nodes)
    for name in [e.name for e in snap.pending_workloads()]:
        snap.remove_workload(name)
    for j in range(args.pending):
        snap.add_workload(workload(f"pend-{j:06d}", leaves[j % len(leaves)], 10.0 + j * 1e-3, rng))
    snap.advance(0.0)
    snap.advance(3600.0)
    running = len(snap.running)
    cycle_s, result = timed(snap, args.profile, 3600.0)
    running2, pending2 = len(snap.running), len(snap.pending_workloads())
    again_s, again = timed(snap, args.profile, 3601.0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    nq = len(qt.queues)
    print("| phase | nodes | queues | running workloads | pending workloads | binds | evictions | s |")
    print("|---|---|---|---|---|---|---|---|")
    row("fill (cold allocate from empty, `phalanx`)", args.nodes, nq, 0, k, fill, fill_s)
    row(
        f"full cycle (`{args.profile}`), GPUs {100 * used:.0f}% used",
        args.nodes,
        nq,
        running,
        args.pending,
        result,
        cycle_s,
    )
    row("next cycle", args.nodes, nq, running2, pending2, again, again_s)
    print(f"\npeak RSS {rss:.0f} MiB")


def row(phase: str, nodes: int, queues: int, running: int, pending: int, r: CycleResult, s: float) -> None:
    print(
        f"| {phase} | {nodes:,} | {queues} | {running:,} | {pending:,} | {len(r.binds):,} "
        f"| {len(r.evictions):,} | {s:.2f} |"
    )


if __name__ == "__main__":
    main()
