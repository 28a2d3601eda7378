"""The reservation's head: the oldest unbound workload of the large groups, found without a walk
over each group's whole backlog (`reserve.oldest`), is the one a walk over all of them finds."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import Scenario, make_node, make_workload
from phalanx.actions.reserve import oldest
from phalanx.profiles import compile_profile

# equal creation times, and one that never was (a spec may say .inf): ordered by name among them
CREATED = [0.0, 1.0, 2.0, 3.0, math.inf]
ALLOCATE = compile_profile({"name": "p", "tie_break": "name", "actions": [{"name": "allocate"}]})


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.sampled_from(CREATED), st.booleans()), min_size=1, max_size=14),
    st.integers(0, 6),
)
def test_oldest_per_group_finds_the_head_a_full_walk_finds(jobs, free_gpus):
    # elastic workloads (1 of 3 tasks needed) on a few GPUs: those placed first run some tasks
    # and still wait for the rest (bound, yet pending), the others wait unbound
    sc = Scenario([make_node("n0").cpu(64).memory("512Gi").gpus(8).build()], profile=ALLOCATE)
    for k, (prio, created, shape) in enumerate(jobs):
        w = make_workload(f"w{k:02d}").podset("p", 3, gpu=1 + shape).min_available(1)
        sc.add(w.priority(prio).created(created).build())
    if free_gpus:
        sc.add(make_workload("filler").podset("p", 8 - free_gpus, gpu=1).priority(9).build())
    sc.cycle()
    s = sc.snapshot
    for key, group in s.pending_groups.items():
        unbound = [e for e in group.values() if not e.bound]
        found = oldest(s, key)
        # one per priority that has an unbound workload, each that priority's oldest
        assert len(found) == len({e.workload.priority for e in unbound})
        for e in found:
            same = [x for x in unbound if x.workload.priority == e.workload.priority]
            assert e is min(same, key=lambda x: (x.workload.creation_time, x.name))
        if unbound:
            head = min(unbound, key=lambda x: (x.workload.creation_time, x.name))
            assert min(found, key=lambda x: (x.workload.creation_time, x.name)) is head


def test_a_bound_oldest_is_passed_over():
    sc = Scenario([make_node("n0").cpu(64).memory("512Gi").gpus(2).build()], profile=ALLOCATE)
    sc.add(make_workload("old").podset("p", 3, gpu=1).min_available(1).created(0.0).build())
    sc.add(make_workload("new").podset("p", 3, gpu=1).min_available(1).created(5.0).build())
    sc.cycle()
    s = sc.snapshot
    assert s.workloads["old"].bound and s.workloads["old"].name in s.partial
    ((key, group),) = s.pending_groups.items()
    assert set(group) == {"old", "new"}
    assert [e.name for e in oldest(s, key)] == ["new"]
