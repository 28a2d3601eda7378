"""The cyclic garbage collector off while a one-shot command reads a capture and replays a cycle.

Reading a capture and building its world makes hundreds of thousands of objects that live to the
command's end, and CPython's full collections walk all of them each time enough new ones pile
up: on a captured 5,000-node cluster, eleven full walks took 1.2 s of `schedule --capture`'s
4.6 s replay and freed nothing. The work is bounded (one world, one cycle), so the collector is
off for it and on again after; the few reference cycles made meanwhile are collected then.
Nothing is frozen here: the scheduler's loop pauses it for a cycle only under its own policy,
which freezes after each cycle and collects in full now and then (`phalanx.k8s.loop.heap`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off for the block or the decorated call (if it was on), on again after."""
    if not gc.isenabled():  # off already (a nested pause, or the caller's choice): leave it
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
