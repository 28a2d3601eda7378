"""The FGD protocol with a budget of moves (issue 12, goal 3): allocation against budget.

    python benchmarks/bench_moves.py [--budgets 0,0.01,0.02] [--seeds 42-44] [--movable share,all]

Each run submits the openb `default` list as the FGD protocol does (tune 1.3), but a pod that
does not fit may have `consolidate` move running pods marked movable (`share`: pods that share a
GPU, the inference pods of the trace; `ls`: QoS LS, latency-sensitive services; `all`: every
pod), while moves so far stay within budget x pods placed so far.

Besides the curve, each budget-0 run reports a bound on what any repacking of the shares could
give: the GPUs that hold shares at x = 130, against the bins first-fit-decreasing needs for
the same shares (ignoring CPU, memory and GPU models, so the true figure is lower).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from pathlib import Path

from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile
from phalanx.sim.bench import parse_seeds
from phalanx.sim.fgd import run_fgd
from phalanx.sim.traces import openb
from phalanx.sim.traces.openb import OpenbPod

OPENB = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-gpu-v2023-openb" / "csv"
RULES = {
    "share": lambda p: p.shares_gpu,
    "ls": lambda p: p.qos == "LS",
    "all": lambda p: True,
}


def repack_bound(s: Snapshot) -> tuple[int, int]:
    """(GPUs holding shares, bins first-fit-decreasing packs the same shares into)."""
    shares: list[int] = []
    held: set[tuple[int, int]] = set()
    for a in s.allocations.values():
        d = a.devices
        if not d.whole and d.mig is None and d.gpus:
            shares.append(d.milli)
            held.add((a.node, d.gpus[0]))
    bins: list[int] = []
    for m in sorted(shares, reverse=True):
        for k, used in enumerate(bins):
            if used + m <= 1000:
                bins[k] += m
                break
        else:
            bins.append(m)
    return len(held), len(bins)


def one(args: tuple[float, str, int, str]) -> dict[str, object]:
    budget, rule, seed, pods_file = args
    nodes = openb.load_nodes(OPENB / "openb_node_list_gpu_node.csv")
    pods: list[OpenbPod] = openb.load_pods(OPENB / pods_file)
    bound: list[tuple[int, int]] = []
    t = time.perf_counter()
    run = run_fgd(
        nodes,
        pods,
        load_profile("phalanx"),
        seed=seed,
        moves=budget,
        movable=RULES[rule],
        at_end=lambda s: bound.append(repack_bound(s)),
    )
    alloc, _, _ = run.discrete()
    placed = run.submitted - run.failed
    return {
        "budget": budget,
        "rule": rule,
        "seed": seed,
        "a100": alloc[100],
        "a130": alloc[130],
        "moves": run.moves,
        "placed": placed,
        "held": bound[0][0],
        "ffd": bound[0][1],
        "wall": time.perf_counter() - t,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="0,0.01,0.02")
    ap.add_argument("--seeds", default="42-44")
    ap.add_argument("--movable", default="share,all", help=f"rules, of {', '.join(RULES)}")
    ap.add_argument("--pods", default="openb_pod_list_default.csv")
    ap.add_argument("--procs", type=int, default=2)
    args = ap.parse_args()
    rules = [r for r in args.movable.split(",") if r]
    for r in rules:
        if r not in RULES:
            raise SystemExit(f"--movable: unknown rule {r!r} (known: {', '.join(RULES)})")
    budgets = [float(b) for b in args.budgets.split(",")]
    seeds = parse_seeds(args.seeds)
    jobs = [(b, r, s, args.pods) for r in rules for b in budgets if b > 0 or r == rules[0] for s in seeds]
    t = time.perf_counter()
    with mp.get_context("fork").Pool(args.procs) as pool:
        rows = pool.map(one, jobs)
    print(f"<!-- {len(jobs)} runs in {time.perf_counter() - t:.0f} s, seeds {args.seeds} -->")
    print("| movable | budget | alloc x=100 (%) | alloc x=130 (%) | moves | moves / placed (%) | wall (s) |")
    print("|---|---|---|---|---|---|---|")
    for r in rules:
        for b in budgets:
            sel = [x for x in rows if x["budget"] == b and (x["rule"] == r or b == 0)]
            if not sel or (b == 0 and r != rules[0]):
                continue

            def mean(k: str, sel: list[dict[str, object]] = sel) -> float:
                return sum(float(x[k]) for x in sel) / len(sel)  # type: ignore[arg-type]

            print(
                f"| {r if b else '-'} | {b:.1%} | {mean('a100'):.2f} | {mean('a130'):.2f} "
                f"| {mean('moves'):.1f} | {100 * mean('moves') / mean('placed'):.2f} | {mean('wall'):.0f} |"
            )
    base = [x for x in rows if x["budget"] == 0]
    for x in base:
        print(
            f"<!-- seed {x['seed']}: {x['held']} GPUs hold shares at the end; first-fit-decreasing "
            f"packs them into {x['ffd']} (at most {int(x['held']) - int(x['ffd'])} whole GPUs to gain) -->"
        )


if __name__ == "__main__":
    main()
