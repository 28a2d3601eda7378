"""Multi-level gangs: the cost of one allocate pass with subgroups against the same tasks as flat gangs.

512 nodes x 8 H100 in 64 racks of 8 nodes and 8 spines of 64; N disaggregated servers, each a
prefill group (2 tasks x 8 GPUs, one rack) and a decode group (4 tasks x 4 GPUs, one rack), the
server in one spine. `flat`: the same tasks, one gang per server kept in one spine (no levels).
One cycle of the phalanx profile, all servers pending; best of `--repeat` runs. `--busy F`: a
fraction F of the nodes already has 4 of its 8 GPUs taken by other pods (seeded), so that racks
are uneven and a flat gang may straddle them.

    python benchmarks/bench_subgroups.py [--servers 150] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from phalanx.core.cycle import run_cycle
from phalanx.core.model import (
    Gpu,
    GpuRequest,
    Node,
    PodSet,
    SubGroup,
    TaskRequest,
    TopologyConstraint,
    Workload,
)
from phalanx.core.snapshot import ForeignUsage, Snapshot
from phalanx.profiles import load_profile

SPINE = TopologyConstraint("spine", True)
RACK = TopologyConstraint("rack", True)


def nodes() -> list[Node]:
    return [
        Node(
            f"n{i:03d}",
            128_000,
            2 * 1024 * 1024,
            tuple(Gpu(j, "H100", 81920, pcie_switch=j // 2) for j in range(8)),
            topology={"spine": f"s{i // 64}", "rack": f"r{i // 8}"},
        )
        for i in range(512)
    ]


def servers(n: int, levels: bool) -> list[Workload]:
    prefill = PodSet("prefill", 2, TaskRequest(32_000, 256 * 1024, GpuRequest.whole(8)))
    decode = PodSet("decode", 4, TaskRequest(16_000, 128 * 1024, GpuRequest.whole(4)))
    subs = (SubGroup("prefill", ("prefill",), 2, RACK), SubGroup("decode", ("decode",), 4, RACK))
    return [
        Workload(
            f"srv-{k:04d}",
            (prefill, decode),
            creation_time=float(k),
            topology=SPINE,
            subgroups=subs if levels else (),
        )
        for k in range(n)
    ]


def one(levels: bool, n: int, busy: float) -> tuple[float, int, int, int]:
    """(seconds, servers placed, pods bound, servers with each group inside one rack)."""
    ns = nodes()
    snap = Snapshot(ns, servers(n, levels), topology_levels=["spine", "rack"])
    rng = np.random.default_rng(1)
    for node in ns:
        if rng.random() < busy:
            snap.add_foreign(ForeignUsage(node.name, 0, 0, (0, 1, 2, 3), 1000, f"other/{node.name}"))
    t = time.perf_counter()
    r = run_cycle(snap, load_profile("phalanx"), 0.0, np.random.default_rng(0))
    seconds = time.perf_counter() - t
    racks: dict[tuple[str, str], set[str]] = {}
    for b in r.binds:
        group = "prefill" if "/prefill-" in b.task else "decode"
        racks.setdefault((b.workload, group), set()).add(
            next(x for x in ns if x.name == b.node).topology["rack"]
        )
    placed = {w for w, _ in racks}
    whole = sum(1 for w in placed if all(len(racks[(w, g)]) == 1 for g in ("prefill", "decode")))
    return seconds, len(placed), len(r.binds), whole


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", type=int, default=150)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--busy", type=float, default=0.0)
    a = ap.parse_args()
    for name, levels in (("flat", False), ("subgroups", True)):
        runs = [one(levels, a.servers, a.busy) for _ in range(a.repeat)]
        best = min(r[0] for r in runs)
        _, placed, binds, whole = runs[0]
        print(
            f"{name:10s} {a.servers} servers: {placed} placed ({binds} pods), {whole} with each group in "
            f"one rack, in {best:.3f} s (best of {a.repeat})"
        )


if __name__ == "__main__":
    main()
