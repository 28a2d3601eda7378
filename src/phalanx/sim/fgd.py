"""The FGD protocol, run exactly as the FGD artifact runs it (hkust-adsl/kubernetes-scheduler-simulator).

1. Task types ("typical pods") are counted over the whole pod list: pods keyed by
   (CPU, per-GPU milli, GPU count, GPU models), most common first, until 95 % of pods are covered.
2. The pod list, sorted by name, is shuffled with the seed; then pods drawn uniformly from it
   (with replacement) are appended until the cumulative GPU request reaches `tune` x the
   cluster's GPU capacity (the artifact checks the next pod's per-GPU share against the target).
3. Pods are submitted one at a time with no departures. A pod that cannot be placed on arrival
   fails and is never retried; no running pod is moved (unless `moves` allows it: see `run_fgd`).
4. After every submission: arrived GPU request, allocated GPU, fragmented GPU and the
   fragmentation rate, with FGD's definitions.

Every placement goes through `run_cycle`, unchanged, on a snapshot kept up to date between submissions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

import numpy as np
import numpy.typing as npt

from phalanx.actions.consolidate import Consolidate
from phalanx.core.cycle import run_cycle
from phalanx.core.fragmentation import FragmentationIndex, TypeTable
from phalanx.core.model import Node
from phalanx.core.profile import Profile
from phalanx.core.snapshot import Snapshot, TaskType
from phalanx.sim.traces.openb import OpenbPod

XS = range(0, 131)


def typical_task_types(pods: Sequence[OpenbPod], threshold_pct: float = 95.0) -> list[TaskType]:
    """The artifact's typical pods: most common request shapes covering `threshold_pct` of pods."""
    counts: dict[tuple[int, int, int, str], tuple[OpenbPod, int]] = {}
    for p in pods:
        key = (p.cpu_milli or 100, p.gpu_milli, p.num_gpu, "|".join(sorted(p.gpu_spec)))
        first, n = counts.get(key, (p, 0))
        counts[key] = (first, n + 1)
    total = len(pods)
    # descending count; ties: larger (cpu, milli, count, model) first, as the artifact's reversed sort
    ordered = sorted(counts.items(), key=lambda kv: (kv[1][1], kv[0]), reverse=True)
    chosen: list[tuple[OpenbPod, int]] = []
    cum = 0
    for _, (pod, n) in ordered:
        if cum >= threshold_pct * total / 100.0:
            break
        chosen.append((pod, n))
        cum += n
    return [TaskType(p.request, n / cum) for p, n in chosen]


def submission_sequence(
    pods: Sequence[OpenbPod], capacity_milli: int, tune: float, rng: np.random.Generator
) -> list[tuple[str, OpenbPod]]:
    """(workload name, pod) in submission order: the shuffled list, then resampled pods up to `tune`."""
    base = sorted(pods, key=lambda p: p.name)
    order = list(base)
    perm = rng.permutation(len(order))
    order = [base[k] for k in perm]
    seq = [(p.name, p) for p in order]
    total = sum(p.gpu_milli_total for p in base)
    target = tune * capacity_milli
    if total > target:  # tune down: drop random pods until under the target
        while total > target and seq:
            k = int(rng.integers(len(seq)))
            total -= seq[k][1].gpu_milli_total
            del seq[k]
        return seq
    i = 0
    while True:
        p = base[int(rng.integers(len(base)))]
        if total + p.gpu_milli > target:  # the artifact compares the per-GPU share here
            break
        total += p.gpu_milli_total
        seq.append((f"{p.name}-tuned-{i}", p))
        i += 1
    return seq


@dataclass
class FgdRun:
    """Per-submission series of one FGD-protocol run."""

    total_gpus: int
    arrived_milli: list[int] = field(default_factory=list)
    used_milli: list[int] = field(default_factory=list)
    frag_milli: list[float] = field(default_factory=list)
    frag_ratio: list[float] = field(default_factory=list)
    failed: int = 0
    submitted: int = 0
    moves: int = 0  # running pods moved to make room (the protocol variant with a move budget)

    def discrete(self) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
        """Per x = arrived GPU as % of capacity (0..130): allocation %, frag % of all GPUs, frag rate %.

        As in `experiments/analysis/merge_*_discrete.py`: round the arrival to 1 % (half to even),
        average the samples at each point, or those within +-1 % when none falls on it.
        """
        tg = self.total_gpus
        arr = np.array([round(a / tg / 10) for a in self.arrived_milli], dtype=np.int64)
        alloc = np.array([round(u / tg / 10, 2) for u in self.used_milli], dtype=np.float64)
        frag = np.asarray(self.frag_milli, dtype=np.float64)
        ratio = np.asarray(self.frag_ratio, dtype=np.float64)
        out_a: dict[int, float] = {}
        out_f: dict[int, float] = {}
        out_r: dict[int, float] = {}
        for x in XS:
            sel = arr == x
            if not sel.any():
                sel = (arr >= x - 1) & (arr <= x + 1)
                if not sel.any():
                    continue
            out_a[x] = round(float(alloc[sel].mean()), 2)
            out_f[x] = round(100 * float(frag[sel].mean()) / 1000 / tg, 2)
            out_r[x] = float(ratio[sel].mean())
        return out_a, out_f, out_r


def run_fgd(
    nodes: Sequence[Node],
    pods: Sequence[OpenbPod],
    profile: Profile,
    *,
    tune: float = 1.3,
    seed: int = 42,
    log: IO[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    node_rank: Callable[[Snapshot, np.random.Generator], npt.NDArray[np.int64]] | None = None,
    at_end: Callable[[Snapshot], None] | None = None,
    moves: float = 0.0,
    movable: Callable[[OpenbPod], bool] | None = None,
) -> FgdRun:
    """Submit the pods one at a time through `run_cycle` and record the series.

    `at_end` sees the final snapshot (benchmarks/fgd_idle.py reads where the idle GPUs sit).

    `moves` > 0 runs the variant a defragmenting scheduler can play and FGD cannot: a pod
    that does not fit may have `consolidate` move running pods for which `movable` holds
    (default: those that share a GPU) to other nodes, while the moves made so far stay
    within `moves` x the pods placed so far.
    """
    mover: Consolidate | None = None
    if moves > 0:
        mover = next((a for a in profile.actions if isinstance(a, Consolidate)), None)
        if mover is None:
            mover = Consolidate(max_nodes=16)
            profile = dataclasses.replace(profile, actions=[*profile.actions, mover])
    is_movable = movable or (lambda p: p.shares_gpu)
    types = typical_task_types(pods)
    snap = Snapshot(nodes, task_types=types)
    c = snap.cluster
    capacity = c.total_shared_milli
    rng = np.random.default_rng(seed)
    seq = submission_sequence(pods, capacity, tune, rng)
    # the artifact renames nodes with a random prefix, so its node order is a seeded permutation
    perm = rng.permutation(len(c)).astype(np.int64)
    snap.node_rank = perm if node_rank is None else node_rank(snap, rng)
    metric = FragmentationIndex(c, TypeTable.build(types, c))
    run = FgdRun(total_gpus=int(c.shared_count.sum()))
    arrived = 0
    for k, (name, pod) in enumerate(seq):
        if mover is not None:
            mover.max_moves = max(0, int(moves * (k - run.failed)) - run.moves)
        snap.add_workload(
            pod.workload(name, creation_time=float(k), preemptible=mover is None or is_movable(pod))
        )
        result = run_cycle(snap, profile, float(k), rng, apply=True)
        arrived += pod.gpu_milli_total
        run.moves += len(result.evictions)
        if not result.binds:
            snap.remove_workload(name)
            run.failed += 1
        if log is not None:
            log.write(json.dumps(_log_line(k, name, result), separators=(",", ":")) + "\n")
        frag, idle = metric.summary()
        run.arrived_milli.append(arrived)
        run.used_milli.append(capacity - int(c.gpu_free_total.sum()))
        run.frag_milli.append(frag)
        run.frag_ratio.append(100.0 * frag / idle if idle else 0.0)
        if progress is not None and k % 200 == 0:
            progress(k, len(seq))
    run.submitted = len(seq)
    if at_end is not None:
        at_end(snap)
    return run


def _log_line(k: int, name: str, result: object) -> dict[str, object]:
    from phalanx.core.decisions import CycleResult

    assert isinstance(result, CycleResult)
    if result.binds:
        return {"i": k, **result.binds[0].to_dict()}
    p = result.pending_for(name)
    return {"i": k, "kind": "failed", "workload": name, "why": p.message if p else ""}


def as_array(d: dict[int, float]) -> npt.NDArray[np.float64]:
    return np.array([d.get(x, np.nan) for x in XS], dtype=np.float64)
