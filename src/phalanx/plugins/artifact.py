"""Shared constants of the FGD artifact's scoring: resources are normalised by a 128-core, 8-GPU node."""

from __future__ import annotations

import numpy as np

from phalanx.core.extension import FloatArray
from phalanx.core.model import GpuKind, TaskRequest

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000
MAX_NODE_SCORE = 100


def gpu_total_milli(req: TaskRequest) -> int:
    g = req.gpu
    if g.kind in (GpuKind.WHOLE, GpuKind.FRACTION):
        return g.devices * g.milli
    return 0


def min_max_normalize(scores: FloatArray) -> FloatArray:
    """kube-scheduler style integer normalisation of scores to [0, 100]."""
    if not len(scores):
        return scores
    lo, hi = scores.min(), scores.max()
    if hi == lo:
        return np.zeros_like(scores)
    return np.asarray(np.floor((scores - lo) * MAX_NODE_SCORE / (hi - lo)), dtype=np.float64)
