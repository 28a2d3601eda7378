"""The adapter's read, offline: API objects -> the snapshot of a cycle, built from scratch or kept.

N nodes of 8 GPUs, P one-GPU pods of ours bound with their device annotations (as the executor
writes them). Three ways a cycle reads them (issue 25), CPU time of `build_world`, median of the
cycles after two warm-up ones:

- scratch: a fresh snapshot every cycle (as before the kept snapshot), 15 new pods a cycle;
- kept: the snapshot kept between cycles (`phalanx.k8s.read.carry`), 15 new pods a cycle, each
  cycle's binds written back onto the pods the way the executor does;
- reused: nothing new since a cycle that bound nothing (one pod waits that fits nowhere).

    python benchmarks/bench_world.py [--nodes 5000 --pods 20000 --cycles 12]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kube_objects import node, pod
from phalanx.core.cycle import run_cycle
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.carry import Carry
from phalanx.k8s.read.devices import binding_notes
from phalanx.k8s.read.translations import Translations
from phalanx.k8s.read.world import build_world
from phalanx.profiles import load_profile

NOW = 1.8e9
NEW = 15


class Objects:
    def __init__(self, nodes: int, pods: int) -> None:
        self.rv = 0
        self.nodes = [self.stamp(node(f"n{i:05d}", gpus=8)) for i in range(nodes)]
        self.pods: list[dict[str, Any]] = []
        for i in range(pods):
            notes = {"phalanx.io/gpu-devices": str((i // nodes) % 8)}
            p = pod(f"run-{i}", gpus=1, node=f"n{i % nodes:05d}", annotations=notes)
            p["status"] = {"phase": "Running", "startTime": "2026-11-29T10:00:00Z"}
            self.pods.append(self.stamp(p))

    def stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["uid"] = f"u{self.rv}"
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return obj


def run(mode: str, nodes: int, pods: int, cycles: int) -> float:
    o = Objects(nodes, pods)
    cfg = AdapterConfig()
    profile = load_profile(cfg.profile)
    memo, carry = Translations(), (None if mode == "scratch" else Carry())
    rng = np.random.default_rng(0)
    if mode == "reused":
        o.pods.append(o.stamp(pod("too-big", gpus=16)))
    took = []
    for c in range(cycles):
        fresh = [] if mode == "reused" else [o.stamp(pod(f"new-{c}-{k}", gpus=1)) for k in range(NEW)]
        o.pods += fresh
        t0 = time.process_time()
        w = build_world(o.nodes, o.pods, [], [], cfg, NOW + c, memo, carry=carry, stamp=o.rv)
        took.append(time.process_time() - t0)
        result = run_cycle(w.snapshot, profile, NOW + c, rng, apply=True)
        if carry is not None and (result.binds or result.evictions):
            carry.applied = True  # as the scheduler does
        by_key = {f"default/{p['metadata']['name']}": p for p in fresh}
        for b in result.binds:
            p = by_key[b.task]
            p["spec"]["nodeName"] = b.node
            p["metadata"]["annotations"].update(binding_notes(b))
            o.rv += 1
            p["metadata"]["resourceVersion"] = str(o.rv)
    return float(np.median(took[2:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=20000)
    ap.add_argument("--cycles", type=int, default=12)
    a = ap.parse_args()
    print(f"build_world, {a.nodes} nodes, {a.pods} bound pods: CPU ms per cycle (median)")
    for mode in ("scratch", "kept", "reused"):
        print(f"{mode:<8} {run(mode, a.nodes, a.pods, a.cycles) * 1000:8.1f}")


if __name__ == "__main__":
    main()
