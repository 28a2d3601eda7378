"""The cache's API objects -> one snapshot for a cycle, and what could not be taken in.

Pods of ours that are bound (or that we chose a node for, before a restart cut the bind
short) are rebuilt with the devices their annotations record. Pods of other schedulers
count as used capacity on their nodes. Objects that cannot be read are left out with a
message, which the scheduler turns into Events and conditions; the rest goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phalanx.core.decisions import Bind
from phalanx.core.devices import default_assignment
from phalanx.core.errors import SpecError
from phalanx.core.feasibility import find_candidates
from phalanx.core.model import MILLI, GpuKind, Node
from phalanx.core.queues import QueueTree
from phalanx.core.snapshot import ForeignUsage, Snapshot
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.devices import decode
from phalanx.k8s.groups import Group, group_pods, workload_of
from phalanx.k8s.nodes import parse_node
from phalanx.k8s.pods import PodInfo, is_active, parse_pod
from phalanx.k8s.queues import build_tree


@dataclass
class World:
    snapshot: Snapshot
    tree: QueueTree | None
    pods: dict[str, PodInfo] = field(default_factory=dict)  # ours, by task name (namespace/name)
    groups: dict[str, Group] = field(default_factory=dict)  # by workload name
    blocked: dict[str, list[str]] = field(default_factory=dict)  # workload -> why it cannot run
    pod_problems: dict[str, str] = field(default_factory=dict)
    node_problems: dict[str, str] = field(default_factory=dict)
    queue_problems: dict[str, str] = field(default_factory=dict)
    unfinished: list[Bind] = field(default_factory=list)  # chosen before a restart, not bound yet
    stale_intents: list[str] = field(default_factory=list)  # intents to clear (node gone or no fit)


def _ready(obj: dict[str, Any]) -> bool:
    if (obj.get("spec") or {}).get("unschedulable"):
        return False
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return True


def build_world(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    pod_groups: list[dict[str, Any]],
    queues: list[dict[str, Any]],
    cfg: AdapterConfig,
    now: float,
) -> World:
    parsed: list[Node] = []
    ready: dict[str, bool] = {}
    problems: dict[str, str] = {}
    for obj in nodes:
        try:
            n = parse_node(obj, cfg)
        except SpecError as e:
            problems[str((obj.get("metadata") or {}).get("name", ""))] = str(e)
            continue
        parsed.append(n)
        ready[n.name] = _ready(obj)
    tree, queue_problems = build_tree(queues, cfg.default_queue)
    snap = Snapshot(parsed, topology_levels=[lv for lv, _ in cfg.levels], queues=tree)
    w = World(snap, tree, node_problems=problems, queue_problems=queue_problems)
    for name, ok in ready.items():
        if not ok:
            snap.set_node_ready(name, False)
    ours: list[PodInfo] = []
    foreign: list[PodInfo] = []
    for obj in pods:
        if not is_active(obj):
            continue
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        try:
            p = parse_pod(obj, cfg)
        except SpecError as e:
            if (obj.get("spec") or {}).get("schedulerName") == cfg.scheduler_name:
                w.pod_problems[key] = str(e)
            continue
        if p.ours and not p.deleting:
            ours.append(p)
        elif p.node:
            foreign.append(p)
    known = {n.name for n in parsed}
    for g in group_pods(ours, pod_groups):
        w.groups[g.name] = g
        queue = g.queue or cfg.default_queue
        if tree is not None and not tree.is_leaf(queue):
            why = queue_problems.get(queue) or (
                f"queue {queue!r} does not exist"
                if queue not in tree.queues
                else f"queue {queue!r} is not a leaf"
            )
            g.problems.append(why)
        if not g.problems:
            try:
                snap.add_workload(workload_of(g, queue))
            except SpecError as e:
                g.problems.append(str(e))
        if g.problems:
            w.blocked[g.name] = g.problems
            foreign += [p for p in g.pods if p.node and p.node in known]
            continue
        for p in g.pods:
            w.pods[p.key] = p
    for p in w.pods.values():
        target = p.node or p.intent
        if not target:
            continue
        if target not in known:
            if not p.node:
                w.stale_intents.append(p.key)
            continue
        placed = _rebuild(snap, p, target, now)
        if placed is None:
            if p.node:
                foreign.append(p)  # runs there whatever we think; count it
            else:
                w.stale_intents.append(p.key)
        elif not p.node:
            w.unfinished.append(placed)
    for p in foreign:
        if p.node in known:
            _foreign(snap, p)
    for entry in snap.running.values():
        since = min(a.since for a in entry.bound.values())
        entry.executed = max(0.0, now - since)
        entry.attained = entry.gpu_milli / MILLI * entry.executed
    return w


def _rebuild(snap: Snapshot, p: PodInfo, node: str, now: float) -> Bind | None:
    """Record our pod on `node` with the devices its annotations name (or any that fit); None if it cannot."""
    entry = snap.entry_of_task(p.key)
    since = p.started or p.created or now
    try:
        b = decode(p.annotations, p.key, entry.name, node)
        if b.gpus or p.request.gpu.kind is GpuKind.NONE:
            snap.bind_existing(p.key, node, snap.assignment_of(b), since=since)
            return b
    except (SpecError, AssertionError, ValueError):
        pass
    i = snap.node_index(node)
    mask = np.zeros(len(snap.cluster), dtype=np.bool_)
    mask[i] = True
    cand = find_candidates(snap, p.request, mask)
    if not len(cand):
        return None
    devices = default_assignment(snap.cluster, i, cand.usable(0), p.request)
    if devices is None:
        return None
    snap.bind_existing(p.key, node, devices, since=since)
    return snap.bind_of(snap.allocations[p.key])


def _foreign(snap: Snapshot, p: PodInfo) -> None:
    """Another scheduler's pod: its CPU and memory, and its GPUs on the first free ones."""
    i = snap.node_index(p.node)
    c = snap.cluster
    g = p.request.gpu
    want = g.devices if g.kind in (GpuKind.WHOLE, GpuKind.FRACTION, GpuKind.MEMORY) else 0
    milli = g.milli if g.kind in (GpuKind.WHOLE, GpuKind.FRACTION) else MILLI
    free = [j for j in range(int(c.gpu_count[i])) if c.gpu_milli_free[i, j] >= milli]
    gpus = tuple(snap.nodes[i].gpus[j].index for j in free[:want])
    cpu = min(p.request.cpu_milli, int(c.cpu_free[i]))
    mem = min(p.request.memory_mib, int(c.mem_free[i]))
    snap.add_foreign(ForeignUsage(p.node, cpu, mem, gpus, milli if gpus else MILLI))
