"""A backlog that only waits: what the scheduler spends while nothing changes (issue 34).

A fresh control plane (etcd, kube-apiserver), N nodes of 8 GPUs each running 4 one-GPU pods, and
W pods of 8 GPUs that wait for a whole node (none is free). Phalanx (`phalanx scheduler`, the
default profile) is started, and once it has looked at every waiting pod, nothing changes for
--seconds: the cycles it ran, the cycles it skipped, and the CPU seconds its process used then
(utime + stime from /proc). Before the core's wake-up the loop cycled every `cycle_seconds`
while anything waited; now work that waits for capacity waits for a change (or the 30 s recheck).

    PHALANX_K8S_ASSETS=... python benchmarks/bench_backlog.py [--nodes 1000 --waiting 200 --seconds 60]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx

from phalanx.k8s.client.api import Api
from phalanx.k8s.client.kinds import PODS
from phalanx.k8s.lab.localcluster import ControlPlane, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import bench_bind as bb
from kube_objects import pod


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def counter(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def pending_seen(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    found = re.findall(r"^phalanx_pending_workloads(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    return sum(float(v) for v in found)


def run(nodes: int, waiting: int, seconds: float) -> dict[str, float]:
    with ControlPlane(controller_manager=False) as cp:
        api = Api.connect(kubeconfig=str(cp.kubeconfig))
        bb.populate(api, nodes, 0)
        bb.running_pods(api, nodes, 4, "phalanx")
        with ThreadPoolExecutor(16) as ex:
            for k in range(waiting):
                p = pod(f"w{k:05d}", gpus=8, scheduler="phalanx")
                p["metadata"].pop("uid")
                ex.submit(api.create, PODS, p, "default")
        port = free_port()
        proc = bb.start_phalanx(cp, port, ("--insecure-metrics",))
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    if pending_seen(port) >= waiting:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            time.sleep(2.0)  # the cycles that follow the first look (assumed binds, explanations)
            ran0 = bb.phase_sums(port).get("read", (0.0, 0.0))[1]
            skipped0 = counter(port, "phalanx_cycles_skipped_total")
            cpu0 = cpu_seconds(proc.pid)
            time.sleep(seconds)
            ran = bb.phase_sums(port).get("read", (0.0, 0.0))[1] - ran0
            skipped = counter(port, "phalanx_cycles_skipped_total") - skipped0
            cpu = cpu_seconds(proc.pid) - cpu0
            return {"cycles": ran, "skipped": skipped, "cpu_s": cpu, "rss": bb.rss_peak_mib(proc.pid)}
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            api.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--waiting", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60.0)
    a = ap.parse_args()
    if not os.environ.get("PHALANX_K8S_ASSETS"):
        raise SystemExit("set PHALANX_K8S_ASSETS to the folder of the Kubernetes binaries")
    r = run(a.nodes, a.waiting, a.seconds)
    print(
        f"{a.nodes} nodes, {a.nodes * 4} running, {a.waiting} waiting, {a.seconds:g} s with no change: "
        f"{r['cycles']:.0f} cycles run, {r['skipped']:.0f} skipped, {r['cpu_s']:.2f} CPU s "
        f"({100 * r['cpu_s'] / a.seconds:.1f} % of a core); peak RSS {r['rss']:.0f} MiB"
    )


if __name__ == "__main__":
    main()
