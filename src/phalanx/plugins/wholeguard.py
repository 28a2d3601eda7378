"""Whole-GPU guard: when untouched GPUs run short, GPU shares go only into GPUs already in use.

Once shares spread over the last untouched GPUs, whole-GPU tasks fail while the cluster is
full of holes. When untouched GPUs fall below `beta` x (the whole-GPU share of the
workload's GPU demand) of all GPUs, this filter keeps fractional tasks on partly used GPUs.
The whole-GPU share comes from the task-type distribution, so a workload without whole-GPU
tasks is never guarded. A share that finds no partly used GPU waits (or, in the FGD protocol,
fails). Measured on the openb lists in docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from phalanx.core.cluster import BoolArray
from phalanx.core.extension import ClassKeyed, PlacementContext, keep_all
from phalanx.core.fragmentation import task_types_of
from phalanx.core.model import MILLI, GpuKind, Task, TaskRequest

if TYPE_CHECKING:
    from phalanx.core.session import Session


class WholeGpuGuard(ClassKeyed):
    name = "whole-gpu-guard"

    def __init__(self, beta: float = 0.06) -> None:
        if beta < 0:
            raise ValueError("beta must be >= 0")
        self.beta = beta
        self._key: tuple[int, tuple[str, int]] | None = None
        self._share = 0.0

    def reason(self) -> str:
        return "untouched GPUs are kept for whole-GPU tasks (whole-gpu-guard)"

    def whole_share(self, session: Session) -> float:
        s = session.snapshot
        key = (
            id(s.cluster),
            ("given", id(s.task_types)) if s.task_types is not None else ("seen", s.types_version),
        )
        if key != self._key:
            types, _ = task_types_of(s)
            total = sum(t.weight * t.request.gpu.total_milli for t in types)
            whole = sum(
                t.weight * t.request.gpu.total_milli for t in types if t.request.gpu.kind is GpuKind.WHOLE
            )
            self._share = whole / total if total else 0.0
            self._key = key
        return self._share

    def active(self, session: Session, request: TaskRequest) -> bool:
        """True when this request's shares must go into GPUs already in use (a cluster-wide verdict)."""
        if request.gpu.kind is not GpuKind.FRACTION or self.beta == 0:
            return False
        c = session.snapshot.cluster
        threshold = self.beta * self.whole_share(session) * c.shared_sum
        return c.whole_free_sum < threshold

    def class_key(self, session: Session, task: Task, request: TaskRequest) -> Hashable:
        """Once on or off, the verdict on a node depends on that node's GPUs alone."""
        return self.active(session, request)

    def keep(self, ctx: PlacementContext) -> BoolArray:
        n = len(ctx.candidates)
        if not self.active(ctx.session, ctx.request):
            return keep_all(n)
        c = ctx.session.snapshot.cluster
        rows = ctx.candidates.nodes
        return ctx.candidates.narrow_all(c.gpu_milli_free[rows] < MILLI)
