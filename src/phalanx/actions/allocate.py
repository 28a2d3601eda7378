"""Allocate: place pending workloads, gang-aware, in queue -> priority -> age order.

Queues take turns: each step serves the queue that holds the least GPU so far (ties by
name), then its best workload. With `gang: false` it imitates kube-scheduler instead:
one pod at a time, pods of concurrently created workloads interleaved, no all-or-nothing.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Iterator

import numpy as np

from phalanx.actions import holds, subgroups
from phalanx.actions.gang import gang_key, gang_tasks, place_gang, said
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry


class Allocate:
    name = "allocate"

    def __init__(self, gang: bool = True, strict_fifo: bool = False) -> None:
        self.gang = gang
        self.strict_fifo = strict_fifo

    def execute(self, session: Session) -> None:
        if self.gang:
            self._gangs(session)
        else:
            self._pods(session)

    def _gangs(self, session: Session) -> None:
        if self.strict_fifo:
            self._strict(session)
            return
        by_queue: dict[str, list[WorkloadEntry]] = defaultdict(list)
        for e in session.ordered_pending():
            by_queue[e.workload.queue].append(e)
        heap = [(session.queue_key(q), q) for q in by_queue]
        heapq.heapify(heap)
        pos = dict.fromkeys(by_queue, 0)
        # queues where a workload still waits: one placed behind it there is not handed out early,
        # since preempt may yet make room for the waiting one with it (as it would without a stream)
        waits: set[str] = set()
        while heap:
            _, q = heapq.heappop(heap)
            entries = by_queue[q]
            if pos[q] >= len(entries):
                continue
            entry = entries[pos[q]]
            pos[q] += 1
            if session.parked(entry) or no_room(session, entry):
                session.attempted.add(entry.name)  # nothing frees up within the cycle: backfill skips it
                waits.add(q)
            else:
                since = len(session.committed)
                if not allocate_workload(session, entry):
                    waits.add(q)
                elif q not in waits:
                    session.hand_out(entry, since)
            if pos[q] < len(entries):
                heapq.heappush(heap, (session.queue_key(q), q))

    def _strict(self, session: Session) -> None:
        """Each queue in order from its head, stopping at the first workload that does not start.

        Every pending workload counts, not only those the free-capacity gate lets through: the
        gate drops workloads that cannot fit this cycle, which changes nothing for a fit-first
        order, but a strict queue must stop at such a workload rather than pass it. With the
        natural order the queues' heads come from the snapshot's sorted groups, lazily: a cycle
        looks at the heads, not at everything that waits.
        """
        s = session.snapshot
        if all(o.natural for o in session.profile.order):
            merged = heapq.merge(*(list(order) for order in s.group_order.values()))
            source: Iterator[WorkloadEntry] = (s.workloads[nat[-1]] for nat in merged)
        else:
            source = iter(sorted(s.pending_workloads(), key=session.order_key))
        buffered: dict[str, deque[WorkloadEntry]] = defaultdict(deque)

        def next_in(q: str) -> WorkloadEntry | None:
            while not buffered[q]:
                e = next(source, None)
                if e is None:
                    return None
                buffered[e.workload.queue].append(e)
            return buffered[q].popleft()

        heap = [(session.queue_key(q), q) for q in sorted(s.pending_per_queue)]
        heapq.heapify(heap)
        while heap:
            _, q = heapq.heappop(heap)
            entry = next_in(q)
            if entry is None:
                continue
            if session.parked(entry) or no_room(session, entry):
                session.attempted.add(entry.name)
                started = False
            else:
                since = len(session.committed)
                started = allocate_workload(session, entry)
                if started:
                    session.hand_out(entry, since)
            if started:
                heapq.heappush(heap, (session.queue_key(q), q))
                continue
            # the rest of the queue waits behind it; workloads no cycle has looked at get the reason
            why = f"waiting behind the head of queue {q} (strict FIFO)"
            for name in sorted(s.fresh):
                rest = s.workloads.get(name)
                if rest is not None and rest is not entry and rest.workload.queue == q and not rest.bound:
                    session.set_pending(name, why)

    def _pods(self, session: Session) -> None:
        entries = session.ordered_pending()
        rank = {e.name: k for k, e in enumerate(entries)}
        pods = [(t.ordinal, rank[e.name], t, e) for e in entries if not session.parked(e) for t in e.unbound]
        pods.sort(key=lambda p: (-p[3].workload.priority, p[3].workload.creation_time, p[0], p[1]))
        first_failure: dict[str, str] = {}
        for _, _, task, entry in pods:
            stmt = session.statement()
            if session.place(task, stmt) is not None:
                stmt.commit()
                continue
            reasons = session.why_not(task)
            stmt.discard()
            if entry.name not in first_failure:
                first_failure[entry.name] = task.name
                missing = len(entry.unbound)
                session.set_pending(
                    entry.name,
                    f"{missing} pod(s) unschedulable, e.g. {task.name}",
                    reasons,
                    unschedulable=True,
                )


def no_room(session: Session, entry: WorkloadEntry) -> bool:
    """The gang's shape already failed this cycle: record it pending without trying again."""
    if not session.no_room or len(entry.bound) >= entry.workload.gang_size:
        return False
    key = gang_key(session, entry)
    outcome = session.no_room.get(key) if key is not None else None
    if outcome is None:
        return False
    outcome = said(entry, gang_tasks(entry)[0], outcome)
    entry.cache["gang_outcome"] = outcome  # its parts, for a later cycle that reuses this reason
    session.set_pending(entry.name, outcome.summary, outcome.reasons, unschedulable=True)
    return True


def allocate_workload(session: Session, entry: WorkloadEntry) -> bool:
    """Place the gang (all-or-nothing), then any optional tasks one by one. True if the gang runs."""
    session.attempted.add(entry.name)
    gang, rest = gang_tasks(entry)
    if gang and session.profile.admission:
        reason = session.admit(entry, gang)
        if reason is not None:
            session.set_pending(entry.name, "not admitted", [reason])
            return False
    if gang:
        outcome = place_gang(session, entry, gang)
        if not outcome.placed:
            # capacity still held by evicted pods on their way out: the gang waits for them, say so
            held = holds.terminating(session, entry, gang)
            session.set_pending(entry.name, outcome.summary, outcome.reasons, unschedulable=True, holds=held)
            return False
    left = 0
    restrict = same_domain(session, entry)
    for t in rest:
        if session.profile.admission and session.admit(entry, [t]) is not None:
            left += 1
            continue
        stmt = session.statement()
        mask = subgroups.same_domain(session, entry, t) if entry.workload.subgroups else None
        mask = mask if restrict is None else restrict if mask is None else restrict & mask
        if session.place(t, stmt, mask) is not None:
            stmt.commit()
        else:
            stmt.discard()
            left += 1
    if left:
        w = entry.workload
        said_min = f" ({w.minimum_said})" if w.minimum_said else ""
        session.set_pending(
            entry.name, f"{left} optional {w.task_noun}(s) beyond the minimum{said_min} do not fit yet"
        )
    else:
        session.pending.pop(entry.name, None)
    return True


def same_domain(session: Session, entry: WorkloadEntry) -> np.ndarray | None:
    """With a required topology level, later tasks must join the domain the gang already runs in."""
    topo = entry.workload.topology
    if topo is None or not topo.required or not entry.bound:
        return None
    level = "node" if topo.level == "hostname" else topo.level
    dom = session.snapshot.domains(level)
    first = next(iter(entry.bound.values())).node
    return np.asarray(dom == dom[first])
