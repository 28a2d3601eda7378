"""DotProd (FGD artifact, after Tetris): prefer the node whose free vector is least aligned with the request.

Resources are (CPU, total GPU), normalised by a 128-core, 8-GPU node; the score is
`int(100 * (1 - dot / 2))`, so a node left nearly full scores highest.
"""

from __future__ import annotations

import numpy as np

from phalanx.core.extension import FloatArray, PlacementContext
from phalanx.plugins.artifact import MAX_NODE_SCORE, MAX_SPEC_CPU, MAX_SPEC_GPU, gpu_total_milli


class DotProdScorer:
    name = "dotprod"

    def score(self, ctx: PlacementContext) -> FloatArray:
        c = ctx.session.snapshot.cluster
        rows = ctx.candidates.nodes
        req = ctx.request
        dot = (c.cpu_free[rows] / MAX_SPEC_CPU) * (req.cpu_milli / MAX_SPEC_CPU)
        dot = dot + (c.gpu_free_total[rows] / MAX_SPEC_GPU) * (gpu_total_milli(req) / MAX_SPEC_GPU)
        return np.trunc(MAX_NODE_SCORE * (1.0 - dot / 2.0))
