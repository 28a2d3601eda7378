"""The cyclic garbage collector kept off a world's build, and off what it built.

Building a world makes tens of thousands of long-lived objects (the objects read, each pod's
translation and task, the snapshot's records), and CPython's collector walks everything alive
each time enough new objects pile up: on a captured 5,000-node cluster those walks were a quarter
of `schedule --capture`'s replay, and they collected almost nothing. A world holds no reference
cycles (see `phalanx.k8s.loop.heap`), so the build runs with the collector off, and what is alive
after it is frozen (`gc.freeze`: later collections do not walk it), as the scheduler's loop
freezes after each cycle; the loop's periodic full collection lets frozen objects go again.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off for the block or the decorated call (if it was on); then what is alive
    frozen, and the collector back on."""
    if not gc.isenabled():  # paused already (a nested build, or the caller's choice): leave it
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
