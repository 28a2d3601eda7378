"""Scheduling shards on a real kube-apiserver: one scheduler against 2 and 4 shards, same cluster.

Each run: a fresh control plane, N nodes of 8 GPUs labelled `phalanx.io/node-pool=p<i mod K>`,
`--running R` one-GPU pods bound on each (ours, labelled with their node's pool), then the
scheduler(s): K=1 is Phalanx as it runs today (no shards, the baseline); K>1 is K processes, one per
shard, each with `--shards FILE --shard s<j>` owning pool p<j>. After a warm-up pod per pool is
bound, one-GPU pods (each naming a pool in turn) arrive at --rate a second for --seconds. Per
scheduler process: its cycles and their mean phases (from its /metrics), its CPU seconds over the
arrivals (/proc/PID/stat), its peak RSS; and create->bind p50/p99 over every arrival.

    PHALANX_K8S_ASSETS=... python benchmarks/bench_shards.py [--nodes 10000 --shards 1,2,4 --rate 20]

All processes (API server, etcd, every shard) share this machine's cores: on 2 cores, K shards
compete with each other and with the API server, so the per-shard figures (CPU per cycle, RSS) are
the ones that carry over to a cluster where each shard has its own node; wall-clock latency does not.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_bind import BindCounter, pct, phase_sums, rss_peak_mib, start_phalanx
from phalanx.k8s.client.api import Api
from phalanx.k8s.client.kinds import PODS
from phalanx.k8s.lab.localcluster import ControlPlane, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kube_objects import node, pod

POOL = "phalanx.io/node-pool"


def populate(api: Api, nodes: int, pools: int, per_node: int) -> None:
    """Nodes labelled by pool, and `per_node` one-GPU pods of ours running on each."""
    with ThreadPoolExecutor(32) as ex:

        def mk_node(k: int) -> None:
            n = node(f"n{k:05d}", gpus=8, cpu="128", mem="1Ti", labels={POOL: f"p{k % pools}"})
            api.create("nodes", n)

        list(ex.map(mk_node, range(nodes)))

        def mk_pod(k: int) -> None:
            at = k % nodes
            p = pod(
                f"r{k:06d}", gpus=1, cpu="1", mem="1Gi", node=f"n{at:05d}", labels={POOL: f"p{at % pools}"}
            )
            p["metadata"].pop("uid")
            api.create(PODS, p, "default")

        list(ex.map(mk_pod, range(nodes * per_node)))


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(nodes: int, shards: int, per_node: int, rate: float, seconds: float) -> dict[str, Any]:
    arrivals = int(rate * seconds)
    with ControlPlane(controller_manager=False) as cp, tempfile.TemporaryDirectory() as tmp:
        api = Api.connect(kubeconfig=str(cp.kubeconfig))
        t = time.monotonic()
        populate(api, nodes, shards, per_node)
        made = time.monotonic() - t
        counter = BindCounter(api, arrivals + shards)
        counter.start()
        procs = []
        if shards == 1:
            port = free_port()
            procs.append((port, start_phalanx(cp, port, ("--insecure-metrics",))))
        else:
            f = Path(tmp) / "shards.yaml"
            doc = {"shards": [{"name": f"s{j}", "pools": [f"p{j}"]} for j in range(shards)]}
            f.write_text(yaml.safe_dump(doc))
            for j in range(shards):
                port = free_port()
                extra = ("--insecure-metrics", "--shards", str(f), "--shard", f"s{j}")
                procs.append((port, start_phalanx(cp, port, extra)))
        for j in range(shards):
            w = pod(f"warm-{j}", gpus=1, labels={POOL: f"p{j}"})
            w["metadata"].pop("uid")
            api.create(PODS, w, "default")
        deadline = time.monotonic() + 900
        while any(f"warm-{j}" not in counter.at for j in range(shards)) and time.monotonic() < deadline:
            time.sleep(0.05)
        ready = time.monotonic() - t - made
        before = [(phase_sums(port), cpu_seconds(p.pid)) for port, p in procs]
        sent: dict[str, float] = {}
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as ex:
            for k in range(arrivals):
                time.sleep(max(0.0, t0 + k / rate - time.monotonic()))
                p = pod(f"a{k:05d}", gpus=1, cpu="1", mem="1Gi", labels={POOL: f"p{k % shards}"})
                p["metadata"].pop("uid")
                sent[p["metadata"]["name"]] = time.monotonic()
                ex.submit(api.create, PODS, p, "default")
        counter.wait(120)
        lat = [counter.at[n] - s for n, s in sent.items() if n in counter.at]
        per: list[dict[str, Any]] = []
        for (port, p), (ph0, cpu0) in zip(procs, before, strict=True):
            ph = phase_sums(port)
            cycles = ph.get("read", (0.0, 0.0))[1] - ph0.get("read", (0.0, 0.0))[1]
            per.append(
                {
                    "cycles": cycles,
                    "cycle_ms": sum(1000 * (ph[k][0] - ph0.get(k, (0.0, 0.0))[0]) for k in ph)
                    / max(cycles, 1),
                    "cpu_s": cpu_seconds(p.pid) - cpu0,
                    "rss_mib": rss_peak_mib(p.pid),
                }
            )
            p.terminate()
            p.wait(timeout=30)
        api.close()
    return {
        "shards": shards,
        "bound": len(lat),
        "arrived": arrivals,
        "p50": pct(lat, 0.5),
        "p99": pct(lat, 0.99),
        "made_s": made,
        "ready_s": ready,
        "per": per,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--running", type=int, default=4, help="one-GPU pods already running per node")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    print(f"{a.nodes} nodes, {a.running} running a node, one-GPU pods at {a.rate:g}/s for {a.seconds:g} s")
    head = f"{'shards':>6} {'bound':>9} {'p50 s':>7} {'p99 s':>7}"
    print(head + "  per scheduler: cycles, ms/cycle, CPU s, peak RSS MiB")
    for k in (int(x) for x in a.shards.split(",")):
        r = run(a.nodes, k, a.running, a.rate, a.seconds)
        each = "; ".join(
            f"{x['cycles']:.0f}, {x['cycle_ms']:.1f}, {x['cpu_s']:.1f}, {x['rss_mib']:.0f}" for x in r["per"]
        )
        print(
            f"{k:>6} {r['bound']:>4}/{r['arrived']:<4} {r['p50']:>7.3f} {r['p99']:>7.3f}  {each}"
            f"  (populated in {r['made_s']:.0f} s, first binds {r['ready_s']:.0f} s later)",
            flush=True,
        )


if __name__ == "__main__":
    main()
