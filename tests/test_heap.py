"""The collector is frozen after each cycle and run in full between cycles now and then."""

import gc

from phalanx.k8s.loop.heap import Heap


def test_what_is_alive_is_frozen_and_a_full_collection_runs_between_cycles_every_interval() -> None:
    try:
        h = Heap(full_every_s=60.0)
        assert h.after_cycle(0.0) is None
        assert gc.get_freeze_count() > 0
        garbage = [[]]
        garbage[0].append(garbage)  # a reference cycle made after the freeze
        del garbage
        assert h.after_cycle(30.0) is None  # not due
        took = h.after_cycle(61.0)
        assert took is not None and took >= 0.0
        assert gc.get_freeze_count() > 0  # frozen again after the full collection
        assert h.after_cycle(100.0) is None
    finally:
        gc.unfreeze()


def test_off_leaves_the_collector_alone() -> None:
    gc.unfreeze()
    assert Heap(full_every_s=0).after_cycle(0.0) is None
    assert gc.get_freeze_count() == 0
