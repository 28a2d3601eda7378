"""Binding throughput on a real kube-apiserver: Phalanx against kube-scheduler, same machine, same input.

Each run: a fresh control plane (etcd, kube-apiserver; no controller-manager), N nodes of 8
GPUs, P one-GPU pods created first, then the scheduler is started and timed until every pod
is bound (counted from a watch in this process). kube-scheduler runs with its default client
QPS (50) and with a raised one; Phalanx runs as its own process (`phalanx scheduler`) with the
default profile, the one users get (`--profile phalanx` or another to measure that one).

    PHALANX_K8S_ASSETS=... python benchmarks/bench_bind.py compare [--nodes 1000 --pods 4000]
    PHALANX_K8S_ASSETS=... python benchmarks/bench_bind.py scale   [--nodes 5000 --pods 20000]
    PHALANX_K8S_ASSETS=... python benchmarks/bench_bind.py kill    [--nodes 1000 --pods 4000]
    PHALANX_K8S_ASSETS=... python benchmarks/bench_bind.py latency [--nodes 1000,2000,5000 --rate 40]
    PHALANX_K8S_ASSETS=... python benchmarks/bench_bind.py latency --gang 4 [--nodes 5000 --rate 10]

`latency` (issue 25): N nodes already running 4 one-GPU pods each (`--running R`: R pods a node,
the ones past 4 CPU pods; `--nodes 4000 --running 35` is 140,000 pods); once the scheduler has placed
a warm-up pod, one-GPU pods arrive at --rate per second for --seconds; each pod's create->bind
time is the client clock from just before its create to the watch showing it bound. Phalanx
(the default profile, as users get it) and kube-scheduler (QPS 2000) on the same cluster shape,
one after the other, with Phalanx's cycle split into read / decide / act / report from /metrics.

`latency --gang K` (Phalanx only: kube-scheduler has no gangs): each arrival is a PodGroup and its K
one-GPU pods; its create->bind runs from the PodGroup's create to its last pod bound.

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

import httpx2 as httpx
import yaml

from phalanx.k8s.client.api import Api, ApiError
from phalanx.k8s.client.kinds import OUR_POD_GROUPS, PODS, Kind
from phalanx.k8s.lab.localcluster import ControlPlane, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kube_objects import node, pod, pod_group

ROOT = Path(__file__).resolve().parents[1]
CRDS = Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", False, "CustomResourceDefinition")


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
        self.at: dict[str, float] = {}  # when the watch showed each pod bound (monotonic)
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
                    self.at[name] = now
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


PROFILE = "phalanx-queues"  # what users get; `--profile` to measure another


def start_phalanx(cp: ControlPlane, port: int, extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    log = open(cp.dir / "logs" / "phalanx.log", "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli.main", "scheduler", "--kubeconfig", str(cp.kubeconfig),
         "--no-leader-elect", "--profile", PROFILE, "--port", str(port), *extra],
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
            out["cycles"] = [float(x) for x in re.findall(r"cycle(?: \d+)?: .*\((\d+\.\d+) s[:)]", log)]
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


def running_pods(api: Api, nodes: int, per_node: int, scheduler: str) -> None:
    """`per_node` pods on each node, bound at creation (spec.nodeName): the work running. The first
    four on each node hold one GPU, any more are CPU pods (35 a node: 140,000 pods on 4,000 nodes,
    KAI-Scheduler #315's scale, as in bench_world.py)."""
    with ThreadPoolExecutor(32) as ex:

        def make(k: int) -> None:
            gpus = 1 if k // nodes < 4 else 0
            p = pod(f"r{k:06d}", gpus=gpus, cpu="1", mem="1Gi", scheduler=scheduler, node=f"n{k % nodes:05d}")
            p["metadata"].pop("uid")
            api.create(PODS, p, "default")

        list(ex.map(make, range(nodes * per_node)))


def phase_sums(port: int) -> dict[str, tuple[float, float]]:
    """Phalanx's phalanx_cycle_phase_seconds per phase: (sum, count), from its /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out: dict[str, list[float]] = {}
    for m in re.finditer(r'phalanx_cycle_phase_seconds_(sum|count)\{phase="(\w+)"[^}]*\} ([0-9.e+-]+)', text):
        out.setdefault(m.group(2), [0.0, 0.0])[["sum", "count"].index(m.group(1))] = float(m.group(3))
    return {k: (v[0], v[1]) for k, v in out.items()}


PHASES = ("read", "decide", "act", "report")


def reads_by_how(port: int) -> dict[str, float]:
    """Phalanx's phalanx_world_reads_total by how the cycle read: patched, kept, rebuilt."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'phalanx_world_reads_total\{how="(\w+)"[^}]*\} ([0-9.e+-]+)', text)
    }


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def install_pod_groups(api: Api) -> None:
    """Phalanx's PodGroup CRD, from the chart, served before the scheduler starts."""
    crd = yaml.safe_load((ROOT / "deploy/helm/phalanx/crds/scheduling.phalanx.io_podgroups.yaml").read_text())
    api.create(CRDS, crd)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            api.list(OUR_POD_GROUPS)
            return
        except ApiError:
            time.sleep(0.2)
    raise SystemExit("the PodGroup CRD was not served within 60 s")


def run_latency(
    name: str, nodes: int, per_node: int, rate: float, seconds: float, gang: int = 0
) -> dict[str, Any]:
    """`gang`: each arrival a gang of that many one-GPU pods with its PodGroup (Phalanx only): its
    create->bind is from the PodGroup's create to its last pod bound."""
    sched = "phalanx" if name == "phalanx" else "default-scheduler"
    arrivals = int(rate * seconds)
    with ControlPlane(controller_manager=False) as cp:
        api = Api.connect(kubeconfig=str(cp.kubeconfig))
        populate(api, nodes, 0)
        running_pods(api, nodes, per_node, sched)
        if gang:
            install_pod_groups(api)
        counter = BindCounter(api, arrivals * max(gang, 1) + 1)
        counter.start()
        port = free_port()
        proc = None
        if name == "phalanx":
            proc = start_phalanx(cp, port, ("--insecure-metrics",))
        else:
            cp.start_scheduler(qps=2000)
        warm = pod("warm-up", gpus=1, scheduler=sched)
        warm["metadata"].pop("uid")
        api.create(PODS, warm, "default")
        deadline = time.monotonic() + 600
        while "warm-up" not in counter.at and time.monotonic() < deadline:
            time.sleep(0.05)
        before = phase_sums(port) if proc else {}
        read_before = reads_by_how(port) if proc else {}
        sent: dict[str, float] = {}
        t0 = time.monotonic()
        members: dict[str, list[str]] = {}  # arrival -> its pods
        with ThreadPoolExecutor(16) as ex:
            for k in range(arrivals):
                time.sleep(max(0.0, t0 + k / rate - time.monotonic()))
                sent[f"a{k:05d}"] = time.monotonic()
                ex.submit(arrive, api, f"a{k:05d}", sched, gang, members)
        counter.wait(120)
        lat = [
            max(counter.at[p] for p in members[n]) - t
            for n, t in sent.items()
            if all(p in counter.at for p in members.get(n, ["?"]))
        ]
        out: dict[str, Any] = {
            "scheduler": name if proc else f"{name} (QPS 2000)",
            "nodes": nodes,
            "bound": len(lat),
            "arrived": arrivals,
            "p50": pct(lat, 0.5),
            "p99": pct(lat, 0.99),
            "max": max(lat, default=float("nan")),
        }
        if proc is not None:
            after = phase_sums(port)
            cycles = after.get("read", (0.0, 0.0))[1] - before.get("read", (0.0, 0.0))[1]
            out["cycles"] = cycles
            out["phases_ms"] = {
                k: 1000 * (after[k][0] - before.get(k, (0.0, 0.0))[0]) / max(cycles, 1) for k in after
            }
            out["peak_rss_mib"] = rss_peak_mib(proc.pid)
            out["reads"] = {k: v - read_before.get(k, 0.0) for k, v in reads_by_how(port).items()}
            proc.terminate()
            proc.wait(timeout=30)
        api.close()
        return out


def arrive(api: Api, name: str, sched: str, gang: int, members: dict[str, list[str]]) -> None:
    """One arrival: a one-GPU pod, or a PodGroup and its `gang` one-GPU pods."""
    if not gang:
        members[name] = [name]
        p = pod(name, gpus=1, cpu="1", mem="1Gi", scheduler=sched)
        p["metadata"].pop("uid")
        api.create(PODS, p, "default")
        return
    members[name] = [f"{name}-{i}" for i in range(gang)]
    api.create(OUR_POD_GROUPS, pod_group(name, gang), "default")
    for m in members[name]:
        p = pod(m, gpus=1, cpu="1", mem="1Gi", scheduler=sched, labels={"phalanx.io/pod-group": name})
        p["metadata"].pop("uid")
        api.create(PODS, p, "default")


def latency(sizes: list[int], rate: float, seconds: float, per_node: int, gang: int = 0) -> None:
    what = f"gangs of {gang} one-GPU pods with a PodGroup" if gang else "one-GPU pods"
    print(f"create->bind, {what} at {rate:g}/s for {seconds:g} s, {per_node} running per node")
    head = (
        f"{'scheduler':<26} {'nodes':>6} {'running':>8} {'bound':>9} {'p50 s':>7} {'p99 s':>7} {'max s':>7}"
    )
    print(head + "  phalanx cycle, mean ms: read / decide / act / report (cycles)")
    for n in sizes:
        for name in ("phalanx",) if gang else ("kube-scheduler", "phalanx"):  # kube-scheduler has no gangs
            r = run_latency(name, n, per_node, rate, seconds, gang)
            line = (
                f"{r['scheduler']:<26} {n:>6} {n * per_node:>8} {r['bound']:>4}/{r['arrived']:<4} "
                f"{r['p50']:>7.3f} {r['p99']:>7.3f} {r['max']:>7.3f}"
            )
            if "phases_ms" in r:
                ph = r["phases_ms"]
                split = " / ".join(
                    f"{ph.get(k, float('nan')):.1f}" for k in ("read", "decide", "act", "report")
                )
                line += f"  {split} ({r['cycles']:.0f}); peak RSS {r['peak_rss_mib']:.0f} MiB"
                reads = r.get("reads") or {}
                line += "; reads " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(reads.items()))
            print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["compare", "scale", "kill", "latency"])
    ap.add_argument("--nodes", help="a count, or for latency a comma-separated list")
    ap.add_argument("--pods", type=int)
    ap.add_argument("--rate", type=float, default=40.0, help="latency: pods created per second")
    ap.add_argument("--seconds", type=float, default=30.0, help="latency: how long pods arrive")
    ap.add_argument("--running", type=int, default=4, help="latency: pods already running per node")
    ap.add_argument(
        "--gang", type=int, default=0, help="latency: arrivals as gangs of this many with a PodGroup"
    )
    ap.add_argument("--profile", default="phalanx-queues", help="Phalanx's profile (default: what users get)")
    a = ap.parse_args()
    global PROFILE
    PROFILE = a.profile
    if not os.environ.get("PHALANX_K8S_ASSETS"):
        raise SystemExit(
            "set PHALANX_K8S_ASSETS to the folder of the Kubernetes binaries (../shared/k8s/unpack.sh)"
        )
    sizes = [int(x) for x in (a.nodes or "").split(",") if x.strip()]
    if a.what == "latency":
        latency(sizes or [1000, 2000, 5000], a.rate, a.seconds, a.running, a.gang)
    elif a.what == "compare":
        compare(sizes[0] if sizes else 1000, a.pods or 4000)
    elif a.what == "scale":
        scale(sizes[0] if sizes else 5000, a.pods or 20000)
    else:
        kill(sizes[0] if sizes else 1000, a.pods or 4000)


if __name__ == "__main__":
    main()
