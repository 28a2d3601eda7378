"""Fractional GPUs, accounted per device: compute share and memory."""

from builders import Scenario, make_node, make_workload


def one_gpu(memory="40Gi"):
    return [make_node("n0").gpus(1, model="A100", memory=memory).build()]


def test_half_third_fifth_fill_one_gpu():
    wl = [make_workload(f"w{k}").podset("p", fraction=f).build() for k, f in enumerate((0.5, 0.3, 0.2))]
    sc = Scenario(one_gpu(), wl)
    sc.run()
    assert all(sc.bound(f"w{k}") == 1 for k in range(3))
    c = sc.snapshot.cluster
    assert c.gpu_milli_free[0, 0] == 0
    binds = sc.binds()
    assert {b.gpu_milli for b in binds} == {500, 300, 200}
    assert all(b.gpus == (0,) for b in binds)
    # nothing else fits on a full GPU
    sc.add(make_workload("extra").podset("p", fraction=0.1).build())
    last = sc.run()
    assert sc.bound("extra") == 0
    assert "insufficient GPU share" in last.pending_for("extra").message


def test_two_sixty_percent_shares_never_share_a_gpu():
    nodes = [make_node("n0").gpus(2, model="A100", memory="40Gi").build()]
    wl = [make_workload(f"w{k}").podset("p", fraction=0.6).build() for k in range(3)]
    sc = Scenario(nodes, wl)
    sc.run()
    placed = [w for w in ("w0", "w1", "w2") if sc.bound(w)]
    assert len(placed) == 2
    gpus = [sc.bind_of(f"{w}/p-0").gpus for w in placed]
    assert gpus[0] != gpus[1]


def test_gpu_memory_20000_mib_on_a_40_gib_gpu():
    wl = [make_workload(f"m{k}").podset("p", gpu_memory=20000).build() for k in range(3)]
    sc = Scenario(one_gpu("40Gi"), wl)
    last = sc.run()
    assert sc.bound("m0") == 1 and sc.bound("m1") == 1
    assert sc.bound("m2") == 0
    b = sc.bind_of("m0/p-0")
    assert b.gpu_memory_mib == 20000
    assert b.gpu_milli == 489  # ceil(20000 / 40960 * 1000)
    assert sc.snapshot.cluster.gpu_mem_free[0, 0] == 40960 - 40000
    assert "insufficient GPU memory" in last.pending_for("m2").message


def test_fraction_and_memory_share_the_same_device_accounting():
    wl = [
        make_workload("f").podset("p", fraction=0.5).build(),
        make_workload("m").podset("p", gpu_memory=20480).build(),
        make_workload("x").podset("p", gpu_memory=1024).build(),
    ]
    sc = Scenario(one_gpu("40Gi"), wl)
    sc.run()
    assert sc.bound("f") == 1 and sc.bound("m") == 1
    assert sc.bound("x") == 0  # memory is exhausted even though 0 milli is free too


def test_multi_device_fraction_uses_distinct_gpus():
    nodes = [make_node("n0").gpus(4, model="A100", memory="40Gi").build()]
    wl = [make_workload("w").podset("p", fraction=0.5, devices=3).build()]
    sc = Scenario(nodes, wl)
    sc.run()
    b = sc.bind_of("w/p-0")
    assert len(set(b.gpus)) == 3 and b.gpu_milli == 500


def test_k8s_default_takes_a_whole_gpu_for_a_fraction():
    wl = [make_workload(f"w{k}").podset("p", fraction=0.25).build() for k in range(2)]
    sc = Scenario(one_gpu(), wl, profile="k8s-default")
    sc.run()
    assert sc.bound("w0") + sc.bound("w1") == 1
