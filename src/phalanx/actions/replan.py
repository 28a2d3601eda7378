"""Replan: every cycle, re-plan from empty in the profile's order; what no longer makes the cut stops.

The semantics of Tiresias' simulator for its preemptive policies (`shortest`, `dlas-gpu`):
all workloads, running and waiting, are taken in order; each that fits in what the ones
before it left runs (fit-first); a running workload that does not is preempted. Paired with
`preemption_cost: none` and an order such as `srtf` or `las`, this is the paper-exact
baseline, matched job for job by the reference schedulers in `tests/oracles.py`.

The cut is decided on a scratch copy (every preemptible running workload removed, everything
placed in order), then applied: the running ones left out are evicted and the waiting ones in
are placed in order, while the running ones that stay keep their devices. On a count-only
cluster (one-GPU tasks, no other constraint) what is applied is exactly what was decided; on a
real one a waiting workload may find the devices laid out differently and wait a cycle more.
Non-preemptible running workloads are never touched and count as taken capacity.
"""

from __future__ import annotations

from phalanx.actions.allocate import allocate_workload
from phalanx.actions.gang import _place_gang, gang_tasks
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry


class Replan:
    name = "replan"

    def execute(self, session: Session) -> None:
        s = session.snapshot
        running = [e for e in s.running.values() if e.workload.preemptible]
        pending = list(s.pending_workloads())
        order = sorted([*running, *pending], key=session.order_key)
        chosen = self._cut(session, running, order)
        was_running = {e.name for e in running}
        ahead = 0
        for e in order:
            if e.name in chosen:
                ahead += 1
                continue
            if e.name in was_running:
                reason = f"re-plan: {ahead} workload(s) ahead of it in the order fill the cluster"
                stmt = session.statement()
                for a in list(e.bound.values()):
                    stmt.evict(a, reason)
                stmt.commit()
        for e in order:
            if e.name in was_running:
                continue
            if e.name in chosen:
                allocate_workload(session, e)
            else:
                session.set_pending(e.name, f"{ahead} workload(s) ahead of it in the order fill the cluster")

    @staticmethod
    def _cut(session: Session, running: list[WorkloadEntry], order: list[WorkloadEntry]) -> set[str]:
        """The workloads that fit, in order, into a cluster emptied of the preemptible running ones."""
        stmt = session.statement()
        for e in running:
            for a in list(e.bound.values()):
                stmt.evict(a, "")
        chosen: set[str] = set()
        for e in order:
            gang, _ = gang_tasks(e)
            if _place_gang(session, e, gang, outer=stmt, explain=False).placed:
                chosen.add(e.name)
        stmt.discard()
        return chosen
