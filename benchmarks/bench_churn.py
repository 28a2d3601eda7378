"""The churn run (issue 24): hours of mixed jobs arriving and ending, with faults, and what was lost.

A real control plane (etcd, kube-apiserver, kube-controller-manager for claims made from
templates), `--nodes` nodes (most 8 x H100, a tenth A100 with MIG 1g.10gb slices, a twentieth
publishing their GPUs through DRA ResourceSlices), and two `phalanx scheduler` replicas (leader
election, 1 s cycles) talking to the API through a fault proxy (benchmarks/faultproxy.py) that
answers `--bind-500` of the binds with 500. Jobs arrive at `--rate` per second: gangs of 4 x 8 and
2 x 4 GPUs (PodGroups), single pods of 1-2 GPUs, half-GPU shares, MIG slices, DRA claims; each ends
(its pods deleted) a random 60-240 s after it is whole. During the run: kill -9 of the leader
every `--kill-every` s (started again 5 s later), kube-apiserver restarted at 1/3 and 2/3 of the
run, etcd at 1/2, every open watch dropped every `--drop-every` s.

Counted from a sample of the pods every 0.5 s (admin, not through the proxy): pods bound, evictions
(pods deleted that the run did not delete), pods bound twice (a node changed, or two live pods
of one node holding one whole GPU index), gangs partial (some pods bound, not all) for over 2 s
and the fault before each, pods waiting over 60 s with no Event saying why; each replica's RSS every
10 s (plotted), and cycle times from the replicas' /metrics.

    PHALANX_K8S_ASSETS=... python benchmarks/bench_churn.py [--minutes 60] [--nodes 1000] [--out DIR]

`--shards K` (issue 35): the nodes split into K pools (`phalanx.io/node-pool=p<j>`, every node
type in each), each job naming one pool, and two replicas per shard (`--shards FILE --shard s<j>`);
each kill is a kill -9 of every shard's leader at once. Also counted: pods bound to a node of
another pool than theirs (a pod placed by the wrong shard).

`--full` (issue 40 item 4): the cluster kept full, with Queues, quotas and priorities, so that
reclaim and priority preemption fire all the run (benchmarks/churn_full.py says how); besides the
above it counts each eviction's preemptor (from its `Preempted` Event), workloads evicted twice for
one preemptor shape within the hour, and evictions an hour against the budget. Every eviction is
written to `evictions.json` in `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
import churn_full  # noqa: E402
from churn_watch import Watcher  # noqa: E402
from dra_kube import device_classes, dgx_slices, template  # noqa: E402
from e2e_kube import Kube  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from kube_objects import node, pod, pod_group  # noqa: E402
from phalanx.k8s.client.kinds import LEASES, OUR_POD_GROUPS, PODS  # noqa: E402
from phalanx.k8s.lab.localcluster import ControlPlane, free_port  # noqa: E402

NS = "churn"
POOL = "phalanx.io/node-pool"
SHAPES = [  # (kind, pods, GPUs per pod, weight)
    ("gang", 4, 8, 0.10),
    ("gang", 2, 4, 0.15),
    ("single", 1, 1, 0.25),
    ("single", 1, 2, 0.10),
    ("share", 1, 0, 0.15),
    ("mig", 1, 0, 0.15),
    ("dra", 1, 0, 0.10),
]


def _nodes(kube: Kube, n: int, shards: int = 0) -> dict[str, str]:
    """The nodes; returns each one's pool (all "" without shards)."""
    mig, dra = n // 10, n // 20
    objs: list[dict[str, Any]] = []
    for k in range(n - mig - dra):
        objs.append(node(f"h100-{k:04d}", gpus=8, labels={"topology.phalanx.io/rack": f"r{k // 32}"}))
    for k in range(mig):
        m = node(f"a100-{k:04d}", gpus=0, product="NVIDIA-A100-SXM4-80GB", memory=81920,
                 labels={"nvidia.com/gpu.count": "1"}, extra={"nvidia.com/mig-1g.10gb": "7"})  # fmt: skip
        objs.append(m)
    for k in range(dra):
        d = node(f"dra-{k:04d}", gpus=0)
        d["metadata"]["labels"] = {"topology.phalanx.io/rack": "dra"}
        objs.append(d)
    pools = {}
    for o in objs:
        name = o["metadata"]["name"]
        pools[name] = f"p{int(name.rsplit('-', 1)[1]) % shards}" if shards else ""
        if shards:
            o["metadata"]["labels"][POOL] = pools[name]
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda o: kube.api.create("nodes", o), objs))
        for c in device_classes():
            kube.create(c)
        slices = [s for k in range(dra) for s in dgx_slices(f"dra-{k:04d}")]
        list(ex.map(kube.create, slices))
    one = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    kube.create(template("one-gpu", one, ns=NS))
    return pools


class Jobs:
    """Makes jobs of mixed shapes and ends them; remembers what it deleted (the rest is eviction)."""

    def __init__(self, kube: Kube, seed: int, shards: int = 0) -> None:
        self.kube, self.rng, self.shards = kube, random.Random(seed), shards
        self.pool_of: dict[str, str] = {}  # pod -> the pool it names ("" without shards)
        self.live: dict[str, tuple[list[str], bool]] = {}  # job -> (pods, gang?)
        self.whole_since: dict[str, float] = {}
        self.ends: dict[str, float] = {}
        self.deleted: set[str] = set()
        self.made = 0
        self.lock = threading.Lock()

    def make(self) -> None:
        kind, n, gpus, _ = self.rng.choices(SHAPES, weights=[s[3] for s in SHAPES])[0]
        self.made += 1
        job = f"{kind}-{self.made:06d}"
        names = [f"{job}-{k}" for k in range(n)]
        notes: dict[str, str] = {}
        extra: dict[str, str] = {}
        pool = f"p{self.rng.randrange(self.shards)}" if self.shards else ""
        labels = {POOL: pool} if pool else {}
        if kind == "gang":
            self.kube.create(pod_group(job, n, ns=NS))
            notes["phalanx.io/pod-group"] = job
        elif kind == "share":
            notes["gpu-fraction"] = "0.5"
        elif kind == "mig":
            extra["nvidia.com/mig-1g.10gb"] = "1"
        for name in names:
            self.pool_of[name] = pool
            p = pod(name, ns=NS, gpus=gpus, annotations=notes, resources=extra, labels=dict(labels))
            del p["metadata"]["uid"], p["metadata"]["creationTimestamp"]
            if kind == "dra":
                p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
                p["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
            self.kube.api.create(PODS, p, NS)
        with self.lock:
            self.live[job] = (names, kind == "gang")

    def on_evicted(self, name: str) -> None:
        """A pod of ours evicted: here it stays gone (the full mode makes it again)."""

    def tick(self, bound: dict[str, str], now: float, present: set[str] | None = None) -> None:
        """Jobs whole now get an end time; jobs past it are deleted."""
        for job, (names, gang) in list(self.live.items()):
            if job not in self.ends and all(n in bound for n in names):
                self.ends[job] = now + self.rng.uniform(60, 240)
            if self.ends.get(job, float("inf")) <= now:
                with self.lock:
                    self.deleted.update(names)
                    del self.live[job]
                for n in names:
                    with contextlib.suppress(Exception):  # gone already, or the API restarting
                        self.kube.api.delete(PODS, n, NS, 0)
                if gang:
                    with contextlib.suppress(Exception):
                        self.kube.api.delete(OUR_POD_GROUPS, job, NS)


class Replica:
    def __init__(self, ident: str, kubeconfig: Path, logs: Path, extra: tuple[str, ...] = ()) -> None:
        self.ident, self.kubeconfig, self.logs, self.extra = ident, kubeconfig, logs, extra
        self.port = free_port()
        self.incarnation = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.incarnation += 1
        log = open(self.logs / f"{self.ident}-{self.incarnation}.log", "wb")  # noqa: SIM115
        args = ["scheduler", "--kubeconfig", str(self.kubeconfig), "--lease-namespace", NS, "--identity",
                self.ident, "--port", str(self.port), "--insecure-metrics", "--cycle-seconds", "1",
                "--lease-duration", "5", *self.extra]  # fmt: skip
        self.proc = subprocess.Popen([sys.executable, "-m", "phalanx.cli.main", *args], stdout=log,
                                     stderr=subprocess.STDOUT)  # fmt: skip

    @property
    def key(self) -> str:
        return f"{self.ident}-{self.incarnation}"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def run(minutes: float, nodes: int, out: Path, rate: float, kill_every: float, drop_every: float,
        bind_500: float, seed: int = 1, shards: int = 0, full: argparse.Namespace | None = None,
        ) -> dict[str, Any]:  # fmt: skip
    """`full`: the --full mode's arguments (queues, reclaim_min_runtime, reclaim_margin, budget_queue,
    budget_cluster, phase_s, max_waiting), or None."""
    out.mkdir(parents=True, exist_ok=True)
    cp = ControlPlane().start()
    kube = Kube(cp)
    try:
        kube.install_crds(sorted((ROOT / "deploy" / "helm" / "phalanx" / "crds").glob("*.yaml")))
        kube.ensure_namespace(NS)
        t0 = time.monotonic()
        if full is not None:
            churn_full.setup(kube, nodes, full.queues)
            pools = {f"h100-{k:04d}": "" for k in range(nodes)}
            prof = churn_full.profile(out / "profile.yaml", full.reclaim_min_runtime, full.budget_queue,
                                      full.budget_cluster, full.reclaim_margin)  # fmt: skip
        else:
            pools = _nodes(kube, nodes, shards)
        setup_s = time.monotonic() - t0
        proxy = FaultProxy(cp.url, cp.ca_crt, cp.admin_crt, cp.admin_key, bind_500)
        kc = out / "proxy.kubeconfig"
        kc.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "p",
            "clusters": [{"name": "p", "cluster": {"server": proxy.url}}],
            "users": [{"name": "p", "user": {}}],
            "contexts": [{"name": "p", "context": {"cluster": "p", "user": "p"}}],
        }))  # fmt: skip
        if shards:
            f = out / "shards.yaml"
            f.write_text(
                yaml.safe_dump({"shards": [{"name": f"s{j}", "pools": [f"p{j}"]} for j in range(shards)]})
            )
            replicas = [
                Replica(f"s{j}-{i}", kc, out, ("--shards", str(f), "--shard", f"s{j}"))
                for j in range(shards)
                for i in ("a", "b")
            ]
        else:
            extra = ("--profile", str(prof)) if full is not None else ()
            replicas = [Replica(i, kc, out, extra) for i in ("a", "b")]
        jobs: Jobs | churn_full.FullJobs = Jobs(kube, seed, shards)
        if full is not None:
            jobs = churn_full.FullJobs(kube, seed, full.queues, full.phase_s, full.max_waiting)
        watcher = Watcher(kube, NS, jobs, replicas, out, pools)
        if full is not None:
            watcher.drain_s = 180.0  # Events written minutes behind the evictions (docs/benchmarks.md)
        faults: list[tuple[float, str]] = []
        end = time.monotonic() + minutes * 60
        start = time.monotonic()
        plan = sorted(
            [(kill_every * (k + 0.5), "kill") for k in range(int(minutes * 60 / kill_every))]
            + [(minutes * 60 / 3, "apiserver"), (minutes * 60 * 2 / 3, "apiserver"), (minutes * 30, "etcd")]
            + [(drop_every * (k + 1), "drop") for k in range(int(minutes * 60 / drop_every))]
        )
        watcher.start()
        next_job = time.monotonic()
        while time.monotonic() < end:
            now = time.monotonic()
            while plan and plan[0][0] <= now - start:
                _, what = plan.pop(0)
                faults.append((now - start, _fault(what, kube, cp, proxy, replicas, shards)))
            if now >= next_job:
                try:
                    jobs.make()
                except Exception as e:  # the API restarting: that job is not made
                    faults.append((now - start, f"job not made: {type(e).__name__}"))
                next_job += 1.0 / rate
            time.sleep(max(0.0, min(next_job, end) - time.monotonic()))
        report = watcher.stop()
        detail = [(*p, _near(p[1], faults)) for p in report["gangs_partial_detail"]]
        report["gangs_partial_detail"] = detail
        report["gangs_partial_over_2s_not_near_a_fault"] = sum(1 for p in detail if not p[3])
        log = report.pop("eviction_log")
        (out / "evictions.json").write_text(json.dumps(log, indent=0))
        if isinstance(jobs, churn_full.FullJobs) and full is not None:
            report["full"] = churn_full.analyse(log, jobs, minutes, full.budget_queue, full.budget_cluster)
        report.update(
            minutes=minutes, nodes=nodes, rate=rate, shards=shards, setup_s=round(setup_s, 1),
            jobs_made=jobs.made, faults=[f"{t:.0f}s {w}" for t, w in faults], proxy=proxy.counts,
        )  # fmt: skip
        for r in replicas:
            r.kill()
        proxy.close()
        (out / "report.json").write_text(json.dumps(report, indent=1))
        return report
    finally:
        kube.close()
        cp.stop()


def _near(t: float, faults: list[tuple[float, str]]) -> str:
    """The fault within 20 s before `t` (a kill's lease of 5 s, a restart's downtime), or ""."""
    hits = [w for ft, w in faults if 0 <= t - ft <= 20 and not w.startswith("job not made")]
    return hits[-1] if hits else ""


def _fault(
    what: str, kube: Kube, cp: ControlPlane, proxy: FaultProxy, replicas: list[Replica], shards: int = 0
) -> str:
    if what == "kill":  # every shard's leader at once
        said = []
        for lease_name in [f"phalanx-scheduler-s{j}" for j in range(shards)] or ["phalanx-scheduler"]:
            lease = kube.get(LEASES, lease_name, NS) or {}
            holder = (lease.get("spec") or {}).get("holderIdentity", "")
            hit = next((r for r in replicas if r.ident == holder), None)
            if hit is None:
                said.append(f"kill: no leader of {lease_name}")
                continue
            hit.kill()
            threading.Timer(5.0, hit.start).start()
            said.append(f"kill -9 leader {hit.key}")
        return "; ".join(said)
    if what == "drop":
        return f"dropped {proxy.drop()} watches"
    name = "kube-apiserver" if what == "apiserver" else "etcd"
    t = time.monotonic()
    cp.restart(name)
    return f"restarted {name} ({time.monotonic() - t:.1f} s to ready)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1.0, help="jobs per second")
    ap.add_argument("--kill-every", type=float, default=600.0)
    ap.add_argument("--drop-every", type=float, default=420.0)
    ap.add_argument("--bind-500", type=float, default=0.01)
    ap.add_argument("--out", default="/tmp/phalanx-churn")
    ap.add_argument("--shards", type=int, default=0, help="split the nodes into this many shards")
    ap.add_argument("--full", action="store_true", help="keep the cluster full: queues, quotas, priorities")
    ap.add_argument(
        "--queues", type=int, default=4, help="--full: queues, deserved GPUs summing to the cluster"
    )
    ap.add_argument(
        "--reclaim-min-runtime", type=float, default=60.0, help="--full: reclaim's min_runtime (s)"
    )
    ap.add_argument(
        "--reclaim-margin", type=float, default=None, help="--full: reclaim's margin (default: as shipped)"
    )
    ap.add_argument(
        "--budget-queue", type=int, default=30, help="--full: evictions an hour per queue (0: off)"
    )
    ap.add_argument("--budget-cluster", type=int, default=100, help="--full: evictions an hour (0: off)")
    ap.add_argument("--phase-s", type=float, default=300.0, help="--full: seconds each queue is the hot one")
    ap.add_argument("--max-waiting", type=int, default=40, help="--full: jobs a queue keeps waiting at most")
    a = ap.parse_args()
    full = a if a.full else None
    if full is not None and a.shards:
        ap.error("--full and --shards do not combine")
    r = run(a.minutes, a.nodes, Path(a.out), a.rate, a.kill_every, a.drop_every, a.bind_500, shards=a.shards,
            full=full)  # fmt: skip
    print(json.dumps({k: v for k, v in r.items() if k != "rss"}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "160")
    main()
