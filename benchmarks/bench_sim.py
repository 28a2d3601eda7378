"""Simulator benchmarks (issue 3): FGD fidelity, the phalanx profile on every openb pod list, speeds,
and the time-replay comparison on the Tiresias and Gavel traces.

    python benchmarks/bench_sim.py fidelity [--seeds 42-51]  # 6 artifact policies + phalanx, default list
    python benchmarks/bench_sim.py lists [--seeds 42-51]     # fgd and phalanx on all 15 openb lists
    python benchmarks/bench_sim.py speed                     # one run, 60 runs, the 15K-job replay
    python benchmarks/bench_sim.py replay                    # Tiresias, Gavel: phalanx, fifo, k8s-default
    python benchmarks/bench_sim.py tenancy [--limit N] [--profiles a,b]  # Gavel VCs as 15 queues
    python benchmarks/bench_sim.py tenancy --ablate reserve,reclaim  # phalanx-queues minus an action
    python benchmarks/bench_sim.py tenancy --load 0.5 | --trace pollux  # lighter load, another trace

Results print as markdown tables (copied into docs/benchmarks.md); CSVs go to --out (not committed).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing as mp
import resource
import sys
import time
from collections.abc import Callable
from importlib import resources as package_files
from pathlib import Path

import yaml

from phalanx.core.profile import Profile
from phalanx.core.queues import Queue, QueueTree, ResourceQuota
from phalanx.profiles import compile_profile, load_profile
from phalanx.sim.bench import BenchJob, diff, parse_seeds, run_bench, write_results
from phalanx.sim.fgd import run_fgd
from phalanx.sim.replay import replay
from phalanx.sim.traces import gavel, openb, pollux, tiresias

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
OPENB = TRACES / "alibaba-gpu-v2023-openb" / "csv"
AUTHORS = TRACES / "fgd-simulator-expected-results" / "analysis_allo_discrete.csv"
NODES = OPENB / "openb_node_list_gpu_node.csv"
ARTIFACT = ["random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"]
XS = (50, 90, 100, 130)


def fidelity(seeds: list[int], out: Path) -> None:
    jobs = [
        BenchJob(str(NODES), str(OPENB / "openb_pod_list_default.csv"), p, s, 1.3)
        for p in [*ARTIFACT, "phalanx"]
        for s in seeds
    ]
    t = time.perf_counter()
    rows = run_bench(jobs, 2)
    print(f"<!-- {len(jobs)} runs in {time.perf_counter() - t:.0f} s -->")
    paths = write_results(rows, out / "fidelity.csv")
    print("| policy | " + " | ".join(f"x={x} ours / authors / delta" for x in XS) + " |")
    print("|---|" + "---|" * len(XS))
    for r in diff(paths[0], AUTHORS, XS):
        cells = []
        for x in XS:
            a, b = r.ours[x], r.theirs[x]
            cells.append(f"{a:.2f} / -" if math.isnan(b) else f"{a:.2f} / {b:.2f} / {a - b:+.2f}")
        print(f"| {r.policy} | " + " | ".join(cells) + " |")


def lists(seeds: list[int], out: Path) -> None:
    files = sorted(OPENB.glob("openb_pod_list_*.csv"))
    jobs = [BenchJob(str(NODES), str(f), p, s, 1.3) for f in files for p in ("fgd", "phalanx") for s in seeds]
    t = time.perf_counter()
    rows = run_bench(jobs, 2)
    print(f"<!-- {len(jobs)} runs in {time.perf_counter() - t:.0f} s -->")
    path = write_results(rows, out / "lists.csv")[0]
    theirs = {(r.workload, r.policy): r.theirs for r in diff(path, AUTHORS, (100, 130))}
    ours = {(r.workload, r.policy): r.ours for r in diff(path, AUTHORS, (100, 130))}
    print(
        "| pod list | FGD authors x=100 / 130 | FGD ours x=100 / 130 | phalanx x=100 / 130 "
        "| phalanx - FGD (ours) |"
    )
    print("|---|---|---|---|---|")
    for f in files:
        w = f.stem
        a = theirs.get((w, "06-FGD"), {100: math.nan, 130: math.nan})
        o = ours[(w, "06-FGD")]
        p = ours[(w, "07-Phalanx")]
        auth = "-" if math.isnan(a[100]) else f"{a[100]:.2f} / {a[130]:.2f}"
        print(
            f"| {w.removeprefix('openb_pod_list_')} | {auth} | {o[100]:.2f} / {o[130]:.2f} | "
            f"{p[100]:.2f} / {p[130]:.2f} | {p[100] - o[100]:+.2f} / {p[130] - o[130]:+.2f} |"
        )


def _one_fgd(q: mp.Queue) -> None:
    nodes = openb.load_nodes(NODES)
    pods = openb.load_pods(OPENB / "openb_pod_list_default.csv")
    t = time.perf_counter()
    run = run_fgd(nodes, pods, load_profile("phalanx"), seed=42)
    q.put((time.perf_counter() - t, run.submitted, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def gavel_jobs() -> list:
    table = gavel.load_throughputs(TRACES / "gavel-traces" / "simulation_throughputs.json")
    jobs = []
    for f in sorted((TRACES / "gavel-traces" / "msr" / "seed=0").glob("*.trace")):
        jobs += gavel.load_trace(f, table)
    return jobs


def speed() -> None:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    p = ctx.Process(target=_one_fgd, args=(q,))
    p.start()
    secs, submitted, rss = q.get()
    p.join()
    print(
        f"| one FGD-protocol run, phalanx, default list (1,213 nodes, {submitted:,} submissions, "
        f"fragmentation metric after each) | {secs:.1f} s | target 10 s | peak RSS {rss:.0f} MiB |"
    )
    seeds = list(range(42, 52))
    jobs = [
        BenchJob(str(NODES), str(OPENB / "openb_pod_list_default.csv"), pol, s, 1.3)
        for pol in ARTIFACT
        for s in seeds
    ]
    t = time.perf_counter()
    run_bench(jobs, 2)
    secs = time.perf_counter() - t
    print(f"| 10 seeds x 6 policies, default list, 2 processes | {secs:.0f} s | target 300 s | |")
    jobs_g = gavel_jobs()
    nodes, levels = gavel.philly_cluster()
    t = time.perf_counter()
    res = replay(nodes, jobs_g, load_profile("phalanx"), topology_levels=levels)
    print(
        f"| time replay, Gavel msr seed 0 ({len(jobs_g):,} jobs, 500 GPUs), phalanx | "
        f"{time.perf_counter() - t:.0f} s | target 60 s | {res.cycles:,} cycles |"
    )


def replays() -> None:
    from phalanx.cli.simulate import embedded_replay_cluster

    cases = []
    tj = tiresias.load_jobs(TRACES / "tiresias-samples" / "60_job.csv")
    n16, l16 = embedded_replay_cluster()
    cases.append(("Tiresias 60 jobs, 16 V100 (4 x 4, 2 racks)", n16, l16, tj))
    n64, l64 = tiresias.load_cluster(TRACES / "tiresias-samples" / "cluster_spec.csv")
    cases.append(("Tiresias 60 jobs, cluster_spec (64 GPUs)", n64, l64, tj))
    gn, gl = gavel.philly_cluster()
    cases.append(("Gavel msr seed 0, 15,264 jobs, 500 V100", gn, gl, gavel_jobs()))
    print(
        "| trace | profile | avg JCT (s) | median JCT (s) | p95 JCT (s) | avg wait (s) | makespan (s) "
        "| GPU alloc (%) | deadlocked | starved | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, nodes, levels, jobs in cases:
        for prof in ("phalanx", "fifo", "k8s-default"):
            t = time.perf_counter()
            s = replay(nodes, jobs, load_profile(prof), topology_levels=levels).summary()
            cells = [
                f"{s[k]:,.0f}" for k in ("avg_jct_s", "median_jct_s", "p95_jct_s", "avg_wait_s", "makespan_s")
            ]
            cells += [f"{s['gpu_alloc_pct']:.1f}", str(s["deadlocked"]), str(s["starved"])]
            print(
                f"| {name} | {prof} | " + " | ".join(cells) + f" | {time.perf_counter() - t:.0f} |",
                flush=True,
            )


def without(action: str) -> Profile:
    """phalanx-queues with one action removed (ablation)."""
    data = yaml.safe_load((package_files.files("phalanx.profiles") / "phalanx-queues.yaml").read_text())
    data["name"] = f"without {action}"
    data["actions"] = [a for a in data["actions"] if a["name"] != action]
    return compile_profile(data, f"phalanx-queues without {action}")


def tenancy_input(trace: str, limit: int, load: float) -> list[tuple[str, list, list, list[str]]]:
    """(label, jobs, nodes, topology levels) per replay; each job's queue is its tenant.

    gavel: the msr seed 0 trace on 500 V100 (Philly's shape), a queue per virtual cluster.
    pollux: the eight `workloads-realistic` files on the Pollux testbed (64 T4), a queue per
    application (cifar10, bert, ...): the trace has no users, so each model stands for a team.
    `load` < 1 spreads the arrivals over 1 / load of the time (a lighter load).
    """
    out = []
    if trace == "gavel":
        jobs = gavel_jobs()
        if limit:
            jobs = sorted(jobs, key=lambda j: j.submit)[:limit]
        nodes, levels = gavel.philly_cluster()
        out.append(("gavel msr seed 0", jobs, nodes, levels))
    else:
        nodes, levels = pollux.testbed_cluster()
        for f in sorted((TRACES / "pollux-workloads" / "workloads-realistic").glob("workload-*.csv")):
            jobs = [dataclasses.replace(j, queue=j.model) for j in pollux.load_jobs(f)]
            out.append((f"pollux {f.stem}", jobs, nodes, levels))
    if load != 1.0:
        for _, jobs, _, _ in out:
            t0 = min(j.submit for j in jobs)
            jobs[:] = [dataclasses.replace(j, submit=t0 + (j.submit - t0) / load) for j in jobs]
    return out


def progress_printer(label: str, every: float = 0.05) -> Callable[[int, int], None]:
    """A replay `progress` callback: one stderr line each `every` of the jobs finished (long replays)."""
    t0, step = time.perf_counter(), [1]

    def show(done: int, total: int) -> None:
        if total and done >= math.ceil(step[0] * every * total):
            while done >= math.ceil(step[0] * every * total):
                step[0] += 1
            took = time.perf_counter() - t0
            print(f"{label}: {done:,}/{total:,} jobs done, {took:,.0f} s", file=sys.stderr)

    return show


def tenancy(
    limit: int = 0,
    ablate: str = "",
    only: str = "",
    trace: str = "gavel",
    load: float = 1.0,
    progress: bool = False,
    checkpoints: float = 300.0,
) -> None:
    """Tenants as queues with equal deserved GPUs and no limits (see `tenancy_input`); each job
    checkpoints every `checkpoints` seconds of run (0: never, an eviction loses the whole run)."""
    inputs = tenancy_input(trace, limit, load)
    njobs = sum(len(j) for _, j, _, _ in inputs)
    gpus = sum(len(n.gpus) for n in inputs[0][2])
    every = f"checkpoints every {checkpoints:g} s" if checkpoints else "no checkpoints"
    print(
        f"{trace}: {len(inputs)} replay(s), {njobs:,} jobs, {gpus} GPUs, load {load:g}, a queue per tenant "
        f"with equal deserved GPUs, {every}; "
        "figures are means over the replays\n"
    )
    print(
        "| profile | avg JCT (s) | p95 JCT (s) | avg wait (s) | max wait 8+ GPU (s) | Jain | evictions "
        "| GPU-h lost | evictions/h steady / worst hour | +GPU-h at 60 s a restart | GPU-h lost, worst hour "
        "| GPU alloc (%) | starved | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    names = only.split(",") if only else ["phalanx-queues", "phalanx", "fifo", "las"]
    profiles = [without(a) for a in ablate.split(",") if a] or [load_profile(p) for p in names]
    keys = ("avg_jct_s", "p95_jct_s", "avg_wait_s", "max_wait_large_s", "jain_index", "evictions")
    keys += ("lost_gpu_h_preempt", "gpu_alloc_pct", "starved")
    keys += ("evictions_per_h_steady", "evictions_worst_hour", "evicted_gpus", "lost_gpu_h_worst_hour")
    for profile in profiles:
        t = time.perf_counter()
        sums = dict.fromkeys(keys, 0.0)
        for label, jobs, nodes, levels in inputs:
            vcs = sorted({j.queue for j in jobs})
            share = len(nodes[0].gpus) * len(nodes) * 1000 / len(vcs)
            tree = QueueTree(Queue(v, quotas={"gpu": ResourceQuota(share)}) for v in vcs)
            show = progress_printer(f"{profile.name} {label}") if progress else None
            s = replay(
                nodes, jobs, profile, topology_levels=levels, queues=tree, progress=show,
                checkpoint_interval=checkpoints,
            ).summary()  # fmt: skip
            for k in keys:
                v = float(s[k])
                sums[k] += 0.0 if math.isnan(v) else v / len(inputs)
        cells = [f"{sums[k]:,.0f}" for k in keys[:4]]
        cells += [
            f"{sums['jain_index']:.3f}",
            f"{sums['evictions']:,.0f}",
            f"{sums['lost_gpu_h_preempt']:,.0f}",
            f"{sums['evictions_per_h_steady']:.1f} / {sums['evictions_worst_hour']:.0f}",
            f"{sums['evicted_gpus'] * 60 / 3600:,.0f}",
            f"{sums['lost_gpu_h_worst_hour']:.2f}",
        ]
        cells += [f"{sums['gpu_alloc_pct']:.1f}", f"{sums['starved']:.0f}"]
        print(f"| {profile.name} | " + " | ".join(cells) + f" | {time.perf_counter() - t:.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["fidelity", "lists", "speed", "replay", "tenancy"])
    ap.add_argument("--limit", type=int, default=0, help="tenancy: only the first N jobs")
    ap.add_argument("--ablate", default="", help="tenancy: phalanx-queues without each of these actions")
    ap.add_argument("--profiles", default="", help="tenancy: only these profiles (comma-separated)")
    ap.add_argument("--trace", choices=["gavel", "pollux"], default="gavel", help="tenancy: which trace")
    ap.add_argument("--load", type=float, default=1.0, help="tenancy: arrival rate scale (< 1: lighter)")
    ap.add_argument("--progress", action="store_true", help="tenancy: a line on stderr every 5 %% of jobs")
    ap.add_argument(
        "--checkpoints", type=float, default=300.0, help="tenancy: seconds between checkpoints (0: none)"
    )
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--out", default="/tmp/phalanx-bench")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.what == "fidelity":
        fidelity(parse_seeds(args.seeds), out)
    elif args.what == "lists":
        lists(parse_seeds(args.seeds), out)
    elif args.what == "speed":
        speed()
    elif args.what == "tenancy":
        a = args
        tenancy(a.limit, a.ablate, a.profiles, a.trace, a.load, a.progress, a.checkpoints)
    else:
        replays()


if __name__ == "__main__":
    main()
