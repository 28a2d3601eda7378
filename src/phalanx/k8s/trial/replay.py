"""Replaying a capture: what Phalanx would do on the captured cluster, next to what its scheduler did.

The pods of `cfg.scheduler_name` (by default the cluster's `default-scheduler`) are taken as
Phalanx's: those already placed stay where their scheduler put them, and one cycle decides the
ones that wait (binds, evictions, pending with reasons and start forecasts), as
`phalanx scheduler` would if it had been their scheduler at the moment of the capture.
With a shards file, each shard is replayed as its own scheduler (its nodes, its pods, its
profile): a split tried on the cluster as it is before it is made. `fingerprint` is the snapshot
said as plain data, for the parity test (a capture replays to the snapshot the live adapter builds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phalanx.core.decisions import CycleResult
from phalanx.core.profile import Profile
from phalanx.core.snapshot import Snapshot
from phalanx.k8s.act.explain import describe
from phalanx.k8s.client.cache import object_key
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.decide.cycle import decide
from phalanx.k8s.read.world import World
from phalanx.k8s.trial.capture import Capture
from phalanx.k8s.trial.collector import collector_paused


@dataclass
class PodRow:
    """A pod of the scheduler compared: what it did, what Phalanx would do."""

    pod: str
    workload: str
    current: str  # "on <node>", or "waits: <its scheduler's message>"
    phalanx: str  # "bind to <node> GPUs [..]", "stays on <node>", "waits: <why>", "evicted: <why>"
    forecast: str = ""


@dataclass
class Comparison:
    scheduler: str
    profile: str
    world: World
    result: CycleResult
    rows: list[PodRow] = field(default_factory=list)  # the pods that wait, and those Phalanx would evict
    placed: int = 0  # pods of the scheduler placed on nodes at the capture
    placed_pods: dict[str, str] = field(default_factory=dict)  # pod -> the node its scheduler chose
    partial: list[str] = field(default_factory=list)  # gangs placed short of their minimum: "name: k of n"
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler,
            "profile": self.profile,
            "placed": self.placed,
            "placed_pods": self.placed_pods,
            "waiting": sum(1 for r in self.rows if r.current.startswith("waits")),
            "binds": [b.to_dict() for b in self.result.binds],
            "evictions": [e.to_dict() for e in self.result.evictions],
            "pending": [p.to_dict() | {"message": describe(p)} for p in self.result.pending],
            "blocked": self.world.blocked,
            "pods": [r.__dict__ for r in self.rows],
            "partial_gangs": self.partial,
            "problems": self.problems,
        }


def _waits(obj: dict[str, Any]) -> str:
    """What the pod's own scheduler says of it (its PodScheduled condition), or that it said nothing."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"waits: {c.get('message') or c.get('reason') or 'unschedulable'}"
    return "waits (its scheduler has said nothing yet)"


@collector_paused()  # one world and one cycle: see phalanx.k8s.trial.collector
def compare(cap: Capture, cfg: AdapterConfig, profile: Profile, now: float | None = None) -> Comparison:
    """One cycle on the captured cluster for the pods of `cfg.scheduler_name` (a scheduling shard's,
    `cfg.shard`: for those its cache keeps, as that shard's scheduler would decide them)."""
    now = cap.time if now is None else now
    gathered = cap.gathered(cfg)
    world = gathered.world(cfg, now)
    pods = {
        object_key(p): p
        for p in gathered.pods
        if (p.get("spec") or {}).get("schedulerName", "default-scheduler") == cfg.scheduler_name
    }
    decision = decide(world, profile, now)
    result, ahead = decision.result, decision.foresee().texts
    out = Comparison(cfg.scheduler_name, profile.name, world, result)
    out.problems = [world.problems[k] for k in sorted(world.problems)]
    binds = {b.task: b for b in result.binds}
    evicted = {e.task: e for e in result.evictions}
    why = {p.workload: describe(p) for p in result.pending}
    workload_of = {p.key: g.name for g in world.groups.values() for p in g.pods}
    for key, obj in sorted(pods.items()):
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        phase = str((obj.get("status") or {}).get("phase") or "")
        if phase in ("Succeeded", "Failed"):
            continue
        wl = workload_of.get(key, key)
        if node:
            out.placed += 1
            out.placed_pods[key] = node
            if key not in evicted:
                continue
            mine = f"evicted: {evicted[key].reason}"
        elif key in binds:
            b = binds[key]
            gpus = f" GPUs {list(b.gpus)}" if b.gpus else ""
            mine = f"bind to {b.node}{gpus}"
        elif wl in why:
            mine = f"waits: {why[wl]}"
        elif wl in world.blocked:
            mine = "waits: " + "; ".join(world.blocked[wl])
        else:
            mine = "waits: " + next(
                (m for k, m in world.problems.items() if k.endswith(f" {key}")), "not taken in"
            )
        current = f"on {node}" if node else _waits(obj)
        out.rows.append(PodRow(key, wl, current, mine, ahead.get(wl, "")))
    for g in world.groups.values():
        bound = sum(1 for p in g.pods if p.node)
        if 0 < bound < g.min_available:
            out.partial.append(f"{g.name}: {bound} of {g.min_available} pods placed, the gang cannot start")
    return out


def fingerprint(world: World) -> dict[str, Any]:
    """The snapshot as plain data: nodes, free capacity, workloads, placements, other schedulers'
    use, queues, what was left out and why. Equal fingerprints: the same cycle input."""
    s: Snapshot = world.snapshot
    c = s.cluster
    return {
        "nodes": [repr(n) for n in s.nodes],
        "free": {
            "cpu": c.cpu_free.tolist(),
            "mem": c.mem_free.tolist(),
            "gpu": c.gpu_milli_free.tolist(),
        },
        "workloads": {name: repr(e.workload) for name, e in sorted(s.workloads.items())},
        "allocations": {t: (s.nodes[a.node].name, repr(a.devices)) for t, a in sorted(s.allocations.items())},
        "queues": sorted(world.tree.queues) if world.tree is not None else None,
        "blocked": dict(sorted(world.blocked.items())),
        "problems": dict(sorted(world.problems.items())),
        "dra": sorted(str(k) for k in s.dra_devices),
    }
