"""BestFit (FGD artifact): prefer the node left with the least free CPU and GPU after placement."""

from __future__ import annotations

import numpy as np

from phalanx.core.extension import FloatArray, PlacementContext
from phalanx.plugins.artifact import (
    MAX_NODE_SCORE,
    MAX_SPEC_CPU,
    MAX_SPEC_GPU,
    gpu_total_milli,
    min_max_normalize,
)


class BestFitScorer:
    name = "bestfit"

    def score(self, ctx: PlacementContext) -> FloatArray:
        c = ctx.session.snapshot.cluster
        rows = ctx.candidates.nodes
        req = ctx.request
        cpu_left = (c.cpu_free[rows] - req.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (c.gpu_free_total[rows] - gpu_total_milli(req)) / MAX_SPEC_GPU
        raw = (1.0 - (cpu_left * 0.5 + gpu_left * 0.5)) * MAX_NODE_SCORE
        return min_max_normalize(np.trunc(raw))
