"""FGD: Fragmentation Gradient Descent (Weng et al., USENIX ATC 2023).

Score a node by how much placing the task there would reduce the node's expected
fragmentation (see `phalanx.core.fragmentation`); within the node, pick the GPU that
reduces it most. With `quantize` (the artifact's behaviour) the score is
`int(sigmoid(delta / 1000) * 100)`, so many nodes tie and the tie-break decides.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from phalanx.core.cluster import ClusterState, DeviceAssignment
from phalanx.core.devices import charge, default_assignment
from phalanx.core.extension import ClassKeyed, FloatArray, PlacementContext
from phalanx.core.fragmentation import FragmentationIndex, TypeTable, task_types_of
from phalanx.core.model import MILLI, GpuKind, Task, TaskRequest
from phalanx.core.session import Session

CHOICES_MAX = 1 << 14  # about 8 MiB of keys at most


def pod_shape(req: TaskRequest) -> tuple[int, int, int] | None:
    """(cpu, per-GPU milli, GPU count) as FGD sees a request, or None if FGD cannot model it."""
    g = req.gpu
    if g.kind is GpuKind.NONE:
        return (req.cpu_milli, 0, 0)
    if g.kind in (GpuKind.WHOLE, GpuKind.FRACTION):
        return (req.cpu_milli, g.milli, g.devices)
    return None


def after_states(
    cpu: int, free: tuple[int, ...], shape: tuple[int, int, int]
) -> list[tuple[int, tuple[int, ...]]]:
    """Node states after placing the task: one per distinct GPU choice for a share, else the packed one."""
    c, m, n = shape
    if n == 1 and 0 < m < MILLI:
        out = []
        for v in sorted(set(free)):
            if v >= m:
                lst = list(free)
                lst[lst.index(v)] = v - m
                out.append((cpu - c, tuple(lst)))
        return out
    lst = sorted(free)
    need = n
    for k, v in enumerate(lst):
        if need == 0:
            break
        if v >= m > 0:
            lst[k] = v - m
            need -= 1
    return [(cpu - c, tuple(lst))]


def quantized(delta: FloatArray, quantize: bool) -> FloatArray:
    s = 1.0 / (1.0 + np.exp(-delta / 1000.0)) * 100.0
    return np.floor(s) if quantize else s


@dataclass
class _Cache:
    cluster: weakref.ref[ClusterState]
    types_key: tuple[object, ...]
    index: FragmentationIndex
    token: tuple[str, int] = ("", -1)
    memo: dict[tuple[int, int, int, frozenset[str]], FloatArray] = field(default_factory=dict)
    choices: dict[tuple[object, ...], int] = field(default_factory=dict)  # select's GPU by node state


class FgdScorer(ClassKeyed):
    """Node scorer and GPU selector by fragmentation gradient."""

    name = "fgd"

    def __init__(self, quantize: bool = True) -> None:
        self.quantize = quantize
        self._cache: _Cache | None = None

    def class_key(self, session: Session, task: Task, request: TaskRequest) -> Hashable:
        """A node's score depends on its state (by signature) and on the task-type table."""
        s = session.snapshot
        return ("given", id(s.task_types)) if s.task_types is not None else ("observed", s.types_version)

    def index(self, session: Session) -> _Cache:
        s = session.snapshot
        cache = self._cache
        token = ("given", id(s.task_types)) if s.task_types is not None else ("observed", s.types_version)
        if cache is not None and cache.cluster() is s.cluster and cache.token == token:
            return cache
        types, _ = task_types_of(s)
        key = tuple((t.request.shape_key, t.weight) for t in types)
        if cache is None or cache.cluster() is not s.cluster or cache.types_key != key:
            table = TypeTable.build(types, s.cluster)
            sigs = cache.index.sigs if cache is not None else None
            cache = _Cache(weakref.ref(s.cluster), key, FragmentationIndex(s.cluster, table, sigs))
            self._cache = cache
        cache.token = token
        return cache

    def _best(self, cache: _Cache, sids: np.ndarray, shape: tuple[int, int, int]) -> FloatArray:
        """Per signature: the best score over its possible GPU choices."""
        sigs = cache.index.sigs
        rows_cpu: list[int] = []
        rows_free: list[tuple[int, ...]] = []
        rows_model: list[int] = []
        owners: list[int] = []
        for k, sid in enumerate(sids):
            for cpu, free in after_states(sigs.cpu[sid], sigs.free[sid], shape):
                rows_cpu.append(cpu)
                rows_free.append(free)
                rows_model.append(sigs.model[sid])
                owners.append(k)
        width = cache.index.width
        free_arr = np.zeros((len(rows_free), width), dtype=np.int64)
        for r, f in enumerate(rows_free):
            free_arr[r, : len(f)] = f
        after = cache.index.table.frag(
            np.array(rows_cpu, dtype=np.int64), free_arr, np.array(rows_model, dtype=np.int64)
        )
        own = np.array(owners, dtype=np.int64)
        score = quantized(cache.index.frag_of(sids)[own] - after, self.quantize)
        best = np.full(len(sids), -np.inf)
        np.maximum.at(best, own, score)
        return best

    def score(self, ctx: PlacementContext) -> FloatArray:
        shape = pod_shape(ctx.request)
        n = len(ctx.candidates)
        if shape is None:
            return np.zeros(n)
        cache = self.index(ctx.session)
        sig = cache.index.sigs.refresh()
        key = (*shape, ctx.request.gpu_models)
        memo = cache.memo.get(key)
        size = len(cache.index.sigs)
        if memo is None or len(memo) < size:
            grown = np.full(max(size, 64, 2 * (len(memo) if memo is not None else 0)), np.nan)
            if memo is not None:
                grown[: len(memo)] = memo
            memo = grown
            cache.memo[key] = memo
        sids = sig[ctx.candidates.nodes]
        vals = memo[sids]
        missing = np.isnan(vals)
        if missing.any():
            todo = np.unique(sids[missing])
            memo[todo] = self._best(cache, todo, shape)
            vals = memo[sids]
        return vals

    def select(self, ctx: PlacementContext, k: int) -> DeviceAssignment | None:
        req = ctx.request
        g = req.gpu
        c = ctx.session.snapshot.cluster
        i = int(ctx.candidates.nodes[k])
        usable = ctx.candidates.usable(k)
        shape = pod_shape(req)
        if shape is None or g.kind is not GpuKind.FRACTION or g.devices != 1 or req.rdma_nics:
            return default_assignment(c, i, usable, req)
        cache = self.index(ctx.session)
        cache.index.sigs.refresh()
        frag_now = cache.index.node_frag()[i]
        gpus = [int(j) for j in np.nonzero(usable)[0]]
        if not gpus:  # a node the aggregates kept whose GPUs serve another share backend
            return None
        shared = cache.index.sigs.shared[i]
        free_all = c.gpu_milli_free[i]
        cpu_after = int(c.cpu_free[i]) - req.cpu_milli
        # the choice is a function of these alone (and of the table, which the cache holds)
        key = (
            float(frag_now),
            cpu_after,
            int(c.node_model[i]),
            tuple(free_all.tolist()),
            shared.tobytes(),
            tuple(gpus),
            g.milli,
        )
        hit = cache.choices.get(key)
        if hit is None:
            hit = self._choose(
                cache, frag_now, gpus, shared, free_all, cpu_after, int(c.node_model[i]), g.milli
            )
            if len(cache.choices) >= CHOICES_MAX:  # bounded over a long replay
                cache.choices.clear()
            cache.choices[key] = hit
        return charge(c, i, [hit], g)

    def _choose(
        self,
        cache: _Cache,
        frag_now: float,
        gpus: list[int],
        shared: np.ndarray,
        free_all: np.ndarray,
        cpu_after: int,
        model: int,
        milli: int,
    ) -> int:
        """The GPU of a node whose share lowers its fragmentation most (the first on ties)."""
        rows = np.zeros((len(gpus), cache.index.width), dtype=np.int64)
        for r, j in enumerate(gpus):
            f = free_all.copy()
            f[j] -= milli
            vals = sorted(int(x) for x in f[shared])
            rows[r, : len(vals)] = vals
        after = cache.index.table.frag(
            np.full(len(gpus), cpu_after, dtype=np.int64), rows, np.full(len(gpus), model, dtype=np.int64)
        )
        q = quantized(frag_now - after, self.quantize)
        return gpus[int(np.argmax(q))]  # first GPU index among the best, as the artifact does
