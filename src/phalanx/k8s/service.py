"""Attained service across runs: what LAS orders by, kept by the scheduler between cycles.

The world is rebuilt from the API every cycle, so it only knows the current run of a workload
(GPUs x time since its pods started). A workload that was preempted and waits again would then
count as fresh, rank first under LAS and preempt its preemptor in turn. The scheduler keeps
each workload's service from its earlier runs here and adds it. Kept in memory: a restarted
scheduler (or a new leader) starts everyone from their current run.
"""

from __future__ import annotations

from phalanx.core.snapshot import Snapshot


class AttainedService:
    def __init__(self) -> None:
        self.served: dict[str, float] = {}  # GPU-seconds from runs that have ended
        self._running: dict[str, float] = {}  # total as of the last cycle, for workloads running then

    def apply(self, snap: Snapshot) -> None:
        """Add earlier runs to every workload's attained service; remember who runs now."""
        for name, total in self._running.items():
            if name not in snap.running and name in snap.workloads:
                self.served[name] = total  # its run ended (preempted, or a pod failed)
        for name in [n for n in self.served if n not in snap.workloads]:
            del self.served[name]  # the workload is gone
        for name, entry in snap.workloads.items():
            entry.attained += self.served.get(name, 0.0)
        self._running = {name: e.attained for name, e in snap.running.items()}
