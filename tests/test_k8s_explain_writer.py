"""The explanations' background writer keeps one write per object and says first words first.

Found by a churn run (bench_churn --full): waiting gangs' reasons name the free GPUs, which move
with every bind, so every cycle queued a new Event for each waiting pod; the writer fell minutes
behind and gangs made later waited over a minute with no Event and no PodGroup status.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from phalanx.k8s.act.explain import Writer


def _slow(log: list[str], what: str, gate: threading.Event | None = None) -> Callable[[], None]:
    """A write that notes itself (after `gate`, if given) and takes a moment, as an API call does."""

    def write() -> None:
        if gate is not None:
            gate.wait(5)
        log.append(what)
        time.sleep(0.002)

    return write


def test_rewrites_of_one_object_take_the_queued_ones_place() -> None:
    w, log, gate = Writer(), list[str](), threading.Event()
    w.submit("block", _slow(log, "block", gate))
    time.sleep(0.05)  # the writer is inside the first write
    for cycle in range(500):
        for p in range(40):
            w.submit(f"an event on p{p}", _slow(log, f"p{p}@{cycle}"), key=f"p{p}")
    assert w.pending() == 40 and w.replaced == 499 * 40
    gate.set()
    w.flush()
    assert log == ["block"] + [f"p{p}@499" for p in range(40)]  # each pod once, with its last text
    w.close()


def test_a_first_word_goes_before_the_rewrites_queued_earlier() -> None:
    w, log, gate = Writer(), list[str](), threading.Event()
    w.submit("block", _slow(log, "block", gate))
    time.sleep(0.05)
    for p in range(100):
        w.submit(f"an event on old{p}", _slow(log, f"old{p}"), key=f"old{p}")
    w.submit("an event on new", _slow(log, "new"), key="new", first=True)
    w.submit("the status of pg/new", _slow(log, "pg-new"), first=True)
    gate.set()
    w.flush()
    assert log[:3] == ["block", "new", "pg-new"]
    assert len(log) == 103
    w.close()


def test_a_write_of_another_kind_is_queued_behind_so_every_step_is_said_in_order() -> None:
    w, log, gate = Writer(), list[str](), threading.Event()
    w.submit("block", _slow(log, "block", gate))
    time.sleep(0.05)
    w.submit("e", _slow(log, "Preempting 1"), key="p", kind="Preempting", first=True)
    w.submit("e", _slow(log, "Preempting 2"), key="p", kind="Preempting")
    w.submit("e", _slow(log, "FailedScheduling 1"), key="p", kind="FailedScheduling")
    w.submit("e", _slow(log, "FailedScheduling 2"), key="p", kind="FailedScheduling")
    w.submit("e", _slow(log, "Scheduled"), key="p", kind="Scheduled")
    w.submit("e", _slow(log, "Preempted"), key="p", kind="Preempted", first=True)
    gate.set()
    w.flush()
    assert log == ["block", "Preempting 2", "FailedScheduling 2", "Scheduled", "Preempted"]
    w.close()


def test_overflow_is_dropped_and_counted_and_close_stops() -> None:
    w, log, gate = Writer(capacity=3), list[str](), threading.Event()
    w.submit("block", _slow(log, "block", gate))
    time.sleep(0.05)
    took = [w.submit(f"e{k}", _slow(log, f"e{k}"), key=f"k{k}") for k in range(5)]
    assert took == [True, True, True, False, False] and w.dropped == 2
    gate.set()
    w.close()
    assert not w.is_alive() and log == ["block", "e0", "e1", "e2"]
    assert not w.submit("late", _slow(log, "late"))
