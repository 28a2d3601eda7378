"""Placement by the distributed dataset cache, in the core: only nodes that run the cache's mount
can host a task reading a distributed dataset (told why otherwise), and a gang goes to the rack
holding most of the dataset's chunks. A per-node dataset or no dataset is placed as before."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from builders import Scenario, make_node, make_workload
from phalanx.core.model import Node, TaskRequest, Workload
from phalanx.core.snapshot import Snapshot
from phalanx.plugins.locality import DatasetMountFilter, DataTopologyPlanner, facts
from phalanx.profiles import load_profile

DS = "team-a/laion"
GiB = 2**30


def node(
    name: str, rack: str, *, mount: bool = True, held: int = 0, spine: str = "s0", gpus: int = 4
) -> Node:
    n = make_node(name).gpus(gpus).rack(rack, spine).build()
    return replace(n, distcache_mount=mount, distcache_bytes={DS: held} if held else {})


def reading(w: Workload, dataset: str = DS) -> Workload:
    """`w` with every pod set reading `dataset` from the distributed cache."""
    sets = tuple(
        replace(ps, request=replace(ps.request, dataset=dataset, dataset_distributed=True))
        for ps in w.podsets
    )
    return replace(w, podsets=sets)


def pending_text(sc: Scenario, workload: str) -> str:
    p = sc.pending(workload)
    assert p is not None
    return p.message


def test_task_goes_only_to_a_node_running_the_mount() -> None:
    # packing alone would pick the fuller node "a" (the mount-less one)
    nodes = [node("a", "r1", mount=False, gpus=2), node("b", "r1", gpus=8)]
    w = reading(make_workload("w").podset("p", gpu=1).build())
    sc = Scenario(nodes, [w])
    sc.run()
    assert sc.bind_of("w/p-0").node == "b"


@pytest.mark.parametrize("profile", ["phalanx", "phalanx-queues", "k8s-default"])
def test_no_mount_anywhere_waits_and_says_so(profile: str) -> None:
    nodes = [node("a", "r1", mount=False), node("b", "r1", mount=False)]
    sc = Scenario(nodes, [reading(make_workload("w").podset("p", gpu=1).build())], profile=profile)
    sc.run()
    assert not sc.snapshot.allocations
    text = pending_text(sc, "w")
    assert f"dataset {DS} is cached distributed; no node runs the distributed cache's mount" in text
    assert "(label the cache nodes phalanx.io/distcache=true): no mount on 2 nodes" in text


def test_mount_nodes_full_waits_and_says_so() -> None:
    nodes = [node("a", "r1", mount=False), replace(node("b", "r1", gpus=1), labels={"pool": "b"})]
    busy = make_workload("busy").podset("p", gpu=1, selector={"pool": "b"}).build()
    sc = Scenario(nodes, [busy])
    sc.run()
    assert sc.bind_of("busy/p-0").node == "b"
    sc.add(reading(make_workload("w").podset("p", gpu=1).build()))
    sc.run()
    assert "w/p-0" not in sc.snapshot.allocations
    text = pending_text(sc, "w")
    assert f"dataset {DS} is cached distributed; no room on the 1 node(s) that run its mount" in text
    assert "and no mount on 1 node" in text


def test_gang_goes_to_the_rack_holding_the_chunks() -> None:
    # r1 sorts first and is as good by capacity: the topology planner alone would pick it
    nodes = [
        node("a1", "r1"),
        node("a2", "r1"),
        node("b1", "r2", held=30 * GiB),
        node("b2", "r2", held=40 * GiB),
        node("c1", "r3", held=2 * GiB),
        node("c2", "r3"),
    ]
    gang = reading(make_workload("g").podset("p", 2, gpu=4).min_available(2).build())
    for profile in ("phalanx", "phalanx-queues"):
        sc = Scenario(nodes, [gang], profile=profile)
        sc.run()
        assert {sc.bind_of(f"g/p-{k}").node for k in range(2)} == {"b1", "b2"}, profile


def test_data_spread_evenly_over_the_members_leaves_the_topology_planners_order() -> None:
    """Blocks spread evenly (the twin; SeaweedFS roughly): every rack holds as much per member, so
    none is nearer the data, and the gang packs as it would with no dataset (here onto a1 alone).
    Ordering by bytes here cost 7-8 % of the average JCT on the Gavel replay."""
    nodes = [
        node("a1", "r1", held=10 * GiB, gpus=8),
        node("a2", "r1", held=10 * GiB, gpus=8),
        node("b1", "r2", held=10 * GiB),
        node("b2", "r2", held=10 * GiB),
    ]
    gang = reading(make_workload("g").podset("p", 2, gpu=4).min_available(2).build())
    sc = Scenario(nodes, [gang])
    sc.run()
    plain = Scenario([replace(n, distcache_bytes={}) for n in nodes], [gang])
    plain.run()
    got = {sc.bind_of(f"g/p-{k}").node for k in range(2)}
    assert got == {plain.bind_of(f"g/p-{k}").node for k in range(2)} == {"a1"}


def test_racks_holding_as_much_go_tightest_first_not_by_name() -> None:
    # r2 and r3 hold more per member than r1, and as much as each other: the tighter, r3, first
    nodes = [
        node("a1", "r1", held=GiB, gpus=8),
        node("b1", "r2", held=20 * GiB, gpus=8),
        node("b2", "r2", held=20 * GiB, gpus=8),
        node("c1", "r3", held=20 * GiB),
        node("c2", "r3", held=20 * GiB),
    ]
    gang = reading(make_workload("g").podset("p", 2, gpu=4).min_available(2).build())
    sc = Scenario(nodes, [gang])
    sc.run()
    assert {sc.bind_of(f"g/p-{k}").node for k in range(2)} == {"c1", "c2"}


def test_gang_without_room_near_the_data_goes_elsewhere_on_mount_nodes() -> None:
    nodes = [
        node("a1", "r1"),
        node("a2", "r1"),
        node("b1", "r2", held=GiB, gpus=2),
        node("x", "r2", mount=False),
    ]
    gang = reading(make_workload("g").podset("p", 2, gpu=4).min_available(2).build())
    sc = Scenario(nodes, [gang])
    sc.run()
    assert {sc.bind_of(f"g/p-{k}").node for k in range(2)} == {"a1", "a2"}


def test_single_task_scores_by_bytes_in_its_rack_and_spine() -> None:
    nodes = [
        node("a", "r1", spine="s1"),
        node("b", "r2", spine="s2"),  # same spine as the data, another rack
        node("c", "r3", spine="s2", held=10 * GiB, mount=False),  # a volume server without the mount
    ]
    sc = Scenario(nodes, [reading(make_workload("w").podset("p", gpu=1).build())])
    near = facts(sc.snapshot).near(DS)
    assert np.allclose(near, [0.0, 0.5, 1.0])
    sc.run()
    assert sc.bind_of("w/p-0").node == "b"


def test_per_node_and_plain_tasks_are_untouched() -> None:
    nodes = [node("a", "r1", mount=False, held=GiB), node("b", "r2", mount=False)]
    s = Snapshot(nodes, topology_levels=("spine", "rack"))
    f = DatasetMountFilter()
    plain = make_workload("w").podset("p", gpu=1, dataset=DS).build()
    task = plain.tasks()[0]
    assert f.excluded(None, task) is None  # type: ignore[arg-type]
    assert f.class_key(None, task, task.request) == ()  # type: ignore[arg-type]
    assert not facts(s).mount.any()
    # a per-node dataset still goes by per-node copies (here: none), the mount-less nodes are fine
    sc = Scenario(nodes, [plain], datasets={DS: GiB})
    sc.run()
    assert sc.bind_of("w/p-0").node in {"a", "b"}


def test_profiles_name_the_filter_and_the_planner() -> None:
    for name in ("phalanx", "phalanx-queues"):
        p = load_profile(name)
        assert any(f.name == "dataset-mount" for f in p.filters)
        assert isinstance(p.gang_planner, DataTopologyPlanner)
    assert any(f.name == "dataset-mount" for f in load_profile("k8s-default").filters)


def test_request_shape_tells_distributed_apart() -> None:
    a = TaskRequest(dataset=DS)
    assert a.shape_key != replace(a, dataset_distributed=True).shape_key
