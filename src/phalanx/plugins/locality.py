"""Data locality: prefer nodes that already cache the task's dataset, by the fraction cached."""

from __future__ import annotations

import numpy as np

from phalanx.core.extension import FloatArray, PlacementContext


class LocalityScorer:
    name = "locality"

    def score(self, ctx: PlacementContext) -> FloatArray:
        ds = ctx.request.dataset
        if not ds:
            return np.zeros(len(ctx.candidates))
        frac = ctx.session.snapshot.dataset_fraction(ds)
        return 100.0 * frac[ctx.candidates.nodes]
