"""Topology: gangs packed into the fewest domains at the lowest level that fits; required levels honoured."""

from builders import Scenario, dgx, make_node, make_workload


def racks():
    # rack r0: 2 nodes, rack r1: 3 nodes, all in one spine
    return [dgx("a0", "r0"), dgx("a1", "r0"), dgx("b0", "r1"), dgx("b1", "r1"), dgx("b2", "r1")]


def test_gang_that_fits_one_node_stays_on_it():
    sc = Scenario(racks(), [make_workload("w").podset("p", 4, gpu=2).build()])
    sc.run()
    nodes = {sc.bind_of(f"w/p-{k}").node for k in range(4)}
    assert len(nodes) == 1


def test_gang_spanning_nodes_is_packed_into_one_rack():
    sc = Scenario(racks(), [make_workload("w").podset("p", 2, gpu=8).build()])
    sc.run()
    nodes = [sc.bind_of(f"w/p-{k}").node for k in range(2)]
    rack = {sc.snapshot.nodes[sc.snapshot.node_index(n)].topology["rack"] for n in nodes}
    assert len(rack) == 1
    assert len(set(nodes)) == 2


def test_tightest_rack_is_chosen_so_big_racks_stay_whole():
    sc = Scenario(racks(), [make_workload("w").podset("p", 2, gpu=8).build()])
    sc.run()
    assert {sc.bind_of(f"w/p-{k}").node for k in range(2)} == {"a0", "a1"}


def test_required_rack_is_honoured_even_when_the_cluster_has_room():
    wl = [
        make_workload("filler").podset("p", 1, gpu=8).build(),
        make_workload("w").podset("p", 3, gpu=8).topology("rack", required=True).created(1.0).build(),
    ]
    nodes = [dgx("a0", "r0"), dgx("a1", "r0"), dgx("b0", "r1"), dgx("b1", "r1")]
    sc = Scenario(nodes, wl)
    last = sc.run()
    assert sc.bound("w") == 0
    p = last.pending_for("w")
    assert p is not None and "rack" in p.message


def test_preferred_rack_falls_back_to_the_cluster():
    wl = [make_workload("w").podset("p", 3, gpu=8).topology("rack", required=False).build()]
    nodes = [dgx("a0", "r0"), dgx("a1", "r0"), dgx("b0", "r1"), dgx("b1", "r1")]
    sc = Scenario(nodes, wl)
    sc.run()
    assert sc.bound("w") == 3


def test_gpus_inside_a_node_stay_on_one_pcie_switch():
    sc = Scenario([dgx("d0")], [make_workload("w").podset("p", gpu=2).build()])
    sc.run()
    b = sc.bind_of("w/p-0")
    node = sc.snapshot.nodes[0]
    assert len({node.gpus[g].pcie_switch for g in b.gpus}) == 1


def test_locality_prefers_the_node_holding_the_dataset():
    nodes = [make_node(f"n{k}").gpus(2).build() for k in range(3)]
    nodes.append(make_node("cached").gpus(2).dataset("imagenet", 150 * 2**30).build())
    sc = Scenario(
        nodes,
        [make_workload("w").podset("p", gpu=1, dataset="imagenet").build()],
        datasets={"imagenet": 150 * 2**30},
    )
    sc.run()
    assert sc.bind_of("w/p-0").node == "cached"


def test_partly_cached_dataset_scores_by_fraction():
    nodes = [
        make_node("half").gpus(1).dataset("d", 50).build(),
        make_node("most").gpus(1).dataset("d", 90).build(),
    ]
    sc = Scenario(nodes, [make_workload("w").podset("p", gpu=1, dataset="d").build()], datasets={"d": 100})
    sc.run()
    assert sc.bind_of("w/p-0").node == "most"
