"""GPU-NIC pairing on a DGX-like node: 8 GPUs, 4 NICs, 2 GPUs and 1 NIC per PCIe switch."""

from builders import Scenario, dgx, make_workload


def test_two_gpu_task_gets_both_gpus_and_its_nic_under_one_switch():
    sc = Scenario([dgx("d0")], [make_workload("w").podset("p", gpu=2, nics=1, same_pcie=True).build()])
    sc.run()
    b = sc.bind_of("w/p-0")
    node = sc.snapshot.nodes[0]
    switches = {node.gpus[g].pcie_switch for g in b.gpus}
    assert len(b.gpus) == 2 and len(switches) == 1
    assert len(b.nics) == 1 and node.nics[b.nics[0]].pcie_switch in switches


def test_four_pairs_fill_the_node_one_switch_each():
    wl = [make_workload(f"w{k}").podset("p", gpu=2, nics=1, same_pcie=True).build() for k in range(5)]
    sc = Scenario([dgx("d0")], wl)
    last = sc.run()
    placed = [f"w{k}" for k in range(5) if sc.bound(f"w{k}")]
    assert len(placed) == 4
    nics = [sc.bind_of(f"{w}/p-0").nics[0] for w in placed]
    assert sorted(nics) == [0, 1, 2, 3]
    waiting = next(f"w{k}" for k in range(5) if not sc.bound(f"w{k}"))
    assert last.pending_for(waiting) is not None


def test_nic_on_other_switch_is_refused_when_same_switch_required():
    # occupy every NIC with CPU-only tasks, leaving GPUs free
    wl = [make_workload(f"net{k}").podset("p", nics=1).build() for k in range(4)]
    wl.append(make_workload("gpu").podset("p", gpu=2, nics=1, same_pcie=True).created(5.0).build())
    sc = Scenario([dgx("d0")], wl)
    last = sc.run()
    assert sc.bound("gpu") == 0
    assert "RDMA NIC" in last.pending_for("gpu").message
