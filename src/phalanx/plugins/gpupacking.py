"""GpuPacking (FGD artifact): shares onto used GPUs first, then free GPUs of used nodes, then idle nodes."""

from __future__ import annotations

import numpy as np

from phalanx.core.extension import FloatArray, PlacementContext
from phalanx.core.model import MILLI, GpuKind
from phalanx.plugins.artifact import MAX_NODE_SCORE


class GpuPackingScorer:
    name = "gpupacking"

    def score(self, ctx: PlacementContext) -> FloatArray:
        g = ctx.request.gpu
        n = len(ctx.candidates)
        if g.kind not in (GpuKind.WHOLE, GpuKind.FRACTION):
            return np.zeros(n)
        c = ctx.session.snapshot.cluster
        out = np.zeros(n)
        for k, i in enumerate(ctx.candidates.nodes):
            shared = c.gpu_kind[i] == 1
            free = c.gpu_milli_free[i][shared]
            fully = int((free == MILLI).sum())
            if fully == len(free):
                out[k] = max(MAX_NODE_SCORE // 3 - fully, fully)
                continue
            order = np.argsort(free, kind="stable")
            need = g.devices
            use_full = 0
            ratio = 0
            for j in order:
                if need == 0:
                    break
                v = int(free[j])
                if g.milli <= v:
                    need -= 1
                    use_full += v == MILLI
                    ratio += v * 100 // MILLI
            if use_full > 0:
                out[k] = max(MAX_NODE_SCORE // 2 - use_full, MAX_NODE_SCORE // 3)
            else:
                out[k] = max(MAX_NODE_SCORE - ratio // 10, MAX_NODE_SCORE // 2)
        return out
