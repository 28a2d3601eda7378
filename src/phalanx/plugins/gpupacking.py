"""GpuPacking (FGD artifact): shares onto used GPUs first, then free GPUs of used nodes, then idle nodes.

Scores, high to low: a share fitting used GPUs (100 - free% / 10, at least 50); whole GPUs
of a used node (50 - free GPUs taken, at least 33); an idle node (33 - its GPUs).
"""

from __future__ import annotations

import numpy as np

from phalanx.core.cluster import KIND_SHARED
from phalanx.core.extension import FloatArray, PlacementContext
from phalanx.core.model import MILLI, GpuKind
from phalanx.plugins.artifact import MAX_NODE_SCORE

_NEVER = 1 << 40


class GpuPackingScorer:
    name = "gpupacking"

    def score(self, ctx: PlacementContext) -> FloatArray:
        g = ctx.request.gpu
        rows = ctx.candidates.nodes
        if g.kind not in (GpuKind.WHOLE, GpuKind.FRACTION) or not len(rows):
            return np.zeros(len(rows))
        c = ctx.session.snapshot.cluster
        shared = c.gpu_kind[rows] == KIND_SHARED
        free = np.where(shared, c.gpu_milli_free[rows], -1)
        fully = (free == MILLI).sum(axis=1)
        idle = fully == shared.sum(axis=1)
        # the GPUs the artifact would use: the d smallest that fit, in ascending order of free share
        fit = np.sort(np.where(free >= g.milli, free, _NEVER), axis=1)[:, : g.devices]
        fit = np.where(fit == _NEVER, 0, fit)
        use_full = (fit == MILLI).sum(axis=1)
        ratio = (fit * 100 // MILLI).sum(axis=1)
        used_node = np.where(
            use_full > 0,
            np.maximum(MAX_NODE_SCORE // 2 - use_full, MAX_NODE_SCORE // 3),
            np.maximum(MAX_NODE_SCORE - ratio // 10, MAX_NODE_SCORE // 2),
        )
        out = np.where(idle, np.maximum(MAX_NODE_SCORE // 3 - fully, fully), used_node)
        return np.asarray(out, dtype=np.float64)
