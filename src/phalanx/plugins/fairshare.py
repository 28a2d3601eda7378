"""Fair-share queue order: queues furthest below their fair share go first (dominant resource).

A queue's standing is max over resources of usage / fair share (dominant-resource fairness),
so a queue heavy on any one resource yields to the others. With `history_weight`, usage is
blended with its time-decayed history (half-life set by the driver), so heavy past users rank lower.
"""

from __future__ import annotations

import numpy as np

from phalanx.core.queues import RESOURCES
from phalanx.core.session import Session


class FairShareOrder:
    name = "fairshare"

    def __init__(self, history_weight: float = 0.0) -> None:
        if not 0.0 <= history_weight <= 1.0:
            raise ValueError("history_weight must be in [0, 1]")
        self.history_weight = history_weight

    def standing(self, session: Session, queue: str) -> float:
        s = session.snapshot
        fair = session.fair_shares().get(queue)
        use = s.usage_of(queue)
        if self.history_weight and queue in s.queue_history:
            use = (1 - self.history_weight) * use + self.history_weight * s.queue_history[queue]
        if fair is None:
            return float(use[0])
        cap = s.capacity_vector()
        # usage relative to fair share; using a resource with no fair share ranks last
        ratios = [
            use[r] / fair[r] if fair[r] > 0 else (use[r] / cap[r] * 1e6 if use[r] > 0 else 0.0)
            for r in range(len(RESOURCES))
        ]
        return float(np.max(ratios))

    def queue_key(self, session: Session, queue: str) -> tuple[float | int | str, ...]:
        memo = ("standing", queue, session.snapshot.usage_version)
        standing = session.memo.get(memo)
        if standing is None:
            standing = session.memo[memo] = self.standing(session, queue)
        return (standing, queue)  # type: ignore[return-value]
