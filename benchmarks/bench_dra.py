"""DRA claims in the core: claims allocated per second, and the cost against the same pods without DRA.

1,000 nodes, each publishing 8 GPUs (NVIDIA's GPU driver shape) and 8 RDMA NICs (DraNet's),
one GPU and one NIC per PCIe root. 4,000 single-pod workloads, each with one claim: one GPU
whose product is an H100 (a CEL selector) and one NIC on the same PCIe root (matchAttribute).
The same pods without DRA ask for one whole GPU and one NIC on its PCIe switch on the same
nodes described without DRA. One `phalanx` cycle each, in a fresh process.

    python benchmarks/bench_dra.py [--nodes 1000] [--pods 4000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from dra_objects import GPU_CLASS, NIC_CLASS, ROOT, claim, gpu, nic, request
from phalanx.core.cycle import run_cycle
from phalanx.core.dra import ClaimConstraint
from phalanx.core.drafit import footprint
from phalanx.core.model import Gpu, GpuRequest, Nic, Node, PodSet, TaskRequest, Workload
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile

H100 = "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')"


def nodes(n: int, dra: bool) -> list[Node]:
    out = []
    for i in range(n):
        name = f"node-{i:05d}"
        gpus = tuple(Gpu(k, "H100", 81920, numa=k // 4, pcie_switch=k) for k in range(8))
        nics = tuple(Nic(k, numa=k // 4, pcie_switch=k) for k in range(8))
        devs = tuple([gpu(name, k, k) for k in range(8)] + [nic(name, k, k) for k in range(8)]) if dra else ()
        out.append(Node(name, 128_000, 1024 * 1024, gpus, nics, dra=devs))
    return out


def workloads(n: int, dra: bool, devices: list) -> list[Workload]:
    out = []
    for k in range(n):
        if dra:
            c = claim(
                f"ns/claim-{k}",
                request("gpu", (*GPU_CLASS, H100)),
                request("nic", NIC_CLASS, cls="dranet"),
                constraints=(ClaimConstraint(("gpu", "nic"), match_attribute=ROOT),),
            )
            g, nics = footprint((c,), devices, None)
            req = TaskRequest(cpu_milli=1000, memory_mib=1024, gpu=g, rdma_nics=nics, claims=(c,))
        else:
            req = TaskRequest(
                cpu_milli=1000, memory_mib=1024, gpu=GpuRequest.whole(1), rdma_nics=1, nic_same_pcie=True
            )
        out.append(Workload(f"ns/w-{k}", (PodSet("p", 1, req, (f"ns/pod-{k}",)),), creation_time=float(k)))
    return out


def run(n_nodes: int, n_pods: int, dra: bool, q: mp.Queue) -> None:
    ns = nodes(n_nodes, dra)
    devices = [d for x in ns[:1] for d in x.dra]
    t = time.perf_counter()
    snap = Snapshot(ns, workloads(n_pods, dra, devices))
    build = time.perf_counter() - t
    t = time.perf_counter()
    result = run_cycle(snap, load_profile("phalanx"), 0.0, np.random.default_rng(0), apply=True)
    cycle = time.perf_counter() - t
    ok = all(len(b.claims) == 1 for b in result.binds) if dra else True
    q.put(
        {
            "dra": dra,
            "binds": len(result.binds),
            "cycle_s": cycle,
            "build_s": build,
            "ok": ok,
            "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=4000)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    rows = []
    for dra in (False, True):
        q: mp.Queue = ctx.Queue()
        p = ctx.Process(target=run, args=(a.nodes, a.pods, dra, q))
        p.start()
        rows.append(q.get())
        p.join()
    print(f"{a.nodes} nodes x (8 GPUs + 8 NICs), {a.pods} single-pod workloads, one `phalanx` cycle")
    print("| pods ask through | placed | cycle (s) | pods (claims) per s | peak RSS (MiB) |")
    print("|---|---|---|---|---|")
    for r in rows:
        what = "DRA claims (selector, same-root constraint)" if r["dra"] else "whole GPU + NIC on its switch"
        rate = r["binds"] / r["cycle_s"]
        print(f"| {what} | {r['binds']:,} | {r['cycle_s']:.2f} | {rate:,.0f} | {r['rss']:,.0f} |")
    ratio = rows[1]["cycle_s"] / rows[0]["cycle_s"]
    print(f"DRA cycle / plain cycle: {ratio:.2f}x; every DRA bind carries its claim: {rows[1]['ok']}")


if __name__ == "__main__":
    main()
