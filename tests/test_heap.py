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


def test_a_cycle_leaves_no_reference_cycles_behind_for_the_frozen_collector_to_keep() -> None:
    """What a cycle builds must be freed by reference counting: frozen after the cycle, cyclic
    garbage would stay until the next full collection (a session per cycle did, with its memo)."""
    import numpy as np

    from builders import Scenario, make_node, make_workload
    from phalanx.core.cycle import run_cycle

    sc = Scenario([make_node(f"n{k}").gpus(8).build() for k in range(3)], profile="phalanx-queues")
    for k in range(6):
        sc.add(make_workload(f"w{k}").podset("p", count=2, gpu=2).build())
    sc.add(make_workload("big").podset("p", gpu=16).build())  # never fits: preempt and holds look
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for c in range(3):
            run_cycle(
                sc.snapshot,
                sc.prof,
                100.0 + c,
                np.random.default_rng(c),
                apply=True,
                stream=lambda w, b: None,
            )
        gc.collect()
        left = [type(x).__name__ for x in gc.garbage if type(x).__module__.startswith("phalanx")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not left, f"cyclic garbage after the cycles: {sorted(set(left))}"


def test_the_collector_is_off_during_a_cycle_and_left_alone_when_the_heap_is_off() -> None:
    with Heap(full_every_s=60.0).cycle():
        assert not gc.isenabled()
    assert gc.isenabled()
    with Heap(full_every_s=0).cycle():
        assert gc.isenabled()
