"""The adapter's read, offline: API objects -> the snapshot of a cycle, built, kept or patched.

N nodes of 8 GPUs, P pods of ours bound, held in a watch cache `Store` as the informers fill it:
the first four on each node one-GPU pods with their device annotations (as the executor writes
them), any more CPU pods (140,000 pods on 4,000 nodes: 16,000 GPU pods and 124,000 CPU pods).
Four ways a cycle reads them (issues 25 and 34), CPU time of the read, median of the cycles after
two warm-up ones:

- scratch: a fresh snapshot every cycle (as before the kept snapshot), NEW new pods a cycle;
- kept: the snapshot kept between cycles (`phalanx.k8s.read.carry`), every object read, NEW new pods
  a cycle, each cycle's binds written back onto the pods the way the executor does;
- patched: the kept world patched from the store's change feed (`phalanx.k8s.read.patch`), the same
  changes as kept;
- reused: nothing new since a cycle that bound nothing (one pod waits that fits nowhere).

`--dra`: every node also publishes two RDMA NICs through DraNet's ResourceSlices (a DeviceClass and
a slice per node, as a cluster running a DRA driver has them; no pod claims them), to measure what
DRA objects cost a cycle that reads only pods (issue 34: until then they made every read a full one).
`--gangs`: each cycle's new pods arrive as one gang with its PodGroup (issue 34: until then a
PodGroup's arrival made the read a full one).

The core's decision for the same cycle (`run_cycle`) is timed beside it, and the peak RSS said.

    python benchmarks/bench_world.py [--nodes 5000 --pods 20000 --cycles 12 --new 15] [--dra]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from dra_kube import device_classes, nic_device, slice_
from kube_objects import node, pod, pod_group
from phalanx.core.cycle import run_cycle
from phalanx.k8s.client.cache import Store
from phalanx.k8s.client.kinds import OUR_POD_GROUPS
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.carry import Carry
from phalanx.k8s.read.devices import binding_notes
from phalanx.k8s.read.gather import gather
from phalanx.k8s.read.patch import Feed
from phalanx.k8s.read.translations import Translations
from phalanx.profiles import load_profile

NOW = 1.8e9


class Objects:
    def __init__(self, nodes: int, pods: int, dra: bool = False) -> None:
        self.rv = 0
        self.store = Store()
        self.nodes = [self.stamp(node(f"n{i:05d}", gpus=8)) for i in range(nodes)]
        self.pods: list[dict[str, Any]] = []
        for i in range(pods):
            if i // nodes < 4:  # four GPUs of each node in use, the rest CPU pods (as at KAI #315's scale)
                notes = {"phalanx.io/gpu-devices": str(i // nodes)}
                p = pod(f"run-{i}", gpus=1, node=f"n{i % nodes:05d}", annotations=notes)
            else:
                p = pod(f"run-{i}", gpus=0, node=f"n{i % nodes:05d}")
            p["status"] = {"phase": "Running", "startTime": "2026-11-29T10:00:00Z"}
            self.pods.append(self.stamp(p))
        self.store.replace("nodes", self.nodes)
        self.store.replace("pods", self.pods)
        if dra:
            nics = [nic_device(k, k) for k in range(2)]
            slices = [slice_(f"{n}-nic", "dra.net", n, nics) for n in (f"n{i:05d}" for i in range(nodes))]
            classes = [c for c in device_classes() if c["metadata"]["name"] == "dranet"]
            self.store.replace("resource.k8s.io/v1/deviceclasses", [self.stamp(c) for c in classes])
            self.store.replace("resource.k8s.io/v1/resourceslices", [self.stamp(s) for s in slices])

    def stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["uid"] = f"u{self.rv}"
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return obj

    def event(self, obj: dict[str, Any]) -> None:
        """What an informer does with a watch event for the pod."""
        self.store.apply("pods", "MODIFIED", obj)


def run(
    mode: str, nodes: int, pods: int, cycles: int, new: int, dra: bool, gangs: bool
) -> tuple[float, float, int]:
    """Median CPU seconds of the read and of the decision, per cycle, and the cycles patched."""
    o = Objects(nodes, pods, dra)
    cfg = AdapterConfig()
    profile = load_profile(cfg.profile)
    memo, carry = Translations(), (None if mode == "scratch" else Carry())
    rng = np.random.default_rng(0)
    if mode == "reused":
        o.pods.append(o.stamp(pod("too-big", gpus=16)))
        o.event(o.pods[-1])
    took, decided = [], []
    for c in range(cycles):
        labels = {"phalanx.io/pod-group": f"g{c}"} if gangs else {}
        fresh = (
            []
            if mode == "reused"
            else [o.stamp(pod(f"new-{c}-{k}", gpus=1, labels=labels)) for k in range(new)]
        )
        if gangs and fresh:
            o.store.apply(OUR_POD_GROUPS.key, "ADDED", o.stamp(pod_group(f"g{c}", new)))
        o.pods += fresh
        for p in fresh:
            o.event(p)
        t0 = time.process_time()
        at = o.store.generation
        feed = None
        if mode == "patched":
            changes = o.store.changes(carry.at) if carry is not None and carry.at is not None else None
            feed = Feed(
                changes, lambda k: o.store.get("pods", k), lambda n: o.store.get("nodes", n), o.store.get
            )
        w = gather(o.store.items, False, cfg).world(cfg, NOW + c, memo, carry, stamp=at, feed=feed)
        if carry is not None:
            carry.at = at
        t1 = time.process_time()
        took.append(t1 - t0)
        result = run_cycle(w.snapshot, profile, NOW + c, rng, apply=True)
        decided.append(time.process_time() - t1)
        if carry is not None and (result.binds or result.evictions):
            carry.applied = True  # as the scheduler does
        by_key = {f"default/{p['metadata']['name']}": p for p in fresh}
        for b in result.binds:
            p = by_key[b.task]
            p["spec"]["nodeName"] = b.node
            p["metadata"]["annotations"].update(binding_notes(b))
            o.rv += 1
            p["metadata"]["resourceVersion"] = str(o.rv)
            o.event(p)
    patched = carry.patched if carry is not None else 0
    return float(np.median(took[2:])), float(np.median(decided[2:])), patched


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=20000)
    ap.add_argument("--cycles", type=int, default=12)
    ap.add_argument("--new", type=int, default=15, help="new pods a cycle")
    ap.add_argument("--modes", default="scratch,kept,patched,reused")
    ap.add_argument("--dra", action="store_true", help="DraNet's NICs published on every node")
    ap.add_argument("--gangs", action="store_true", help="each cycle's new pods one gang with a PodGroup")
    a = ap.parse_args()
    dra = ", DRA NICs on every node" if a.dra else ""
    gangs = " (one gang with its PodGroup)" if a.gangs else ""
    print(f"{a.nodes} nodes, {a.pods} bound pods, {a.new} new a cycle{gangs}{dra}: CPU ms per cycle (median)")
    print(f"{'mode':<8} {'read':>8} {'decide':>8} {'patched':>8}")
    for mode in a.modes.split(","):
        read, decide, patched = run(mode, a.nodes, a.pods, a.cycles, a.new, a.dra, a.gangs)
        print(f"{mode:<8} {read * 1000:8.1f} {decide * 1000:8.1f} {patched:>4}/{a.cycles}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {rss:.0f} MiB (the whole run)")


if __name__ == "__main__":
    main()
