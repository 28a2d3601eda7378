"""Preempt: inside a queue, a pending workload evicts lower-priority running ones to fit.

With `by: order` the profile's workload order decides who outranks whom (for example least
attained service), instead of the priority field. Victims must be preemptible and have run
at least `min_runtime` seconds; the cheapest (least lost work) go first; nothing is evicted
unless the preemptor then fits. `order_victims: checkpointed` lets a workload that outranks
another by the order alone (same priority, say fewer GPU-hours under LAS) evict it only if it
checkpoints (`phalanx.io/checkpoint-interval`): time-slicing then costs minutes, never a whole run.
`quantum` is the time slice: such a victim must also have run that long in its current run.
A workload that finds no victims because a guard protects them (the minimum runtime, the
quantum, a victim that is not preemptible) is told which guard and until when (`actions.holds`).
`checkpoint_window` and `repeat_window` are the victim guards of `actions.evict.Guards`: evict
only just after a victim's checkpoint (the preemptor waits for it), and never the same victim
twice for preemptors of one shape within the window. `budget: {queue: N, cluster: M}` caps
the evictions an hour (`actions.budget`). None of these holds back a preemptor of higher
priority than its victim: priority preempts at once, and cannot ping-pong.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.actions import budget as budgets
from phalanx.actions import holds
from phalanx.actions.budget import Budget
from phalanx.actions.evict import Guards, evict_for, lowest_priority, peek, run_start, victims
from phalanx.actions.gang import gang_tasks
from phalanx.actions.leaving import past_leaving
from phalanx.core.decisions import QUANTUM, Hold
from phalanx.core.model import Task
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry


class Preempt:
    name = "preempt"

    def __init__(
        self,
        min_runtime: float = 0.0,
        by: str = "priority",
        max_preemptors: int = 16,
        order_victims: str = "any",
        quantum: float = 0.0,
        checkpoint_window: float = 0.0,
        repeat_window: float = 0.0,
        budget: dict[str, object] | None = None,
        restart_s: float = 0.0,
    ) -> None:
        if checkpoint_window < 0 or repeat_window < 0 or not 0 <= restart_s < float("inf"):
            raise ValueError("checkpoint_window, repeat_window and restart_s must be >= 0 s")
        self.guards = Guards(checkpoint_window, repeat_window, Budget.parse(budget), restart_s)
        if by not in ("priority", "order"):
            raise ValueError("by must be 'priority' or 'order'")
        if order_victims not in ("any", "checkpointed"):
            raise ValueError("order_victims must be 'any' or 'checkpointed'")
        self.order_victims = order_victims
        self.quantum = quantum
        self.min_runtime = min_runtime
        self.by = by
        self.max_preemptors = max_preemptors

    def outranks(self, session: Session, a: WorkloadEntry, b: WorkloadEntry, quantum: bool = True) -> bool:
        """`a` may preempt `b` (with `quantum=False`: once b's time slice has ended)."""
        if self.by == "priority":
            return a.workload.priority > b.workload.priority
        # the profile's order only: age and name break ties for turns, they give no right to preempt
        if not session.order_key(a)[:-2] < session.order_key(b)[:-2]:
            return False
        if a.workload.priority > b.workload.priority:
            return True
        if self.order_victims == "checkpointed" and not b.workload.checkpoint_interval:
            return False
        return not (quantum and self.quantum) or session.clock - run_start(b) >= self.quantum

    def execute(self, session: Session) -> None:
        tries = 0
        failed: set[object] = set()  # alike preemptors (queue, demand, rank) that found no victims
        # every waiting workload that outranks someone running in its queue by priority, not only
        # those free capacity could hold (see Session.pending_for_eviction)
        waiting = session.pending_by_queue()
        # a queue whose waiting workloads were all placed earlier in this cycle has nobody to preempt
        # for (each would be passed over below): its running workloads need not be looked at
        queues = [
            q
            for q, es in waiting.items()
            if any(gang_tasks(e)[0] for e in es)
            and max(e.workload.priority for e in es) > lowest_priority(session, q, preemptible_only=False)
        ]
        entries = session.pending_for_eviction(queues)
        if self.by == "order":
            # a dynamic order (LAS, SRTF) ranks every workload anew each cycle: sorting all of them
            # each cycle costs too much, so only those allocate tried are added
            seen = {e.name for e in entries}
            entries += [e for e in session.ordered_pending() if e.name not in seen]
        for entry in past_leaving(session, entries):  # a gang that fits once victims are gone waits
            if tries >= self.max_preemptors:
                break
            if not entry.workload.preempts:  # preemptionPolicy Never: free room only
                continue
            gang, _ = gang_tasks(entry)
            if not gang:  # placed earlier in this cycle
                continue
            q = entry.workload.queue
            below = entry.workload.priority > lowest_priority(session, q)
            if self.by == "priority" and not below:
                if entry.workload.priority > lowest_priority(session, q, preemptible_only=False):
                    self._hold(session, entry, gang)  # only workloads that are not preemptible rank below
                continue  # nobody preemptible running in the queue ranks below it
            like = (
                q,
                entry.demand_key,
                session.order_key(entry)[:-2] if self.by == "order" else entry.workload.priority,
            )
            if like in failed:
                continue

            def eligible(v: WorkloadEntry, e: WorkloadEntry = entry, q: str = q) -> bool:
                return v.workload.queue == q and v.name != e.name and self.outranks(session, e, v)

            shape = entry.demand_key
            cands = peek(
                victims(session, eligible, self.min_runtime, (q,), self.guards, shape, self._exempt(entry))
            )
            if cands is None:
                failed.add(like)
                self._hold(session, entry, gang)
                continue
            tries += 1
            why = "higher priority" if self.by == "priority" else "ahead in the workload order"
            allow = budgets.admits(session, self.guards.budget, self._exempt(entry), None)
            taken = evict_for(session, entry, gang, cands, f"preempted by {entry.name} ({why})", allow)
            if taken is not None:
                session.pending.pop(entry.name, None)
            else:
                failed.add(like)
                self._hold(session, entry, gang)

    @staticmethod
    def _exempt(entry: WorkloadEntry) -> Callable[[WorkloadEntry], bool]:
        """Victims of lower priority than the preemptor: evicted at once, whatever the guards say."""
        return lambda v: entry.workload.priority > v.workload.priority

    def _hold(self, session: Session, entry: WorkloadEntry, gang: list[Task]) -> None:
        """No victims made room: if guarded ones would, say which guard holds each back, and until when."""
        if not gang:
            return
        q = entry.workload.queue
        spent = budgets.cluster_hold(session, self.guards.budget, self.name) or budgets.queues_hold(
            session, self.guards.budget, self.name, {q}
        )
        if spent is not None and not any(
            self._exempt(entry)(v) for v in holds.running_in(session, (q,)) if v.name != entry.name
        ):  # no victim of lower priority, which the budget does not hold
            holds.note(session, entry, (spent,))
            return
        if not holds.budget(session, self.name):
            return
        guarded = []
        for v in holds.running_in(session, (q,)):
            if v.name == entry.name or not self.outranks(session, entry, v, quantum=False):
                continue
            about = f"priority {v.workload.priority}"
            alike = entry.workload.priority <= v.workload.priority  # priority does not wait
            hold = holds.guard_of(
                session, self.name, v, self.min_runtime, about, self.guards, entry.demand_key, alike
            )
            if not self.outranks(session, entry, v):  # its time slice has not ended
                sliced = Hold(self.name, QUANTUM, v.name, run_start(v) + self.quantum, self.quantum, about)
                if hold is None or (hold.until is not None and hold.until < (sliced.until or 0.0)):
                    hold = sliced
            if hold is not None:
                guarded.append((holds.as_victim(session, v), hold))

        def eligible(v: WorkloadEntry) -> bool:
            return v.workload.queue == q and v.name != entry.name and self.outranks(session, entry, v)

        free = victims(
            session, eligible, self.min_runtime, (q,), self.guards, entry.demand_key, self._exempt(entry)
        )
        window = self.guards.checkpoint_window
        holds.note(session, entry, holds.held_back(session, entry, gang, free, guarded, window=window))
