"""Workload order: higher priority first (age and name break ties in the session)."""

from __future__ import annotations

from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry

EPS = 1e-6  # GPU-seconds: a workload that reaches a threshold by float arithmetic is past it


class PriorityOrder:
    name = "priority"
    static = True  # depends only on the workload: sort keys may be memoised
    natural = True  # the snapshot's natural order (priority, age, name)

    def key(self, session: Session, entry: WorkloadEntry) -> tuple[float | int | str, ...]:
        return (-entry.workload.priority,)


class LasOrder:
    """Least attained service (Tiresias' discretised 2D-LAS): fewer GPU-seconds received, earlier.

    Attained service is GPUs x time run, kept by the driver (`Snapshot.advance`). It is
    discretised into levels by `thresholds` (GPU-seconds); within a level, age decides. With
    the `preempt` action (`by: order`), a workload in a lower level preempts higher levels.
    """

    name = "las"
    static = False

    def __init__(self, thresholds: list[float] | None = None) -> None:
        self.thresholds = sorted(thresholds if thresholds is not None else [3600.0, 36_000.0])
        if any(t <= 0 for t in self.thresholds):
            raise ValueError("thresholds must be > 0 GPU-seconds")

    def key(self, session: Session, entry: WorkloadEntry) -> tuple[float | int | str, ...]:
        level = sum(1 for t in self.thresholds if entry.attained >= t - EPS)
        return (level,)

    def next_change(self, entry: WorkloadEntry, now: float) -> float | None:
        """When a running workload crosses its next threshold (its rank changes by itself then)."""
        rate = entry.gpu_milli / 1000
        above = [t for t in self.thresholds if t > entry.attained + EPS]
        if not above or rate <= 0:
            return None
        return now + (above[0] - entry.attained) / rate


class SrtfOrder:
    """Shortest remaining time first, where run times are known (`estimated_runtime`); unknown go last."""

    name = "srtf"
    static = False

    def key(self, session: Session, entry: WorkloadEntry) -> tuple[float | int | str, ...]:
        est = entry.workload.estimated_runtime
        return (max(0.0, est - entry.executed) if est is not None else float("inf"),)
