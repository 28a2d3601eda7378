"""Reclaim: a queue below its fair share takes capacity back from queues above theirs.

Preemptors are pending workloads of queues whose usage (plus the gang) stays within
max(fair share, deserved quota). Victims are preemptible workloads of other queues that
are above their fair share, and a victim is taken only if its queue stays at or above its
deserved quota. Elastic surplus goes first, then the least lost work. Nothing is evicted
unless the preemptor then fits.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from phalanx.actions.evict import Victim, evict_for, peek, victims
from phalanx.actions.gang import gang_tasks
from phalanx.core.queues import GPU
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry

EPS = 1e-6


class Reclaim:
    name = "reclaim"

    def __init__(self, min_runtime: float = 0.0, max_preemptors: int = 16) -> None:
        self.min_runtime = min_runtime
        self.max_preemptors = max_preemptors

    def execute(self, session: Session) -> None:
        s = session.snapshot
        tree = s.queues
        if tree is None:
            return
        fair = session.fair_shares()
        tries = 0
        failed: set[object] = set()  # (queue, demand) that could not reclaim: their likes cannot either
        for entry in session.ordered_pending():
            if tries >= self.max_preemptors:
                break
            gang, _ = gang_tasks(entry)
            if not gang or entry.name not in session.pending:
                continue
            q = entry.workload.queue
            if (q, entry.demand_key) in failed:
                continue
            ask = session.request_of(gang)
            entitled = np.maximum(fair.get(q, np.zeros(3)), tree.deserved[q])
            if s.usage_of(q)[GPU] + ask[GPU] > entitled[GPU] + EPS:
                continue
            over = {
                name
                for name in tree.queues
                if tree.is_leaf(name)
                and name != q
                and s.usage_of(name)[GPU] > fair.get(name, np.zeros(3))[GPU] + EPS
            }
            if not over:
                continue
            cands = peek(victims(session, partial(_in_queues, over), self.min_runtime, over))
            if cands is None:
                failed.add((q, entry.demand_key))
                continue

            def keeps_deserved(v: Victim, taken: list[Victim]) -> bool:
                """After evicting v (earlier victims are already out), its queue keeps its deserved GPUs."""
                vq = v.entry.workload.queue
                still = [a for a in v.allocs if a.task.name in s.allocations]
                left = s.usage_of(vq)[GPU] - sum(s.alloc_vector(a)[GPU] for a in still)
                return bool(left >= tree.deserved[vq][GPU] - EPS)

            tries += 1
            taken = evict_for(
                session, entry, gang, cands, f"reclaimed by queue {q} for {entry.name}", keeps_deserved
            )
            if taken is not None:
                session.pending.pop(entry.name, None)
            else:
                failed.add((q, entry.demand_key))


def _in_queues(queues: set[str], entry: WorkloadEntry) -> bool:
    return entry.workload.queue in queues
