"""Data locality: prefer nodes that already cache the task's dataset, by the fraction cached."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from phalanx.core.extension import SCORES_ZERO, ClassKeyed, FloatArray, PlacementContext
from phalanx.core.model import Task, TaskRequest

if TYPE_CHECKING:
    from phalanx.core.session import Session


class LocalityScorer(ClassKeyed):
    name = "locality"

    def class_key(self, session: Session, task: Task, request: TaskRequest) -> Hashable | None:
        """Without a dataset every node scores 0; with one the cached bytes may change (full pass)."""
        return None if request.dataset else SCORES_ZERO

    def score(self, ctx: PlacementContext) -> FloatArray:
        ds = ctx.request.dataset
        if not ds:
            return np.zeros(len(ctx.candidates))
        frac = ctx.session.snapshot.dataset_fraction(ds)
        return 100.0 * frac[ctx.candidates.nodes]
