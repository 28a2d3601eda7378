"""Core benchmark: placed pods per second and peak memory of one allocate pass.

Cases (issue 2):
- openb: the default openb pod list (8,152 pods) on its 1,213-node cluster, every pod pending at once;
- synthetic: 5,000 nodes / 40,000 GPUs and 20,000 pending tasks (fractions, whole GPUs, 8-GPU gangs).

Each (case, profile) runs in a fresh process so that peak RSS is its own.

    python benchmarks/bench_core.py [--profiles phalanx,fgd] [--cases openb,synthetic] [--traces DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time
from pathlib import Path

import numpy as np

from phalanx.core.cycle import run_cycle
from phalanx.core.model import Gpu, GpuRequest, Node, PodSet, TaskRequest, Workload
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile
from phalanx.sim.traces.openb import load_nodes, load_pods

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def openb_case(traces: Path) -> tuple[list[Node], list[Workload]]:
    d = traces / "alibaba-gpu-v2023-openb" / "csv"
    nodes = load_nodes(d / "openb_node_list_gpu_node.csv")
    pods = load_pods(d / "openb_pod_list_default.csv")
    return nodes, [p.workload(creation_time=float(k)) for k, p in enumerate(pods)]


def synthetic_case(seed: int = 7) -> tuple[list[Node], list[Workload]]:
    rng = np.random.default_rng(seed)
    nodes = [
        Node(
            f"node-{i:05d}",
            128_000,
            1024 * 1024,
            tuple(Gpu(j, "H100", 81920, pcie_switch=j // 2) for j in range(8)),
        )
        for i in range(5000)
    ]
    workloads: list[Workload] = []
    t = 0
    tasks = 0
    while tasks < 20_000:
        r = rng.random()
        if r < 0.55:
            req = TaskRequest(4000, 16384, GpuRequest.fraction(float(rng.choice([0.25, 0.5, 0.75]))))
            ps, n = PodSet("p", 1, req), 1
        elif r < 0.95:
            ps, n = PodSet("p", 1, TaskRequest(8000, 65536, GpuRequest.whole(1))), 1
        else:
            n = 2
            ps = PodSet("w", n, TaskRequest(96_000, 512 * 1024, GpuRequest.whole(8)))
        workloads.append(Workload(f"w{t:06d}", (ps,), creation_time=float(t)))
        t += 1
        tasks += n
    return nodes, workloads


def run_one(case: str, profile: str, traces: str, out: mp.Queue) -> None:
    nodes, workloads = openb_case(Path(traces)) if case == "openb" else synthetic_case()
    t0 = time.perf_counter()
    snap = Snapshot(nodes, workloads)
    t_build = time.perf_counter() - t0
    prof = load_profile(profile)
    t0 = time.perf_counter()
    result = run_cycle(snap, prof, 0.0, np.random.default_rng(0), apply=True)
    dt = time.perf_counter() - t0
    tasks = sum(len(e.tasks) for e in snap.workloads.values())
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.put(
        {
            "case": case,
            "profile": profile,
            "nodes": len(nodes),
            "gpus": snap.cluster.total_gpus,
            "tasks": tasks,
            "placed": len(result.binds),
            "seconds": dt,
            "build_s": t_build,
            "pods_per_s": len(result.binds) / dt,
            "peak_rss_mib": peak_mib,
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", default="phalanx,fgd")
    ap.add_argument("--cases", default="openb,synthetic")
    ap.add_argument("--traces", default=str(TRACES))
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    cols = [
        "case",
        "profile",
        "nodes",
        "GPUs",
        "pending tasks",
        "placed",
        "allocate pass (s)",
        "pods/s",
        "peak RSS (MiB)",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        for profile in args.profiles.split(","):
            q: mp.Queue = ctx.Queue()
            p = ctx.Process(target=run_one, args=(case, profile, args.traces, q))
            p.start()
            r = q.get()
            p.join()
            print(
                f"| {r['case']} | {r['profile']} | {r['nodes']:,} | {r['gpus']:,} | {r['tasks']:,} | "
                f"{r['placed']:,} | {r['seconds']:.2f} | {r['pods_per_s']:,.0f} | {r['peak_rss_mib']:,.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
