"""Reservation filter: earmarked nodes are off limits unless the task will finish before they are due."""

from __future__ import annotations

import numpy as np

from phalanx.core.cluster import BoolArray
from phalanx.core.extension import PlacementContext


class ReservationFilter:
    name = "reservation"

    def __init__(self) -> None:
        self._why = ""

    def reason(self) -> str:
        return self._why or "nodes reserved for a large gang"

    def keep(self, ctx: PlacementContext) -> BoolArray:
        r = ctx.session.reservation
        n = len(ctx.candidates)
        if r is None or ctx.task.workload == r.workload:
            return np.ones(n, dtype=np.bool_)
        w = ctx.session.snapshot.workloads[ctx.task.workload].workload
        est = w.estimated_runtime
        if est is not None and ctx.session.clock + est <= r.due:
            return np.ones(n, dtype=np.bool_)
        self._why = f"nodes reserved for {r.workload} until t={r.due:g}"
        return np.asarray(~r.nodes[ctx.candidates.nodes], dtype=np.bool_)
