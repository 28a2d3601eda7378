"""Reservation filter: earmarked nodes are off limits unless the task will finish before they are due."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from phalanx.core.cluster import BoolArray
from phalanx.core.extension import ClassKeyed, NodeBound, PlacementContext, keep_all
from phalanx.core.model import Task, TaskRequest

if TYPE_CHECKING:
    from phalanx.core.session import Reservation, Session


class ReservationFilter(ClassKeyed, NodeBound):
    name = "reservation"

    def __init__(self) -> None:
        self._why = ""
        self._why_of: Reservation | None = None  # the reservation `_why` was written for

    def reason(self) -> str:
        return self._why or "nodes reserved for a large gang"

    def applies(self, session: Session, task: Task) -> Reservation | None:
        """The reservation that keeps this task off its nodes, if any."""
        r = session.reservation
        if r is None or task.workload == r.workload:
            return None
        w = session.snapshot.workloads[task.workload].workload
        est = w.estimated_runtime
        if est is not None and session.clock + est <= r.due:
            return None
        return r

    def class_key(self, session: Session, task: Task, request: TaskRequest) -> Hashable:
        """Off, or on with this reservation (compared by identity): then a node is in it or not."""
        return self.applies(session, task) or ()

    def excluded(self, session: Session, task: Task) -> BoolArray | None:
        """The reserved nodes, when the reservation keeps this task off them (`NodeBound`)."""
        r = self.applies(session, task)
        return None if r is None else r.nodes

    def keep(self, ctx: PlacementContext) -> BoolArray:
        r = self.applies(ctx.session, ctx.task)
        n = len(ctx.candidates)
        if r is None:
            return keep_all(n)
        if r is not self._why_of:  # said once per reservation, not formatted again per placement
            self._why = f"nodes reserved for {r.workload} until t={r.due:g}"
            self._why_of = r
        return np.asarray(~r.nodes[ctx.candidates.nodes], dtype=np.bool_)
