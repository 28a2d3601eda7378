"""Like-for-like replays against peers' simulators, and replay speed at scale (issue 11).

    python benchmarks/bench_fidelity.py tiresias [--tiresias-sim DIR]  # 60-job trace on 8 and 16 GPUs
    python benchmarks/bench_fidelity.py synergy                         # Synergy's two deployment traces
    python benchmarks/bench_fidelity.py gavel                           # Gavel's physical-cluster traces
    python benchmarks/bench_fidelity.py speed [--tiresias-sim DIR] [--jobs N]
    python benchmarks/bench_fidelity.py eta [--every N]                 # start forecasts vs real starts

Every replay runs with the runtime model off (a job runs exactly its trace duration) on a
count-only cluster, as the peers' simulators do. `--tiresias-sim` names a folder holding
Tiresias' simulator (github.com/SymbioticLab/Tiresias, `simulator/`, converted to Python 3 with
`python3 -m lib2to3 -w -n .` and `sys.maxint` replaced by `sys.maxsize`); it then runs in the
same process tree, on the same input, for a side-by-side figure and a speed ratio taken in
the same run. Results print as markdown tables (copied into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import csv
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from phalanx.core.model import Gpu, Node
from phalanx.profiles import load_profile
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import replay
from phalanx.sim.runtime import RuntimeModel, load_runtime
from phalanx.sim.traces import gavel, generic, tiresias

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
OFF = RuntimeModel(load_runtime(None, {"spread": True, "cache": True, "sharing": True}))
# ours -> Tiresias' simulator's name for the same policy
TIRESIAS = {"fifo": "fifo", "fifo-fit": "fjf", "srtf-exact": "shortest", "las-exact": "dlas-gpu"}


def cluster(nodes: int, per_node: int) -> list[Node]:
    return [
        Node(f"n{i}", 128_000, 256 * 1024, tuple(Gpu(g, "V100", 16_384) for g in range(per_node)))
        for i in range(nodes)
    ]


def ours(jobs: list[JobSpec], nodes: int, per_node: int, profile: str) -> tuple[float, float]:
    """(average JCT in s, wall seconds)."""
    t = time.perf_counter()
    res = replay(cluster(nodes, per_node), jobs, load_profile(profile), runtime=OFF)
    wall = time.perf_counter() - t
    return float(res.summary()["avg_jct_s"]), wall


def theirs(sim: Path, trace: Path, nodes: int, per_node: int, schedule: str) -> tuple[float, float]:
    """Tiresias' simulator, `--scheme=count`: (average JCT in s, wall seconds)."""
    with tempfile.TemporaryDirectory() as d:
        spec = Path(d) / "spec.csv"
        spec.write_text(
            f"num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n1,{nodes},{per_node},64,256\n"
        )
        args = [sys.executable, "run_sim.py", f"--cluster_spec={spec}", "--scheme=count"]
        args += [f"--trace_file={trace.resolve()}", f"--schedule={schedule}", f"--log_path={d}/log"]
        t = time.perf_counter()
        subprocess.run(args, cwd=sim, check=True, capture_output=True)
        wall = time.perf_counter() - t
        with open(f"{d}/log/job.csv") as f:
            jct = [float(r["JCT"]) for r in csv.DictReader(f)]
    return sum(jct) / len(jct), wall


def tiresias_table(sim: Path | None) -> None:
    trace = TRACES / "tiresias-samples" / "60_job.csv"
    jobs = tiresias.load_jobs(trace)
    print("| GPUs | policy (ours / Tiresias' simulator) | ours avg JCT (s) | theirs avg JCT (s) | delta |")
    print("|---|---|---|---|---|")
    for nodes in (2, 4):
        for prof, name in TIRESIAS.items():
            a, _ = ours(jobs, nodes, 4, prof)
            b = theirs(sim, trace, nodes, 4, name)[0] if sim else float("nan")
            print(f"| {nodes * 4} | {prof} / {name} | {a:,.2f} | {b:,.2f} | {100 * (a - b) / b:+.2f} % |")


def synergy_table() -> None:
    """Our FIFO beside Synergy's FIFO (fair CPU/memory shares) on its 32-GPU deployment cluster."""
    print("| trace | ours fifo avg JCT (s) | Synergy FIFO avg JCT (s) | delta | FIFO in 300 s rounds (s) |")
    print("|---|---|---|---|---|")
    d = TRACES / "synergy" / "derived"
    for name in ("static100", "dynamic_srtf"):
        jobs = tiresias.load_jobs(d / f"synergy_{name}_as_tiresias.csv")
        a, _ = ours(jobs, 4, 8, "fifo")
        with (d / f"synergy_{name}_fifo_fair_jobs.csv").open() as f:
            jct = [float(r["jct_s"]) for r in csv.DictReader(f)]
        b = sum(jct) / len(jct)
        r = rounds_fifo(d / f"synergy_{name}_fifo_fair_jobs.csv")
        print(f"| {name} | {a:,.1f} | {b:,.1f} | {100 * (a - b) / b:+.2f} % | {r:,.1f} |")


def rounds_fifo(path: Path, gpus: int = 32, lease: float = 300.0) -> float:
    """Strict FIFO in rounds of `lease` seconds, as Synergy schedules: a job starts at a round
    boundary and gives its GPU back at the first boundary after its work is done. The average JCT,
    to show that the rounds account for the gap to our event-driven replay."""
    with path.open() as f:
        rows = sorted(
            (float(r["submit_time"]), int(r["job_id"]), float(r["fair_share_duration_s"]))
            for r in csv.DictReader(f)
        )
    origin = math.floor(rows[0][0]) + 1  # Synergy's first round: the second after the first arrival
    t, queue, running, jct = float(origin), list(rows), [], []
    while queue or running:
        running = [e for e in running if e > t]
        while queue and queue[0][0] <= t and len(running) < gpus:
            submit, _, dur = queue.pop(0)
            end = origin + math.ceil((t + dur - origin) / lease) * lease
            running.append(end)
            jct.append(end - submit)
        t += lease
    return sum(jct) / len(jct)


def gavel_table() -> None:
    print("| trace | jobs | GPUs | " + " | ".join(f"{p} avg JCT (s)" for p in TIRESIAS) + " |")
    print("|---|---|---|" + "---|" * len(TIRESIAS))
    d = TRACES / "gavel-traces" / "derived"
    for name in ("max_min_fairness", "minimize_makespan", "artifact_evaluation"):
        jobs = tiresias.load_jobs(d / f"gavel_{name}_as_tiresias.csv")
        cells = [f"{ours(jobs, 8, 4, p)[0]:,.0f}" for p in TIRESIAS]
        print(f"| {name} | {len(jobs)} | 32 | " + " | ".join(cells) + " |")


def tiled_tiresias(copies: int, folder: Path) -> Path:
    """The 60-job trace repeated `copies` times, each copy arriving after the last one's arrivals."""
    with (TRACES / "tiresias-samples" / "60_job.csv").open() as f:
        rows = list(csv.DictReader(f))
    period = max(int(r["submit_time"]) for r in rows) + int(rows[-1]["interval"])
    out = folder / f"tiresias_{copies * len(rows)}.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for c in range(copies):
            for r in rows:
                w.writerow(
                    {
                        **r,
                        "job_id": c * len(rows) + int(r["job_id"]),
                        "submit_time": int(r["submit_time"]) + c * period,
                    }
                )
    return out


def philly_style(n: int, folder: Path) -> Path:
    """Gavel's 15 Philly-derived VC streams (seed 0, V100 durations) back to back until `n` jobs, as a
    generic CSV: each repetition starts an hour after the previous one's last arrival."""
    d = TRACES / "gavel-traces"
    tput = gavel.load_throughputs(d / "simulation_throughputs.json")
    files = sorted((d / "msr" / "seed=0").glob("*.trace"))
    jobs = sorted((j for f in files for j in gavel.load_trace(f, tput)), key=lambda j: (j.submit, j.name))
    span = jobs[-1].submit - jobs[0].submit + 3600
    out = folder / f"philly_{n}.csv"
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "submit", "duration", "gpus"])
        for k in range(n):
            j = jobs[k % len(jobs)]
            w.writerow(
                [
                    f"r{k // len(jobs)}-{j.name}",
                    round(j.submit + (k // len(jobs)) * span, 3),
                    round(j.duration, 3),
                    j.gpus,
                ]
            )
    return out


def speed(sim: Path | None, n_philly: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        tiled = tiled_tiresias(100, folder)
        jobs = tiresias.load_jobs(tiled)
        print("Tiled Tiresias trace, 6,000 jobs, 32 x 4 GPUs (count-only), runtime model off:\n")
        print("| policy (ours / Tiresias') | ours (s) | theirs (s) | ours faster by |")
        print("|---|---|---|---|")
        for prof, name in TIRESIAS.items():
            _, a = ours(jobs, 32, 4, prof)
            b = theirs(sim, tiled, 32, 4, name)[1] if sim else float("nan")
            print(f"| {prof} / {name} | {a:.2f} | {b:.2f} | {b / a:.1f}x |")
        philly = philly_style(n_philly, folder)
        pj = generic.load_jobs(
            philly, {"submit": "submit", "duration": "duration", "gpus": "gpus", "name": "name"}
        )
        print(f"\nPhilly-style trace, {len(pj):,} jobs (generic CSV), 64 x 8 GPUs, runtime model off:\n")
        print("| profile | wall (s) | ms per job |")
        print("|---|---|---|")
        for prof in ("fifo", "phalanx"):
            _, a = ours(pj, 64, 8, prof)
            print(f"| {prof} | {a:.1f} | {1000 * a / len(pj):.3f} |")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS of this process: {rss:.0f} MiB")


def eta(every: int) -> None:
    """Forecast at arrival against the real start, with the runtime model on (as a user would run it)."""
    from phalanx.cli.simulate import embedded_replay_cluster

    n16, l16 = embedded_replay_cluster()
    tj = tiresias.load_jobs(TRACES / "tiresias-samples" / "60_job.csv")
    d = TRACES / "gavel-traces"
    tput = gavel.load_throughputs(d / "simulation_throughputs.json")
    gj = [j for f in sorted((d / "msr" / "seed=0").glob("*.trace")) for j in gavel.load_trace(f, tput)]
    gn, gl = gavel.philly_cluster()
    print(
        "| trace | profile | jobs forecast | no time | median abs error (s) | mean abs error (s) | bias (s) "
        "| avg wait (s) | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, nodes, levels, jobs, n in (
        ("Tiresias 60 jobs, 16 V100", n16, l16, tj, 1),
        ("Gavel msr seed 0, 15,264 jobs, 500 V100", gn, gl, gj, every),
    ):
        for prof in ("phalanx", "fifo", "las"):
            t = time.perf_counter()
            res = replay(nodes, jobs, load_profile(prof), topology_levels=levels, eta_every=n)
            s = res.summary()
            cells = [f"{s['eta_forecasts']:,}", f"{s['eta_no_time']:,}", f"{s['eta_median_abs_s']:,.0f}"]
            cells += [f"{s['eta_mae_s']:,.0f}", f"{s['eta_bias_s']:+,.0f}", f"{s['avg_wait_s']:,.0f}"]
            print(
                f"| {name} | {prof} | " + " | ".join(cells) + f" | {time.perf_counter() - t:.0f} |",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["tiresias", "synergy", "gavel", "speed", "eta"])
    ap.add_argument("--every", type=int, default=50, help="eta: forecast every n-th waiting arrival (Gavel)")
    ap.add_argument("--tiresias-sim", type=Path, default=None, help="Tiresias' simulator folder (Python 3)")
    ap.add_argument("--jobs", type=int, default=82_000, help="jobs of the Philly-style trace")
    a = ap.parse_args()
    if a.what == "tiresias":
        tiresias_table(a.tiresias_sim)
    elif a.what == "synergy":
        synergy_table()
    elif a.what == "gavel":
        gavel_table()
    elif a.what == "eta":
        eta(a.every)
    else:
        speed(a.tiresias_sim, a.jobs)


if __name__ == "__main__":
    main()
