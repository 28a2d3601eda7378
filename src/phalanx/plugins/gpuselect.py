"""GPU choice inside a node as the FGD artifact's baselines make it: best fit or random."""

from __future__ import annotations

import numpy as np

from phalanx.core.cluster import DeviceAssignment
from phalanx.core.devices import charge, default_assignment
from phalanx.core.extension import PlacementContext
from phalanx.core.model import GpuKind


class BestFitGpu:
    """Shares go to the usable GPU with the least free share (first index on ties); whole GPUs as usual."""

    name = "bestfit-gpu"

    def select(self, ctx: PlacementContext, k: int) -> DeviceAssignment | None:
        c = ctx.session.snapshot.cluster
        return default_assignment(c, int(ctx.candidates.nodes[k]), ctx.candidates.usable(k), ctx.request)


class RandomGpu:
    """Shares go to a uniformly random usable GPU (the artifact's Random policy)."""

    name = "random-gpu"

    def select(self, ctx: PlacementContext, k: int) -> DeviceAssignment | None:
        c = ctx.session.snapshot.cluster
        i = int(ctx.candidates.nodes[k])
        usable = ctx.candidates.usable(k)
        g = ctx.request.gpu
        if g.kind is GpuKind.FRACTION and g.devices == 1 and not ctx.request.rdma_nics:
            pos = np.nonzero(usable)[0]
            if not len(pos):
                return None
            j = int(pos[ctx.session.rng.integers(len(pos))])
            return charge(c, i, [j], g)
        return default_assignment(c, i, usable, ctx.request)
