"""Multi-level gangs under random input: no partial gang at any level, in one domain where required.

Random clusters of racks and random workloads of subgroups (each its own minimum and topology),
run for a few cycles with later arrivals of higher priority (so that preemption acts too): after
every cycle a workload with any task bound has every subgroup at its minimum, and each subgroup
with a required level sits in one domain of it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.core.cycle import run_cycle
from phalanx.core.model import (
    Gpu,
    GpuRequest,
    Node,
    PodSet,
    SubGroup,
    TaskRequest,
    TopologyConstraint,
    Workload,
)
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile


@st.composite
def cluster(draw):
    out = []
    for i in range(draw(st.integers(2, 6))):
        ngpu = draw(st.sampled_from([2, 4, 8]))
        out.append(
            Node(
                f"n{i}",
                64_000,
                512 * 1024,
                topology={"rack": f"r{i // draw(st.integers(1, 3))}", "spine": f"s{i // 4}"},
                gpus=tuple(Gpu(j, "H100", 81920) for j in range(ngpu)),
            )
        )
    return out


TOPOLOGIES = [
    None,
    TopologyConstraint("rack", True),
    TopologyConstraint("node", True),
    TopologyConstraint("rack"),
]


@st.composite
def multi_level(draw, name: str, created: float):
    podsets, subs = [], []
    for k in range(draw(st.integers(1, 3))):
        count = draw(st.integers(1, 4))
        gpus = draw(st.sampled_from([1, 2, 4]))
        podsets.append(PodSet(f"g{k}", count, TaskRequest(1000, 1024, GpuRequest.whole(gpus))))
        subs.append(
            SubGroup(f"g{k}", (f"g{k}",), draw(st.integers(1, count)), draw(st.sampled_from(TOPOLOGIES)))
        )
    return Workload(
        name,
        tuple(podsets),
        priority=draw(st.integers(0, 2)),
        creation_time=created,
        topology=draw(st.sampled_from([None, TopologyConstraint("spine", True)])),
        subgroups=tuple(subs),
        preempt_whole=draw(st.booleans()),
    )


def check_levels(snap: Snapshot) -> None:
    for e in snap.workloads.values():
        if not e.bound:
            continue
        for sg in e.workload.subgroups:
            mine = [a for a in e.bound.values() if a.task.podset in sg.podsets]
            assert len(mine) >= sg.min_available, f"partial subgroup {e.name}/{sg.name}"
            t = sg.topology
            if t is not None and t.required:
                doms = {
                    snap.nodes[a.node].name if t.level == "node" else snap.nodes[a.node].topology[t.level]
                    for a in mine
                }
                assert len(doms) == 1, f"subgroup {e.name}/{sg.name} spans {doms}"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ns=cluster(),
    first=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    later=st.lists(st.integers(0, 9), min_size=0, max_size=3),
    profile=st.sampled_from(["phalanx", "phalanx-queues"]),
    data=st.data(),
)
def test_no_partial_gang_at_any_level(ns, first, later, profile, data):
    ws = [data.draw(multi_level(f"w{k}", float(k))) for k in range(len(first))]
    snap = Snapshot(ns, ws, topology_levels=["spine", "rack"])
    prof = load_profile(profile)
    rng = np.random.default_rng(0)
    for k in range(4):
        if k == 2:  # higher-priority arrivals: preemption must take whole workloads or nothing
            for j in range(len(later)):
                w = data.draw(multi_level(f"late{j}", 10.0 + j))
                snap.add_workload(Workload(**{**{f: getattr(w, f) for f in w.__slots__}, "priority": 5}))
        result = run_cycle(snap, prof, float(k), rng)
        snap.apply(result, float(k))
        check_levels(snap)


def test_a_subgroup_that_fits_nowhere_sends_the_one_before_it_elsewhere():
    """A (2 x 2 GPUs) takes rack r0 first (tie, lowest id); B (1 x 4 GPUs) then fits in no rack;
    A is tried in r1 instead, and B takes r0's node."""
    gpus = {"n0": 4, "n1": 2, "n2": 2}
    racks = {"n0": "r0", "n1": "r1", "n2": "r1"}
    ns = [
        Node(
            n,
            16_000,
            64 * 1024,
            topology={"rack": racks[n]},
            gpus=tuple(Gpu(j, "H100", 81920) for j in range(k)),
        )
        for n, k in gpus.items()
    ]
    rack = TopologyConstraint("rack", True)
    w = Workload(
        "w",
        (
            PodSet("a", 2, TaskRequest(1000, 1024, GpuRequest.whole(2))),
            PodSet("b", 1, TaskRequest(1000, 1024, GpuRequest.whole(4))),
        ),
        subgroups=(SubGroup("a", ("a",), 2, rack), SubGroup("b", ("b",), 1, rack)),
    )
    snap = Snapshot(ns, [w], topology_levels=["rack"])
    r = run_cycle(snap, load_profile("phalanx"), 0.0, np.random.default_rng(0))
    where = {b.task.split("/")[-1]: b.node for b in r.binds}
    assert where == {"a-0": where["a-0"], "a-1": where["a-1"], "b-0": "n0"}
    assert {where["a-0"], where["a-1"]} == {"n1", "n2"}
