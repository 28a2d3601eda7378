"""GpuClustering (FGD artifact): keep tasks of the same GPU shape together on a node.

A task's affinity tag is its shape (`share-gpu`, `1-gpu`, `8-gpu`, ...). Nodes that host
only that tag score highest, then mixed nodes with it, then nodes without GPU tasks,
then nodes with other tags; within a band, fuller nodes score higher.
"""

from __future__ import annotations

import numpy as np

from phalanx.core.extension import FloatArray, PlacementContext
from phalanx.core.model import MILLI, GpuKind, TaskRequest
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


class GpuClusteringScorer:
    name = "gpuclustering"

    def score(self, ctx: PlacementContext) -> FloatArray:
        tag = affinity_tag(ctx.request)
        n = len(ctx.candidates)
        if not tag:
            return np.zeros(n)
        s = ctx.session.snapshot
        c = s.cluster
        quarter = MAX_NODE_SCORE // 4
        out = np.zeros(n)
        for k, i in enumerate(ctx.candidates.nodes):
            tags = {affinity_tag(a.task.request) for a in s.on_node[i].values()} - {""}
            base = quarter * (MAX_SPEC_GPU - int(c.gpu_free_total[i])) // MAX_SPEC_GPU
            if tag in tags:
                out[k] = base + (3 * quarter if len(tags) == 1 else 2 * quarter)
            else:
                out[k] = base + (quarter if not tags else 0)
        return out
