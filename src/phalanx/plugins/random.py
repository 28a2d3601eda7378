"""Random placement: every feasible node equally likely (the FGD artifact's Random baseline)."""

from __future__ import annotations

from phalanx.core.extension import FloatArray, PlacementContext


class RandomScorer:
    name = "random"

    def score(self, ctx: PlacementContext) -> FloatArray:
        return ctx.session.rng.random(len(ctx.candidates))
