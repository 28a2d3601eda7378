"""A world's build runs with the cyclic collector off and leaves what it built frozen."""

import gc

import pytest

from phalanx.k8s.read.bulk import collector_paused


def test_the_collector_is_off_inside_and_on_after_with_what_is_alive_frozen() -> None:
    gc.unfreeze()
    try:
        with collector_paused():
            assert not gc.isenabled()
            kept = [{"pod": k} for k in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()


def test_as_a_decorator_and_after_an_error() -> None:
    gc.unfreeze()

    @collector_paused()
    def build(fail: bool) -> bool:
        if fail:
            raise ValueError("bad manifest")
        return gc.isenabled()

    try:
        assert build(False) is False  # off during each call, not only the first
        assert build(False) is False
        with pytest.raises(ValueError):
            build(True)
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_a_collector_the_caller_turned_off_stays_off_and_nothing_is_frozen() -> None:
    gc.unfreeze()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()
