"""Quota admission: limits, borrowing and lending limits, and non-preemptible work only in quota.

Checked before a gang is placed, for the workload's queue and every ancestor:
- usage + request must stay within the queue's ceiling (its limit, and deserved + borrowing limit);
- a non-preemptible workload may only use its queue's deserved quota (it can never be reclaimed);
- borrowing beyond the deserved quota must come from capacity others may lend: the part of an
  idle queue's deserved quota it does not lend (deserved - lending limit) stays free.
"""

from __future__ import annotations

import numpy as np

from phalanx.core.decisions import Reason
from phalanx.core.model import Task
from phalanx.core.queues import RESOURCES
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry

EPS = 1e-6


def fmt(v: float, r: int) -> str:
    if r == 0:
        return f"{v / 1000:g} GPU"
    if r == 1:
        return f"{v / 1000:g} CPU"
    return f"{v / 1024:g} GiB"


def first_over(
    use: list[float], ask: list[float], bound: list[float], managed: list[bool] | None = None
) -> int | None:
    """The first resource where use + ask exceeds the bound (of those managed), or None."""
    for r, (u, a, b) in enumerate(zip(use, ask, bound, strict=True)):
        if u + a > b + EPS and (managed is None or managed[r]):
            return r
    return None


class QuotaCheck:
    name = "quota"

    def admit(self, session: Session, entry: WorkloadEntry, tasks: list[Task]) -> Reason | None:
        s = session.snapshot
        tree = s.queues
        if tree is None or entry.workload.quota_exempt:
            return None
        ask = session.request_of(tasks)
        q = entry.workload.queue
        # three numbers a side: Python floats (the same double arithmetic as numpy's, without an
        # array made per operation) for a check run before every try of every waiting gang
        wants = ask.tolist()
        for a in tree.ancestors(q):
            use = s.usage_of(a)
            ceil = tree.ceiling(a)
            r = first_over(use.tolist(), wants, ceil.tolist())
            if r is not None:
                return Reason(
                    "quota",
                    f"queue {a} would exceed its {RESOURCES[r]} ceiling of {fmt(ceil[r], r)} "
                    f"(using {fmt(use[r], r)}, asking {fmt(ask[r], r)})",
                )
        use_q = s.usage_of(q)
        deserved = tree.deserved[q]
        r = first_over(use_q.tolist(), wants, deserved.tolist(), tree.managed[q].tolist())
        if r is None:
            return None
        if not entry.workload.preemptible:
            return Reason(
                "quota",
                f"non-preemptible workloads run only within the deserved quota of queue {q} "
                f"({fmt(deserved[r], r)} {RESOURCES[r]}; using {fmt(use_q[r], r)}, "
                f"asking {fmt(ask[r], r)})",
            )
        cap = s.capacity_vector()
        total = s.usage_total
        held_back = np.zeros(len(RESOURCES))
        for name in tree.keepers:
            if name != q:
                held_back += np.maximum(tree.reserve(name) - s.usage_of(name), 0)
        r = first_over((total + ask).tolist(), held_back.tolist(), cap.tolist())
        if r is not None:
            return Reason(
                "quota",
                f"queue {q} cannot borrow {RESOURCES[r]}: {fmt(held_back[r], r)} is kept "
                "for idle queues that do not lend it (lending limits)",
            )
        return None
