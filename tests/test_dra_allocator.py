"""The DRA claim allocator, case by case (after the Kubernetes structured allocator's test table),
and DRA tasks through `run_cycle`: gangs whole or not at all, devices charged as GPUs."""

from __future__ import annotations

import numpy as np
import pytest

from dra_objects import GI, GPU_CLASS, MIG_CLASS, NIC_CLASS, ROOT, claim, dgx, gpu, mig_node, paired, request
from phalanx.core.cycle import run_cycle
from phalanx.core.dra import (
    Attr,
    ClaimConstraint,
    DeviceRequest,
    DeviceTaint,
    DeviceToleration,
    DraDevice,
    ExactRequest,
)
from phalanx.core.drafit import try_node
from phalanx.core.errors import SpecError
from phalanx.core.feasibility import find_candidates
from phalanx.core.model import Node, PodSet, TaskRequest, Workload
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile


def snap(*nodes: Node) -> Snapshot:
    return Snapshot(list(nodes))


def devices_of(out) -> list[str]:
    return [f"{r.request}={r.device}" for a in out.allocations for r in a.results]


def test_one_device_and_a_selector_that_matches_none():
    s = snap(dgx("n0", gpus=1, nics=0))
    out = try_node(s, 0, [claim("ns/a", request("gpu"))])
    assert devices_of(out) == ["gpu=gpu-0"]
    pick_a100 = request(
        "gpu", (*GPU_CLASS, "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A100')")
    )
    out = try_node(s, 0, [claim("ns/b", pick_a100)])
    assert out.allocations is None
    assert "claim ns/b, request gpu: no device matches class gpu.nvidia.com" in out.why and "A100" in out.why


def test_count_all_and_devices_in_use():
    s = snap(dgx("n0", gpus=2, nics=0))
    assert try_node(s, 0, [claim("ns/a", request("gpu", count=3))]).allocations is None
    everything = DeviceRequest("gpu", ExactRequest("gpu", "gpu.nvidia.com", GPU_CLASS, all=True))
    out = try_node(s, 0, [claim("ns/all", everything)])
    assert devices_of(out) == ["gpu=gpu-0", "gpu=gpu-1"]
    s.dra.take(try_node(s, 0, [claim("ns/one", request("gpu"))]).allocations[0], s.dra_devices)
    assert try_node(s, 0, [claim("ns/all2", everything)]).allocations is None  # all, but one is taken
    assert devices_of(try_node(s, 0, [claim("ns/c", request("gpu"))])) == ["gpu=gpu-1"]


def test_match_attribute_backtracks_to_gpus_beside_a_free_nic():
    s = snap(dgx("n0"))  # roots 0..3: 2 GPUs + 1 NIC each
    taken = claim("ns/nic0", request("nic", NIC_CLASS, cls="dranet"))
    s.dra.take(try_node(s, 0, [taken]).allocations[0], s.dra_devices)  # nic-0, on root 0
    pair = claim(
        "ns/pair",
        request("gpus", count=2),
        request("nic", NIC_CLASS, cls="dranet"),
        constraints=(ClaimConstraint(("gpus", "nic"), match_attribute=ROOT),),
    )
    out = try_node(s, 0, [pair])
    assert devices_of(out) == ["gpus=gpu-2", "gpus=gpu-3", "nic=nic-1"]  # root 0's NIC is gone: root 1


def test_four_pairs_on_one_node_and_a_fifth_that_does_not_fit():
    s = snap(dgx("n0"))
    out = try_node(s, 0, [paired("ns/p")])
    roots = {}
    for a in out.allocations:
        for r in a.results:
            d = s.dra_devices[r.id]
            roots.setdefault(r.request.split("-")[1], set()).add(d.attribute(ROOT).value)
    assert len(devices_of(out)) == 12 and all(len(v) == 1 for v in roots.values())
    s.dra.take(out.allocations[0], s.dra_devices)
    assert try_node(s, 0, [paired("ns/q", pairs=1)]).allocations is None


def test_distinct_attribute_and_first_available():
    s = snap(dgx("n0"))
    spread = claim(
        "ns/d", request("gpus", count=2), constraints=(ClaimConstraint(("gpus",), distinct_attribute=ROOT),)
    )
    assert devices_of(try_node(s, 0, [spread])) == ["gpus=gpu-0", "gpus=gpu-2"]
    h200 = ExactRequest(
        "h200", "gpu.nvidia.com", (*GPU_CLASS, "device.attributes['gpu.nvidia.com'].productName == 'H200'")
    )
    any_gpu = ExactRequest("any", "gpu.nvidia.com", GPU_CLASS)
    out = try_node(s, 0, [claim("ns/f", DeviceRequest("gpu", first_available=(h200, any_gpu)))])
    assert devices_of(out) == ["gpu/any=gpu-0"]


def test_partitionable_mig_devices_and_the_full_gpu_share_counters():
    s = snap(mig_node("m0"))
    mig = request("mig", (*MIG_CLASS, "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"))
    first = try_node(s, 0, [claim("ns/a", mig)])
    assert devices_of(first) == ["mig=gpu-0-mig-3g.40gb-0"]
    s.dra.take(first.allocations[0], s.dra_devices)
    assert try_node(s, 0, [claim("ns/full", request("gpu"))]).allocations is None  # counters used
    second = try_node(s, 0, [claim("ns/b", mig)])
    assert devices_of(second) == ["mig=gpu-0-mig-3g.40gb-4"]
    s.dra.take(second.allocations[0], s.dra_devices)
    out = try_node(s, 0, [claim("ns/c", mig)])
    assert out.allocations is None and "free device(s) needed" in out.why  # both slices are taken


def test_consumable_capacity_shares_a_gpu_by_memory():
    s = snap(dgx("n0", gpus=1, nics=0, multi=True))
    thirty = request("mem", capacity={"gpu.nvidia.com/memory": 30 * GI * 1000})
    a = try_node(s, 0, [claim("ns/a", thirty)])
    (res,) = a.allocations[0].results
    assert res.consumed == {"gpu.nvidia.com/memory": 30 * GI * 1000} and res.share_id
    s.dra.take(a.allocations[0], s.dra_devices)
    b = try_node(s, 0, [claim("ns/b", thirty)])
    assert b.allocations is not None and b.allocations[0].results[0].share_id != res.share_id
    s.dra.take(b.allocations[0], s.dra_devices)
    c = try_node(s, 0, [claim("ns/c", thirty)])  # 60 of 80 GiB used: 30 more do not fit
    assert c.allocations is None and "not enough capacity" in c.why
    odd = request(
        "odd", capacity={"gpu.nvidia.com/memory": 10 * GI * 1000 + 1}
    )  # rounded up to the 1 MiB step
    d = try_node(s, 0, [claim("ns/d", odd)])
    assert d.allocations[0].results[0].consumed["gpu.nvidia.com/memory"] == (10 * GI + 2**20) * 1000


def test_taints_need_tolerations_and_admin_access_sees_devices_in_use():
    d = gpu("n0", 0, 0)
    tainted = DraDevice(
        **{**{f: getattr(d, f) for f in d.__slots__}, "taints": (DeviceTaint("broken", "yes"),)}
    )
    s = snap(Node("n0", 1000, 1000, dra=(tainted,)))
    assert try_node(s, 0, [claim("ns/a", request("gpu"))]).allocations is None
    tol = request("gpu", tolerations=(DeviceToleration("broken", "Exists"),))
    held = try_node(s, 0, [claim("ns/b", tol)])
    assert devices_of(held) == ["gpu=gpu-0"]
    s.dra.take(held.allocations[0], s.dra_devices)
    admin = request("gpu", tolerations=(DeviceToleration("broken", "Exists"),), admin_access=True)
    out = try_node(s, 0, [claim("ns/monitor", admin)])
    assert out.allocations is not None and out.allocations[0].results[0].admin_access


def test_bad_selectors_are_errors_that_name_the_claim():
    s = snap(dgx("n0", gpus=1, nics=0))
    out = try_node(s, 0, [claim("ns/x", request("gpu", ("device.driver == ",)))])
    assert out.allocations is None and "claim ns/x" in out.why and "does not compile" in out.why
    missing = request("gpu", (*GPU_CLASS, "device.attributes['gpu.nvidia.com'].nosuch == 1"))
    out = try_node(s, 0, [claim("ns/y", missing)])
    assert out.allocations is None and "CEL runtime error" in out.why and "gpu.nvidia.com/n0/gpu-0" in out.why


def test_quantity_and_semver_in_selectors():
    s = snap(dgx("n0", gpus=1, nics=0))
    big = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"
    new = "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.0.0'))"
    huge = "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('100Gi'))"
    assert try_node(s, 0, [claim("ns/a", request("gpu", (*GPU_CLASS, big, new)))]).allocations is not None
    assert try_node(s, 0, [claim("ns/b", request("gpu", (*GPU_CLASS, huge)))]).allocations is None


def _gang(name: str, n: int, claims_of, **kw) -> Workload:
    tasks = []
    for k in range(n):
        req = TaskRequest(cpu_milli=1000, memory_mib=1024, claims=(claims_of(k),), **kw)
        tasks.append(PodSet(f"ps{k}", 1, req, (f"ns/{name}-{k}",)))
    return Workload(f"ns/{name}", tuple(tasks), min_available=n)


def test_a_gang_of_two_paired_pods_is_placed_whole_and_its_gpus_count_as_used():
    s = Snapshot([dgx("a", rack="r1"), dgx("b", rack="r1")], topology_levels=["rack"])
    s.add_workload(_gang("train", 2, lambda k: paired(f"ns/train-{k}-claim")))
    result = run_cycle(s, load_profile("phalanx"), 0.0, np.random.default_rng(0), apply=True)
    assert len(result.binds) == 2 and {b.node for b in result.binds} == {"a", "b"}
    for b in result.binds:
        assert sorted(b.gpus) == list(range(8)) and sorted(b.nics) == [0, 1, 2, 3]
        assert len(b.claims[0].results) == 12
    assert int(s.cluster.gpu_whole_free.sum()) == 0  # the FGD/bin-pack arrays see the claimed GPUs
    s.add_workload(_gang("more", 1, lambda k: claim(f"ns/more-{k}", request("gpu"))))
    again = run_cycle(s, load_profile("phalanx"), 1.0, np.random.default_rng(0))
    assert not again.binds and "dra" in {r.plugin for p in again.pending for r in p.reasons}


def test_a_gang_that_cannot_be_whole_leaves_no_device_taken():
    s = Snapshot([dgx("a")])
    s.add_workload(_gang("train", 2, lambda k: paired(f"ns/train-{k}-claim")))
    result = run_cycle(s, load_profile("phalanx"), 0.0, np.random.default_rng(0), apply=True)
    assert not result.binds
    assert not s.dra.exclusive and not s.dra.claims and int(s.cluster.gpu_whole_free.sum()) == 8


def test_a_shared_claim_is_allocated_once_and_pins_its_pods_to_its_node():
    s = Snapshot([dgx("a", gpus=1, nics=0), dgx("b", gpus=1, nics=0)])
    shared = claim("ns/shared", request("gpu"), shared=True)
    s.add_workload(_gang("infer", 2, lambda k: shared))
    result = run_cycle(s, load_profile("phalanx"), 0.0, np.random.default_rng(0), apply=True)
    assert len(result.binds) == 2 and len({b.node for b in result.binds}) == 1
    assert s.dra.claims["ns/shared"][1] == 2 and len(s.dra.exclusive) == 1


def test_compile_error_is_a_spec_error_naming_the_claim():
    from phalanx.core.cel import compile_selector

    with pytest.raises(SpecError, match=r"claim ns/x: CEL selector does not compile"):
        compile_selector("device.driver ==", "claim ns/x")


def test_selector_results_are_cached_per_expression_and_device():
    s = snap(dgx("n0", gpus=2, nics=0))
    try_node(s, 0, [claim("ns/a", request("gpu", count=2))])
    n = len(s.selector_cache.results)
    try_node(s, 0, [claim("ns/b", request("gpu", count=2))])
    assert len(s.selector_cache.results) == n == 2


_ = (Attr, MIG_CLASS)


def test_candidates_within_some_nodes_are_those_of_a_mask_over_them_for_claims_too():
    """A pod recorded again on its node asks feasibility of that node alone (`within`): a request
    with DRA claims gets the same candidates as with a one-node mask, never another node."""
    s = Snapshot([dgx("a"), dgx("b"), dgx("c")])
    req = TaskRequest(cpu_milli=1000, memory_mib=1024, claims=(claim("ns/x", request("gpu")),))
    for i in range(3):
        mask = np.zeros(3, dtype=np.bool_)
        mask[i] = True
        by_mask = find_candidates(s, req, mask)
        by_rows = find_candidates(s, req, within=np.array([i], dtype=np.int64))
        assert by_rows.nodes.tolist() == by_mask.nodes.tolist() == [i]
