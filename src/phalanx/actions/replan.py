"""Replan: every cycle, re-plan from empty in the profile's order; what no longer makes the cut stops.

The semantics of Tiresias' simulator for its preemptive policies (`shortest`, `dlas-gpu`):
all workloads, running and waiting, are taken in order; each that fits in what the ones
before it left runs (fit-first); a running workload that does not is preempted. Paired with
`preemption_cost: none` and an order such as `srtf` or `las`, this is the paper-exact
baseline, matched job for job by the reference schedulers in `tests/oracles.py`.

The cut is decided on a scratch copy (the preemptible running workloads removed, everything
placed in order; those ahead of every waiting one simply keep their devices), then applied:
the running ones left out are evicted and the waiting ones in
are placed in order, while the running ones that stay keep their devices. On a count-only
cluster (one-GPU tasks, no other constraint) what is applied is exactly what was decided; on a
real one a waiting workload may find the devices laid out differently and wait a cycle more.
Non-preemptible running workloads are never touched and count as taken capacity.
"""

from __future__ import annotations

from phalanx.actions.allocate import allocate_workload
from phalanx.actions.gang import _place_gang, gang_key, gang_tasks, upper_bound
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry
from phalanx.core.traits import cycle_hooks


class Replan:
    name = "replan"

    def execute(self, session: Session) -> None:
        s = session.snapshot
        running = [e for e in s.running.values() if e.workload.preemptible]
        pending = list(s.pending_workloads())
        hooks = cycle_hooks(session.profile.order)
        for o in hooks:
            o.begin_cycle([*running, *pending])
        order = sorted([*running, *pending], key=session.order_key)
        was_running = {e.name for e in running}
        first_waiting = next((k for k, e in enumerate(order) if e.name not in was_running), len(order))
        if not any(e.name in was_running for e in order[first_waiting:]):
            self._fill(session, order[first_waiting:])  # nobody to preempt: fit-first, in order
        else:
            self._apply(session, order, was_running, self._cut(session, was_running, order, first_waiting))
        now_running = {e.name for e in order if e.name in s.running}
        for o in hooks:
            o.end_cycle(order, now_running)

    @staticmethod
    def _fill(session: Session, waiting: list[WorkloadEntry]) -> None:
        failed: set[object] = set()
        for e in waiting:
            key = gang_key(session, e)
            if key is not None and key in failed:
                session.set_pending(
                    e.name, "a workload ahead of it in the order asks the same and does not fit"
                )
            elif not allocate_workload(session, e) and key is not None:
                failed.add(key)

    @staticmethod
    def _apply(session: Session, order: list[WorkloadEntry], was_running: set[str], chosen: set[str]) -> None:
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
    def _cut(
        session: Session, was_running: set[str], order: list[WorkloadEntry], first_waiting: int
    ) -> set[str]:
        """The workloads that fit, in order, into a cluster emptied of the preemptible running ones.

        Running workloads ahead of every waiting one would be placed first into the empty
        cluster, where they fit: they stay where they are instead (no move, and no work). Placing
        in order only takes capacity, so a gang shape that did not fit does not fit later either.
        """
        chosen = {e.name for e in order[:first_waiting]}
        stmt = session.statement()
        for e in order[first_waiting:]:
            if e.name in was_running:
                for a in list(e.bound.values()):
                    stmt.evict(a, "")
        failed: set[object] = set()
        for e in order[first_waiting:]:
            gang, _ = gang_tasks(e)
            key = gang_key(session, e, gang)
            if key is not None and key in failed:
                continue
            if (
                upper_bound(session, gang) >= len(gang)
                and _place_gang(session, e, gang, outer=stmt, explain=False).placed
            ):
                chosen.add(e.name)
            elif key is not None:
                failed.add(key)
        stmt.discard()
        return chosen
