"""Room that pods still terminating will free: a waiting gang that fits once they are gone waits for
them, and nothing more is evicted for it.

On Kubernetes an evicted pod holds its devices until its kubelet says it is gone, so the preemptor
waits a cycle or more. Without this rule every one of those cycles found it still waiting and
evicted another victim (a 1-GPU preemptor emptied a 4-GPU node in four cycles). kube-scheduler has
the same rule: a pod whose nominated node still has terminating victims does not preempt again.
What one waiting gang would take of the leaving pods is claimed for the rest of the cycle, so a
second preemptor does not count on the same GPUs and evicts its own victims. In the simulator an
eviction frees its devices at once, so nothing is ever leaving there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from phalanx.actions.gang import _place_gang, gang_tasks
from phalanx.core.model import Task
from phalanx.core.session import Session
from phalanx.core.snapshot import Leaving, WorkloadEntry

# a pod this long past the end of its grace period is stuck (its node away, a finalizer): waiting for
# it could be for ever, so a preemptor may evict others instead
STUCK_S = 60.0
CLAIMED = "leaving-claimed"  # session memo: leaving pods a waiting gang counts on this cycle
WAITING = "leaving-waiting"  # session memo: the gangs found waiting for them (asked again: yes)


def past_leaving(session: Session, heads: Iterable[WorkloadEntry]) -> Iterator[WorkloadEntry]:
    """Each of `Session.pending_for_eviction`'s heads, or where one waits for leaving pods the next
    alike workload of its queue (same demand, in order) that does not: the head's turn to evict is
    not lost to a gang that evicts nothing. Each what-if either claims leaving pods or ends the
    search, so there are at most as many as there are pods leaving."""
    for head in heads:
        later: list[WorkloadEntry] | None = None
        entry = head
        while True:
            gang, _ = gang_tasks(entry)
            if not (gang and waits_for_leaving(session, entry, gang)):
                yield entry
                break
            if later is None:
                mine = session.order_key(head)
                later = sorted(
                    (
                        e
                        for e in session.pending_by_queue().get(head.workload.queue, ())
                        if e.demand_key == head.demand_key
                        and e.workload.preempts
                        and session.order_key(e) > mine
                    ),
                    key=session.order_key,
                    reverse=True,
                )
            if not later:
                break
            entry = later.pop()


def waits_for_leaving(session: Session, entry: WorkloadEntry, gang: list[Task]) -> bool:
    """Whether the gang fits once the pods still terminating (and not counted on by a gang before it
    this cycle) are gone; tried on the snapshot and undone. If it does, what it uses is claimed."""
    s = session.snapshot
    if not s.leaving or not gang:
        return False
    claimed = session.memo.setdefault(CLAIMED, set())
    waiting = session.memo.setdefault(WAITING, set())
    assert isinstance(claimed, set) and isinstance(waiting, set)
    if entry.name in waiting:  # a later action (or the same one reaching it again) asks once more:
        return True  # its own claims must not count against it
    before = list(s.leaving)
    leaving = [lv for lv in before if lv.ends >= session.clock - STUCK_S and lv.owner not in claimed]
    if not leaving:
        return False
    for lv in leaving:
        s.let_go(lv)
    try:
        stmt = session.statement()
        try:
            if not _place_gang(session, entry, gang, outer=stmt, explain=False).placed:
                return False
            claimed.update(lv.owner for lv in _used(session, entry, gang, leaving))
            waiting.add(entry.name)
            return True
        finally:
            stmt.discard()
    finally:
        for lv in reversed(leaving):
            s.let_go(lv, gone=False)
        s.leaving[:] = before  # in the order they were recorded


def _used(session: Session, entry: WorkloadEntry, gang: list[Task], leaving: list[Leaving]) -> list[Leaving]:
    """The leaving pods whose GPUs the placed gang took; on its nodes, all of them when it asks no GPU
    (CPU and memory are not told apart per pod)."""
    held = [entry.bound[t.name] for t in gang]
    gpus = {(a.node, g) for a in held for g in a.devices.gpus}
    nodes = {a.node for a in held}
    if not gpus:
        return [lv for lv in leaving if lv.node in nodes]
    return [lv for lv in leaving if any((lv.node, g) in gpus for g in lv.devices.gpus)]
