"""A one-shot command's capture read and replay run with the cyclic collector off, and leave it on."""

import gc
import weakref

import pytest

from phalanx.k8s.trial.collector import collector_paused


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_the_collector_is_off_inside_and_on_after_and_nothing_is_frozen() -> None:
    gc.unfreeze()
    with collector_paused():
        assert not gc.isenabled()
        left = Node()
        kept = weakref.ref(left)
        del left
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0  # nothing frozen: what the pause made stays collectable
    gc.collect()
    assert kept() is None


def test_as_a_decorator_and_after_an_error() -> None:
    @collector_paused()
    def build(fail: bool) -> bool:
        if fail:
            raise ValueError("bad manifest")
        return gc.isenabled()

    assert build(False) is False  # off during each call, not only the first
    assert build(False) is False
    with pytest.raises(ValueError):
        build(True)
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
