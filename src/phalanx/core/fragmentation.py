"""GPU fragmentation as FGD defines it (Weng et al., USENIX ATC 2023).

For a node and a task type t: if the node could host t now (GPU model allowed, enough
GPUs each with at least t's share free, enough CPU), the idle GPU that is fragmented
for t is the sum of the free shares smaller than t's share; otherwise all the node's
idle GPU is fragmented for t. A node's fragmentation is the expectation over the
workload's task-type distribution. As in the FGD artifact, CPU-only task types count
all idle GPU as fragmented (they can never use it).

Node states are memoised by signature (CPU free, GPU model, sorted free shares):
identical nodes, and unchanged nodes across cycles, are computed once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from phalanx.core.cluster import KIND_SHARED, ClusterState
from phalanx.core.model import MILLI, GpuKind
from phalanx.core.snapshot import Snapshot, TaskType

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class TypeTable:
    """Task types as arrays: CPU, per-GPU share, GPU count, allowed-model matrix, weight."""

    cpu: IntArray
    milli: IntArray
    num: IntArray
    is_cpu: npt.NDArray[np.bool_]
    access: npt.NDArray[np.bool_]  # (models + 1) x T; last row = node without GPUs
    weight: FloatArray

    @staticmethod
    def build(types: Sequence[TaskType], cluster: ClusterState) -> TypeTable:
        n_models = len(cluster.models)
        mem = cluster.gpu_mem_cap[cluster.gpu_kind == KIND_SHARED]
        mem = mem[mem > 0]
        typical_mem = int(np.median(mem)) if len(mem) else 16384
        cpu, milli, num, is_cpu, weight = [], [], [], [], []
        access = np.ones((n_models + 1, len(types)), dtype=np.bool_)
        total = sum(t.weight for t in types) or 1.0
        for k, t in enumerate(types):
            r = t.request
            g = r.gpu
            cpu.append(r.cpu_milli)
            if g.kind in (GpuKind.WHOLE, GpuKind.FRACTION):
                milli.append(g.milli)
                num.append(g.devices)
            elif g.kind is GpuKind.MEMORY:
                milli.append(min(MILLI, -(-g.memory_mib * MILLI // typical_mem)))
                num.append(g.devices)
            else:
                milli.append(0)
                num.append(0)
            is_cpu.append(milli[-1] == 0)
            weight.append(t.weight / total)
            if r.gpu_models:
                access[:, k] = False
                for m in r.gpu_models:
                    if m in cluster.model_id:
                        access[cluster.model_id[m], k] = True
        return TypeTable(
            np.array(cpu, dtype=np.int64),
            np.array(milli, dtype=np.int64),
            np.array(num, dtype=np.int64),
            np.array(is_cpu, dtype=np.bool_),
            access,
            np.array(weight, dtype=np.float64),
        )

    def frag(self, cpu: IntArray, free: IntArray, model: IntArray) -> FloatArray:
        """Fragmented milli-GPU of B node states (cpu[B], free[B, G], model id[B], -1 = none)."""
        if len(cpu) == 0:
            return np.zeros(0, dtype=np.float64)
        total = free.sum(axis=1)
        ge = free[:, None, :] >= self.milli[None, :, None]
        count = ge.sum(axis=2)
        below = np.where(ge, 0, free[:, None, :]).sum(axis=2)
        acc = self.access[np.where(model < 0, self.access.shape[0] - 1, model)]
        fits = (
            acc & ~self.is_cpu[None, :] & (count >= self.num[None, :]) & (cpu[:, None] >= self.cpu[None, :])
        )
        contrib = np.where(fits, below, total[:, None])
        return np.asarray(contrib @ self.weight, dtype=np.float64)


def task_types_of(snapshot: Snapshot) -> tuple[list[TaskType], int]:
    """The workload's task-type distribution and a version that changes when it does.

    Given by the driver (`Snapshot.task_types`), else counted from all known tasks.
    """
    if snapshot.task_types is not None:
        return list(snapshot.task_types), -1
    return snapshot.observed_task_types(), snapshot.types_version


class NodeSignatures:
    """Interned node-state signatures, refreshed only for nodes whose version changed."""

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        n = len(cluster)
        self.sig = np.full(n, -1, dtype=np.int64)
        self.seen = np.full(n, -1, dtype=np.int64)
        self.mark = (-1, -1, 0)
        self._ids: dict[tuple[int, ...], int] = {}
        self.cpu: list[int] = []
        self.model: list[int] = []
        self.free: list[tuple[int, ...]] = []
        self.shared = cluster.gpu_kind == KIND_SHARED

    def refresh(self) -> IntArray:
        c = self.cluster
        if c._stamp == self.mark[0]:  # no node changed since the last refresh
            return self.sig
        # the nodes whose version moved since, in index order (as a scan of the versions finds them)
        stale = c.changed_since(self.mark) if self.mark[0] >= 0 else range(len(self.seen))
        self.mark = c.mark()
        pos = c.shared_pos
        for i in stale:
            row = c.gpu_milli_free[i].tolist()
            key = (int(c.cpu_free[i]), int(c.node_model[i]), *sorted([row[j] for j in pos[i]]))
            sid = self._ids.get(key)
            if sid is None:
                sid = len(self._ids)
                self._ids[key] = sid
                self.cpu.append(key[0])
                self.model.append(key[1])
                self.free.append(key[2:])
            self.sig[i] = sid
            self.seen[i] = c.node_version[i]
        return self.sig

    def __len__(self) -> int:
        return len(self._ids)

    def states(self, sids: IntArray, width: int) -> tuple[IntArray, IntArray, IntArray]:
        """CPU, free shares (padded to `width`) and model of the given signatures."""
        cpu = np.array([self.cpu[s] for s in sids], dtype=np.int64)
        model = np.array([self.model[s] for s in sids], dtype=np.int64)
        free = np.zeros((len(sids), width), dtype=np.int64)
        for r, s in enumerate(sids):
            f = self.free[s]
            free[r, : len(f)] = f
        return cpu, free, model


class FragmentationIndex:
    """Per-node fragmentation under one task-type table, memoised by signature."""

    def __init__(self, cluster: ClusterState, table: TypeTable, sigs: NodeSignatures | None = None) -> None:
        # node signatures do not depend on the table: a new table (the task mix moved) keeps them
        self.sigs = sigs if sigs is not None and sigs.cluster is cluster else NodeSignatures(cluster)
        self.table = table
        self.width = max(1, cluster.max_gpus)
        self._frag = np.full(64, np.nan, dtype=np.float64)

    def node_frag(self) -> FloatArray:
        """Fragmented milli-GPU of every node now."""
        return self.frag_of(self.sigs.refresh())

    def frag_of(self, sids: IntArray) -> FloatArray:
        """Fragmented milli-GPU of the given signatures (computed once each)."""
        if len(self.sigs) > len(self._frag):
            grown = np.full(max(len(self.sigs), 2 * len(self._frag)), np.nan)
            grown[: len(self._frag)] = self._frag
            self._frag = grown
        vals = self._frag[sids]
        missing = np.isnan(vals)
        if missing.any():
            todo = np.unique(sids[missing])
            cpu, free, model = self.sigs.states(todo, self.width)
            self._frag[todo] = self.table.frag(cpu, free, model)
            vals = self._frag[sids]
        return vals

    def summary(self) -> tuple[float, float]:
        """(fragmented milli-GPU, idle milli-GPU) of the whole cluster."""
        c = self.sigs.cluster
        frag = float(self.node_frag().sum())
        idle = float(c.gpu_free_total.sum())
        return frag, idle
