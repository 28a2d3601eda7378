"""Dynamic MIG (issue 42): idle MIG GPUs cut anew for the slices the queue waits for, never one in
use, at most once an interval, the GPU out of service while it is cut; the cycle wakes when it is ready."""

from __future__ import annotations

from dataclasses import replace

import pytest

from builders import Scenario, make_node, make_workload
from phalanx.actions.repartition import cut_for
from phalanx.core.mig import GEOMETRIES
from phalanx.core.model import MigInstance, Node
from phalanx.profiles import compile_profile

A100 = GEOMETRIES["A100-80GB"]


def node(layouts: dict[int, list[str]]) -> Node:
    """An A100-80GB node whose MIG GPUs are cut as given (`profile@start` per GPU)."""
    n = (
        make_node("a100")
        .cpu(64)
        .memory("512Gi")
        .gpus(len(layouts), model="A100", memory="80Gi", mig=True)
        .build()
    )
    inst = {
        j: tuple(MigInstance(p, int(s)) for p, _, s in (x.partition("@") for x in xs))
        for j, xs in layouts.items()
    }
    return replace(n, mig_instances=inst)


def profile(**args: float) -> object:
    return compile_profile(
        {
            "name": "dyn",
            "tie_break": "name",
            "actions": [{"name": "allocate"}, {"name": "repartition", "args": {"recut_s": 60, **args}}],
            "order": [{"name": "priority"}],
        }
    )


def test_a_layout_for_waiting_slices_takes_the_largest_first_and_fills_with_the_smallest() -> None:
    served, layout = cut_for(A100, ["1g.10gb", "3g.40gb", "1g.10gb"])
    assert served == [0, 1, 2]
    # 3g.40gb on slots 0-3, 1g.10gb on 4, 5, 6 (a 1g never starts at slot 7: 7 compute slices)
    assert layout == {("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6)}


def test_idle_gpus_cut_whole_are_recut_for_waiting_one_g_slices_and_serve_them_when_ready() -> None:
    sc = Scenario([node({0: ["7g.80gb@0"], 1: ["7g.80gb@0"]})], profile=profile())
    sc.add(make_workload("infer").podset("p", 4, mig="1g.10gb").build())
    r = sc.cycle()
    assert sc.bound("infer") == 0
    (cut,) = r.repartitions  # one GPU is enough for the 4 slices
    assert (
        cut.gpu == 0 and cut.before == ("7g.80gb@0",) and len(cut.after) == 7 and cut.until == sc.clock + 60
    )
    assert r.wake is not None and r.wake.at == cut.until
    sc.clock += 30  # still being cut: nothing is placed on it
    r = sc.cycle()
    assert sc.bound("infer") == 0 and not r.repartitions
    sc.clock = cut.until
    sc.cycle()
    assert sc.bound("infer") == 4
    assert {sc.bind_of(f"infer/p-{k}").gpus for k in range(4)} == {(0,)}


def test_a_gpu_with_a_slice_in_use_is_never_cut_and_none_twice_in_an_interval() -> None:
    sc = Scenario([node({0: ["3g.40gb@0", "3g.40gb@4"]})], profile=profile(min_interval_s=3600))
    sc.add(make_workload("big").podset("p", 1, mig="3g.40gb").build())
    sc.cycle()
    assert sc.bound("big") == 1
    sc.add(make_workload("small").podset("p", 5, mig="1g.10gb").build())
    r = sc.cycle()
    assert not r.repartitions  # its other 3g is free, but one is in use
    sc.complete("big")
    r = sc.cycle()
    assert len(r.repartitions) == 1
    sc.clock = r.repartitions[0].until
    sc.cycle()
    assert sc.bound("small") == 5
    sc.complete("small")
    sc.add(make_workload("big2").podset("p", 2, mig="3g.40gb").build())
    r = sc.cycle()
    assert not r.repartitions and sc.bound("big2") == 0  # cut less than an hour ago: not again yet


@pytest.mark.parametrize("bad", [{"recut_s": -1}, {"max_per_cycle": 0}])
def test_bad_arguments_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="recut_s"):
        profile(**bad)


def test_the_twin_replays_mig_jobs_and_a_recut() -> None:
    from phalanx.core.errors import SpecError
    from phalanx.sim.jobs import JobSpec
    from phalanx.sim.replay import replay

    jobs = [JobSpec(f"i{k}", 10.0 * k, 600.0, 1, mig="1g.10gb") for k in range(3)]
    assert jobs[0].workload().podsets[0].request.gpu.mig_profile == "1g.10gb"
    assert jobs[0].gpu_amount == pytest.approx(1 / 7)
    with pytest.raises(SpecError, match="one slice"):
        JobSpec("bad", 0.0, 60.0, 2, mig="1g.10gb", tasks=1)
    fixed = replay([node({0: ["7g.80gb@0"]})], jobs, profile(min_interval_s=0, max_per_cycle=1))
    assert all(r.start is not None for r in fixed.jobs)
    assert min(r.start for r in fixed.jobs if r.start is not None) == pytest.approx(60.0)  # after the recut
    static = compile_profile(
        {"name": "s", "actions": [{"name": "allocate"}], "order": [{"name": "priority"}]}
    )
    assert all(r.start is None for r in replay([node({0: ["7g.80gb@0"]})], jobs, static).jobs)
