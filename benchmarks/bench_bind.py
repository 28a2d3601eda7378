"""Binding throughput on a real kube-apiserver: Phalanx against kube-scheduler, same machine, same input.

Each run: a fresh control plane (etcd, kube-apiserver; no controller-manager), N nodes of 8
GPUs, P one-GPU pods created first, then the scheduler is started and timed until every pod
is bound (counted from a watch in this process). kube-scheduler runs with its default client
QPS (50) and with a raised one; Phalanx runs as its own process (`phalanx scheduler`).

    PHALANX_K8S_ASSETS=... python benchmarks/bench_bind.py compare [--nodes 1000 --pods 4000]
    PHALANX_K8S_ASSETS=... python benchmarks/bench_bind.py scale   [--nodes 5000 --pods 20000]
    PHALANX_K8S_ASSETS=... python benchmarks/bench_bind.py kill    [--nodes 1000 --pods 4000]

`scale` reports Phalanx's cycle times (from its /metrics), its peak memory and the end-to-end
time. `kill` sends SIGKILL to Phalanx in the middle of a burst with gangs in it, starts it
again, and checks that every gang ends whole, every pod bound once, and no GPU given twice.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from phalanx.k8s.api import Api
from phalanx.k8s.kinds import PODS
from phalanx.k8s.localcluster import ControlPlane, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kube_objects import node, pod


def populate(api: Api, nodes: int, pods: int, gang: int = 1, gangs: int = 0) -> None:
    """Nodes, then pods (`gangs` gangs of `gang` pods among them, by phalanx.io/pod-group)."""
    with ThreadPoolExecutor(32) as ex:
        list(
            ex.map(
                lambda k: api.create("nodes", node(f"n{k:05d}", gpus=8, cpu="128", mem="1Ti")), range(nodes)
            )
        )

        def make(k: int) -> None:
            notes = {"phalanx.io/pod-group": f"g{k // gang}"} if k < gangs * gang else {}
            p = pod(f"p{k:05d}", gpus=1, cpu="1", mem="1Gi", annotations=notes)
            p["metadata"].pop("uid")
            api.create(PODS, p, "default")

        list(ex.map(make, range(pods)))


def as_kube_scheduler(api: Api, pods: int) -> None:
    """The same pods for kube-scheduler: same requests, schedulerName default-scheduler."""
    with ThreadPoolExecutor(32) as ex:

        def make(k: int) -> None:
            p = pod(f"p{k:05d}", gpus=1, cpu="1", mem="1Gi", scheduler="default-scheduler")
            p["metadata"].pop("uid")
            api.create(PODS, p, "default")

        list(ex.map(make, range(pods)))


class BindCounter(threading.Thread):
    """Counts pods with spec.nodeName from a watch: the time of the first and of the last bind."""

    def __init__(self, api: Api, want: int) -> None:
        super().__init__(daemon=True)
        self.api, self.want = api, want
        self.bound: dict[str, str] = {}
        self.first = self.last = 0.0
        self.done = threading.Event()
        _, self.rv = api.list(PODS)

    def run(self) -> None:
        while not self.done.is_set():
            for typ, obj in self.api.watch(PODS, self.rv, timeout_s=600):
                self.rv = obj["metadata"].get("resourceVersion", self.rv)
                name = obj["metadata"].get("name", "")
                node_name = (obj.get("spec") or {}).get("nodeName")
                if typ != "DELETED" and node_name and name not in self.bound:
                    self.bound[name] = node_name
                    now = time.monotonic()
                    self.first = self.first or now
                    self.last = now
                    if len(self.bound) >= self.want:
                        self.done.set()
                        return

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)


def rss_peak_mib(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    m = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else 0.0


def start_phalanx(cp: ControlPlane, port: int, extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    log = open(cp.dir / "logs" / "phalanx.log", "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli.main", "scheduler", "--kubeconfig", str(cp.kubeconfig),
         "--no-leader-elect", "--profile", "phalanx", "--port", str(port), *extra],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def run_one(
    name: str, nodes: int, pods: int, qps: float | None = None, timeout: float = 900
) -> dict[str, Any]:
    with ControlPlane(controller_manager=False) as cp:
        api = Api.connect(kubeconfig=str(cp.kubeconfig))
        t = time.monotonic()
        if name == "phalanx":
            populate(api, nodes, pods)
        else:
            populate(api, nodes, 0)
            as_kube_scheduler(api, pods)
        made = time.monotonic() - t
        counter = BindCounter(api, pods)
        counter.start()
        port = free_port()
        t0 = time.monotonic()
        proc = None
        if name == "phalanx":
            proc = start_phalanx(cp, port)
        else:
            cp.start_scheduler(qps=qps)  # the clock started before it was launched, as for Phalanx
        ok = counter.wait(timeout)
        end = counter.last if ok else time.monotonic()
        out: dict[str, Any] = {
            "scheduler": name if qps is None else f"{name} (QPS {qps:g})",
            "bound": len(counter.bound),
            "all_bound_s": end - t0,
            "first_bind_s": (counter.first - t0) if counter.first else float("nan"),
            "pods_per_s": len(counter.bound) / max(end - t0, 1e-9),
            "setup_s": made,
        }
        if proc is not None:
            out["peak_rss_mib"] = rss_peak_mib(proc.pid)
            proc.terminate()
            proc.wait(timeout=30)
            log = (cp.dir / "logs" / "phalanx.log").read_text(errors="replace")
            out["cycles"] = [float(x) for x in re.findall(r"cycle: .*\((\d+\.\d+) s\)", log)]
        api.close()
        return out


def compare(nodes: int, pods: int) -> None:
    rows = [
        run_one("kube-scheduler", nodes, pods),
        run_one("kube-scheduler", nodes, pods, qps=2000),
        run_one("phalanx", nodes, pods),
    ]
    print(f"\n{nodes} nodes x 8 GPUs, {pods} one-GPU pods created first, scheduler started after")
    print(f"{'scheduler':<28} {'bound':>6} {'all bound (s)':>14} {'first bind (s)':>15} {'pods/s':>8}")
    for r in rows:
        cells = (
            f"{r['bound']:>6} {r['all_bound_s']:>14.1f} {r['first_bind_s']:>15.1f} {r['pods_per_s']:>8.0f}"
        )
        print(f"{r['scheduler']:<28} {cells}")
    base = rows[1]["pods_per_s"]
    print(f"phalanx / kube-scheduler (QPS 2000): {rows[2]['pods_per_s'] / base:.2f}x")
    if "peak_rss_mib" in rows[2]:
        print(f"phalanx peak RSS {rows[2]['peak_rss_mib']:.0f} MiB")


def scale(nodes: int, pods: int) -> None:
    r = run_one("phalanx", nodes, pods, timeout=1800)
    cycles = r.get("cycles", [])
    print(f"\nphalanx, {nodes} nodes x 8 GPUs, {pods} one-GPU pods: {r['bound']} bound")
    rate = f"{r['pods_per_s']:.0f} pods/s"
    print(f"end to end {r['all_bound_s']:.1f} s ({rate}), first bind after {r['first_bind_s']:.1f} s")
    print("cycles that bound pods (s, binds included): " + ", ".join(f"{c:.1f}" for c in cycles))
    print(f"peak RSS {r.get('peak_rss_mib', 0):.0f} MiB (setup {r['setup_s']:.0f} s)")


def kill(nodes: int, pods: int, gang: int = 4) -> None:
    """SIGKILL in the middle of a burst with gangs in it; a second run must finish without harm."""
    gangs = pods // (2 * gang)  # half the pods in gangs
    with ControlPlane(controller_manager=False) as cp:
        api = Api.connect(kubeconfig=str(cp.kubeconfig))
        populate(api, nodes, pods, gang=gang, gangs=gangs)
        counter = BindCounter(api, pods)
        counter.start()
        port = free_port()
        proc = start_phalanx(cp, port)
        while len(counter.bound) < pods // 3:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        at_kill = len(counter.bound)
        bound_then = set(counter.bound)
        cut = {
            k // gang
            for k in range(gangs * gang)
            if f"p{k:05d}" in bound_then
            and not all(f"p{j:05d}" in bound_then for j in range(k // gang * gang, k // gang * gang + gang))
        }
        proc = start_phalanx(cp, free_port())
        ok = counter.wait(600)
        proc.terminate()
        proc.wait(timeout=30)
        items, _ = api.list(PODS)
        api.close()
    by_gang: dict[str, list[bool]] = {}
    gpus: dict[tuple[str, str], int] = {}
    for p in items:
        notes = p["metadata"].get("annotations") or {}
        nd = p["spec"].get("nodeName", "")
        g = notes.get("phalanx.io/pod-group")
        if g:
            by_gang.setdefault(g, []).append(bool(nd))
        for idx in notes.get("phalanx.io/gpu-devices", "").split(","):
            if nd and idx:
                gpus[(nd, idx)] = gpus.get((nd, idx), 0) + 1
    partial = [g for g, b in by_gang.items() if any(b) and not all(b)]
    twice = [k for k, v in gpus.items() if v > 1]
    print(f"\nkill: {pods} pods ({gangs} gangs of {gang}) on {nodes} nodes; SIGKILL after {at_kill} binds")
    print(f"gangs cut in the middle by the kill: {len(cut)}")
    print(f"after restart: all bound {ok} ({len(counter.bound)}), partial gangs {len(partial)}", end="")
    print(f", GPUs given twice {len(twice)}")
    if not ok or partial or twice:
        raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["compare", "scale", "kill"])
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--pods", type=int)
    a = ap.parse_args()
    if not os.environ.get("PHALANX_K8S_ASSETS"):
        raise SystemExit(
            "set PHALANX_K8S_ASSETS to the folder of the Kubernetes binaries (../shared/k8s/unpack.sh)"
        )
    if a.what == "compare":
        compare(a.nodes or 1000, a.pods or 4000)
    elif a.what == "scale":
        scale(a.nodes or 5000, a.pods or 20000)
    else:
        kill(a.nodes or 1000, a.pods or 4000)


if __name__ == "__main__":
    main()
