"""`phalanx simulate --capture FILE`: a captured cluster as a what-if time replay.

The capture is read as the scheduler reads its cluster (`phalanx.k8s.trial.replay`); its nodes,
less what other schedulers' pods hold, become the replay's cluster, and the workloads of the
scheduler compared become the replay's jobs:
- running work arrives first (t=0) and runs what is left of its estimate
  (`phalanx.io/estimated-runtime`, PodGroup `estimatedRuntimeSeconds`, else --default-runtime);
- waiting work arrives right after (t=1 s, in the order it was created) and runs its estimate.
Each profile compared then places all of it, and the usual report says GPU allocation, waits,
and fair share per queue. What the replay cannot say: running work is placed again by each
profile at t=0 (the simulator does not pin it where it runs), and jobs are uniform gangs (a
heterogeneous workload becomes its tasks' total GPUs spread evenly over its GPU tasks).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from phalanx.core.model import MILLI, GpuKind, Node, Workload
from phalanx.core.snapshot import Snapshot
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.trial import capture as cap
from phalanx.sim.experiment import ReplayExperiment
from phalanx.sim.jobs import JobSpec
from phalanx.sim.runtime import RuntimeModel


def _nodes(snap: Snapshot) -> list[Node]:
    """The nodes less the whole GPUs, CPU and memory other schedulers' pods hold."""
    c = snap.cluster
    ours_gpu: dict[tuple[int, int], int] = {}
    ours_cpu = [0] * len(snap.nodes)
    ours_mem = [0] * len(snap.nodes)
    for a in snap.allocations.values():
        ours_cpu[a.node] += a.cpu_milli
        ours_mem[a.node] += a.memory_mib
        for j in a.devices.gpus:
            ours_gpu[(a.node, j)] = ours_gpu.get((a.node, j), 0) + a.devices.milli
    out = []
    for i, n in enumerate(snap.nodes):
        keep = tuple(
            g
            for j, g in enumerate(n.gpus)
            if MILLI - int(c.gpu_milli_free[i, j]) - ours_gpu.get((i, j), 0) < MILLI
        )
        cpu = int(c.cpu_free[i]) + ours_cpu[i]  # allocatable less what other schedulers' pods use
        mem = int(c.mem_free[i]) + ours_mem[i]
        out.append(
            replace(n, gpus=keep, cpu_milli=max(0, cpu), memory_mib=max(0, mem), dra=(), counter_sets=())
        )
    return out


def _job(w: Workload, submit: float, duration: float) -> JobSpec:
    tasks = [ps for ps in w.podsets for _ in range(ps.count)]
    gpu_tasks = [ps for ps in tasks if ps.request.gpu.kind is not GpuKind.NONE]
    shares = [ps.request.gpu for ps in gpu_tasks if ps.request.gpu.kind is not GpuKind.WHOLE]
    cpu = max((ps.request.cpu_milli for ps in tasks), default=0)
    mem = max((ps.request.memory_mib for ps in tasks), default=0)
    if not gpu_tasks:
        return JobSpec(w.name, submit, duration, 0, len(tasks), w.queue, cpu_milli=cpu, memory_mib=mem,
                       priority=w.priority, preemptible=w.preemptible)  # fmt: skip
    if shares:  # fractions, memory shares, MIG slices: a share of one GPU per task
        milli = max(1, min(MILLI, max(g.milli or MILLI // 2 for g in shares)))
        n = len(gpu_tasks)
        return JobSpec(w.name, submit, duration, n, n, w.queue, cpu_milli=cpu, memory_mib=mem,
                       gpu_milli=milli, priority=w.priority, preemptible=w.preemptible)  # fmt: skip
    per = math.ceil(sum(ps.request.gpu.devices for ps in gpu_tasks) / len(gpu_tasks))
    return JobSpec(w.name, submit, duration, per * len(gpu_tasks), len(gpu_tasks), w.queue, cpu_milli=cpu,
                   memory_mib=mem, priority=w.priority, preemptible=w.preemptible)  # fmt: skip


def experiment(
    c: cap.Capture,
    cfg: AdapterConfig,
    profiles: list[str],
    default_runtime: float,
    runtime: RuntimeModel,
    seed: int,
) -> tuple[ReplayExperiment, list[str]]:
    """The replay of the captured cluster, and notes that say what it assumed."""
    world = c.gathered(cfg).world(cfg, c.time)
    snap = world.snapshot
    jobs: list[JobSpec] = []
    guessed = 0
    entries = sorted(snap.workloads.values(), key=lambda e: (not e.bound, e.workload.creation_time, e.name))
    for e in entries:
        w = e.workload
        est = w.estimated_runtime
        if est is None:
            guessed += 1
            est = default_runtime
        left = max(1.0, est - e.executed) if e.bound else est
        jobs.append(_job(w, 0.0 if e.bound else 1.0, left))
    running = sum(1 for e in entries if e.bound)
    notes = [
        f"Capture {c.source} taken {c.to_dict()['capturedAt']} ({c.server or 'unknown version'}): "
        f"{len(snap.nodes)} nodes, {running} running and {len(entries) - running} waiting workloads of "
        f"{cfg.scheduler_name}; running work placed again by each profile at t=0 for what is left of "
        f"its estimate, waiting work arrives at t=1 s.",
    ]
    if guessed:
        notes.append(
            f"{guessed} workload(s) without a run-time estimate run --default-runtime {default_runtime:g} s."
        )
    if world.blocked:
        notes.append(f"{len(world.blocked)} workload(s) left out (they cannot run as captured): "
                     + "; ".join(f"{k}: {v[0]}" for k, v in sorted(world.blocked.items())[:5]))  # fmt: skip
    tree = world.tree
    if tree is not None:
        jobs = [j if tree.is_leaf(j.queue) else replace(j, queue=cfg.default_queue) for j in jobs]
        if any(not tree.is_leaf(j.queue) for j in jobs):
            tree = None
            notes.append("The captured queues have no leaf for every workload: queues ignored.")
    exp = ReplayExperiment(
        name=f"capture ({cfg.scheduler_name})",
        nodes=_nodes(snap),
        jobs=jobs,
        profiles=profiles,
        topology_levels=list(snap.topology_levels),
        datasets=dict(snap.datasets),
        runtime=runtime,
        seed=seed,
        queues=tree,
    )
    return exp, notes


def fragmentation(exp: ReplayExperiment) -> dict[str, float]:
    """Each profile's idle-GPU fragmentation (FGD's definition, %), averaged over the replay's time."""
    out: dict[str, float] = {}
    for prof, res in exp.results.items():
        s = res.samples
        spans = [(b.time - a.time, a.frag_rate) for a, b in itertools.pairwise(s) if b.time > a.time]
        total = sum(d for d, _ in spans)
        out[prof] = sum(d * f for d, f in spans) / total if total else (s[-1].frag_rate if s else 0.0)
    return out
