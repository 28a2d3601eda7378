"""Binpack (KAI/Volcano style MostAllocated): fill the fullest GPU nodes first, keeping whole nodes free."""

from __future__ import annotations

import numpy as np

from phalanx.core.extension import FloatArray, PlacementContext
from phalanx.plugins.artifact import gpu_total_milli


class BinpackScorer:
    name = "binpack"

    def __init__(self, gpu_weight: float = 1.0, cpu_weight: float = 0.2, memory_weight: float = 0.1) -> None:
        self.weights = (gpu_weight, cpu_weight, memory_weight)

    def score(self, ctx: PlacementContext) -> FloatArray:
        return _allocated_fraction(ctx, self.weights)


class SpreadScorer:
    """Spread (kube-scheduler LeastAllocated): prefer the emptiest node."""

    name = "spread"

    def __init__(self, gpu_weight: float = 1.0, cpu_weight: float = 1.0, memory_weight: float = 1.0) -> None:
        self.weights = (gpu_weight, cpu_weight, memory_weight)

    def score(self, ctx: PlacementContext) -> FloatArray:
        return 100.0 - _allocated_fraction(ctx, self.weights)


def _allocated_fraction(ctx: PlacementContext, weights: tuple[float, float, float]) -> FloatArray:
    """Weighted share of each resource in use after placing the task, 0-100."""
    c = ctx.session.snapshot.cluster
    rows = ctx.candidates.nodes
    req = ctx.request
    wg, wc, wm = weights
    parts = []
    total_w = 0.0
    gpu_cap = c.shared_count[rows] * 1000
    has_gpu = gpu_cap > 0
    if wg:
        used = gpu_cap - c.gpu_free_total[rows] + gpu_total_milli(req)
        parts.append(wg * np.where(has_gpu, used / np.maximum(gpu_cap, 1), 0.0))
        total_w += wg
    if wc:
        parts.append(
            wc * (c.cpu_cap[rows] - c.cpu_free[rows] + req.cpu_milli) / np.maximum(c.cpu_cap[rows], 1)
        )
        total_w += wc
    if wm:
        parts.append(
            wm * (c.mem_cap[rows] - c.mem_free[rows] + req.memory_mib) / np.maximum(c.mem_cap[rows], 1)
        )
        total_w += wm
    if not parts:
        return np.zeros(len(rows))
    return 100.0 * np.asarray(sum(parts)) / total_w
