"""GpuClustering (FGD artifact): keep tasks of the same GPU shape together on a node.

A task's affinity tag is its shape (`share-gpu`, `1-gpu`, `8-gpu`, ...). Nodes that host
only that tag score highest, then mixed nodes with it, then nodes without GPU tasks,
then nodes with other tags; within a band, fuller nodes score higher.
"""

from __future__ import annotations

import weakref

import numpy as np

from phalanx.core.cluster import ClusterState
from phalanx.core.extension import FloatArray, PlacementContext
from phalanx.core.model import MILLI, GpuKind, TaskRequest
from phalanx.core.snapshot import Snapshot
from phalanx.plugins.artifact import MAX_NODE_SCORE, MAX_SPEC_GPU


def affinity_tag(req: TaskRequest) -> str:
    g = req.gpu
    if g.kind is GpuKind.NONE:
        return ""
    if g.kind is GpuKind.WHOLE:
        return f"{g.devices}-gpu"
    if g.kind is GpuKind.FRACTION and g.devices == 1 and g.milli < MILLI:
        return "share-gpu"
    return f"{g.devices}x{g.kind.value}"


class _Tags:
    """Which affinity tags each node hosts, refreshed for nodes whose version changed."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.cluster: weakref.ref[ClusterState] = weakref.ref(snapshot.cluster)
        n = len(snapshot.cluster)
        self.seen = np.full(n, -1, dtype=np.int64)
        self.count = np.zeros(n, dtype=np.int64)
        self.has: dict[str, np.ndarray] = {}

    def refresh(self, s: Snapshot) -> None:
        stale = np.nonzero(self.seen != s.cluster.node_version)[0]
        for i in stale:
            tags = {affinity_tag(a.task.request) for a in s.on_node[i].values()} - {""}
            for arr in self.has.values():
                arr[i] = False
            for t in tags:
                if t not in self.has:
                    self.has[t] = np.zeros(len(self.seen), dtype=np.bool_)
                self.has[t][i] = True
            self.count[i] = len(tags)
            self.seen[i] = s.cluster.node_version[i]


class GpuClusteringScorer:
    name = "gpuclustering"

    def __init__(self) -> None:
        self._tags: _Tags | None = None

    def score(self, ctx: PlacementContext) -> FloatArray:
        tag = affinity_tag(ctx.request)
        rows = ctx.candidates.nodes
        if not tag:
            return np.zeros(len(rows))
        s = ctx.session.snapshot
        if self._tags is None or self._tags.cluster() is not s.cluster:
            self._tags = _Tags(s)
        tags = self._tags
        tags.refresh(s)
        quarter = MAX_NODE_SCORE // 4
        base = quarter * (MAX_SPEC_GPU - s.cluster.gpu_free_total[rows]) // MAX_SPEC_GPU
        has = tags.has.get(tag)
        mine = has[rows] if has is not None else np.zeros(len(rows), dtype=np.bool_)
        n = tags.count[rows]
        band = np.where(mine, np.where(n == 1, 3 * quarter, 2 * quarter), np.where(n == 0, quarter, 0))
        return np.asarray(base + band, dtype=np.float64)
