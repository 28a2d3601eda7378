"""The cyclic garbage collector kept off the cycle's path.

A scheduler holds the watch cache, the translations and the kept snapshot: hundreds of thousands of
long-lived objects. CPython's full collection walks every one of them (about 0.1 s per 200,000
tracked objects on our test VM) at moments of its own choosing, inside a cycle: at 5,000 nodes it
made the create->bind p99 (docs/benchmarks.md section 19). What a cycle builds holds no reference
cycles (a world and a cycle's decisions leave none behind), so reference counting frees it; after
each cycle everything alive is frozen (`gc.freeze`, which costs nothing), and later collections
walk only what is newer. Every `full_every_s` the frozen objects are let go and collected once in
full, between cycles, so that cyclic garbage (an exception's traceback, say) cannot pile up.
During a cycle the collector is off (`cycle`): its read builds the world anew where the cluster
changed (all of it at the first cycle after a start) and would otherwise be walked again and again
as it grows; what the cycle leaves is frozen after it all the same.
"""

from __future__ import annotations

import gc
import time
from contextlib import AbstractContextManager, nullcontext

from phalanx.k8s.trial.collector import collector_paused


class Heap:
    def __init__(self, full_every_s: float = 600.0) -> None:
        self.full_every_s = full_every_s  # 0: leave the collector as CPython runs it
        self.last_full: float | None = None

    def cycle(self) -> AbstractContextManager[None]:
        """The collector off for one cycle (its `after_cycle` included); as it is when off."""
        return collector_paused() if self.full_every_s > 0 else nullcontext()

    def after_cycle(self, now: float) -> float | None:
        """Freeze what is alive; every `full_every_s`, a full collection first. Returns how long
        that took (seconds), None when none ran."""
        if self.full_every_s <= 0:
            return None
        took = None
        if self.last_full is None:
            self.last_full = now
        elif now - self.last_full >= self.full_every_s:
            self.last_full = now
            t0 = time.perf_counter()
            gc.unfreeze()
            gc.collect()
            took = time.perf_counter() - t0
        gc.freeze()
        return took


__all__ = ["Heap"]
