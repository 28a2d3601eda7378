"""Property-based tests on random clusters and workloads.

No device or node over capacity, no MIG overlap, no NIC given twice, gangs all-or-nothing,
the snapshot's arrays agree with its allocations, and the same inputs and seed always give
identical decisions.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.core.cycle import run_cycle
from phalanx.core.model import Gpu, GpuRequest, Nic, Node, PodSet, TaskRequest, TopologyConstraint, Workload
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile

PROFILES = [
    "phalanx",
    "k8s-default",
    "fgd",
    "bestfit",
    "random",
    "binpack",
    "spread",
    "dotprod",
    "gpupacking",
    "gpuclustering",
]
MIG_PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.5gb", "3g.20gb"]
MODELS = {"A100": 40960, "H100": 81920, "T4": 15360}


@st.composite
def nodes(draw):
    out = []
    for i in range(draw(st.integers(1, 5))):
        model = draw(st.sampled_from(sorted(MODELS)))
        ngpu = draw(st.sampled_from([0, 1, 2, 4, 8]))
        per = draw(st.sampled_from([1, 2, 4]))
        gpus = tuple(
            Gpu(
                j,
                model,
                MODELS[model],
                numa=j * 2 // max(ngpu, 1),
                pcie_switch=j // per,
                mig_enabled=model != "T4" and draw(st.booleans()) and draw(st.booleans()),
            )
            for j in range(ngpu)
        )
        switches = sorted({g.pcie_switch for g in gpus}) or [0]
        nn = draw(st.integers(0, 4))
        nics = tuple(Nic(k, 0, switches[k % len(switches)]) for k in range(nn))
        out.append(
            Node(
                f"n{i}",
                draw(st.integers(4, 128)) * 1000,
                draw(st.integers(8, 512)) * 1024,
                gpus,
                nics,
                topology={"rack": f"r{i % 2}"},
            )
        )
    return out


@st.composite
def requests(draw):
    kind = draw(st.sampled_from(["none", "whole", "fraction", "memory", "mig"]))
    if kind == "whole":
        g = GpuRequest.whole(draw(st.integers(1, 4)))
    elif kind == "fraction":
        g = GpuRequest.fraction(draw(st.integers(1, 9)) / 10, draw(st.integers(1, 2)))
    elif kind == "memory":
        g = GpuRequest.memory(draw(st.integers(1, 30)) * 1000, draw(st.integers(1, 2)))
    elif kind == "mig":
        g = GpuRequest.mig(draw(st.sampled_from(MIG_PROFILES)))
    else:
        g = GpuRequest.none()
    nics = draw(st.integers(0, 2))
    return TaskRequest(
        draw(st.integers(0, 16)) * 1000,
        draw(st.integers(0, 64)) * 1024,
        g,
        rdma_nics=nics,
        nic_same_pcie=nics > 0 and draw(st.booleans()),
    )


@st.composite
def workloads(draw):
    out = []
    for w in range(draw(st.integers(1, 8))):
        podsets = tuple(
            PodSet(f"p{k}", draw(st.integers(1, 4)), draw(requests())) for k in range(draw(st.integers(1, 2)))
        )
        total = sum(p.count for p in podsets)
        topo = draw(
            st.sampled_from([None, TopologyConstraint("rack", True), TopologyConstraint("node", False)])
        )
        out.append(
            Workload(
                f"w{w}",
                podsets,
                min_available=draw(st.integers(0, total)),
                priority=draw(st.integers(0, 2)),
                creation_time=float(draw(st.integers(0, 5))),
                topology=topo,
            )
        )
    return out


def check_consistency(snap: Snapshot) -> None:
    c = snap.cluster
    c.check_invariants()
    n, g = c.gpu_kind.shape
    cpu = np.zeros(n, dtype=np.int64)
    mem = np.zeros(n, dtype=np.int64)
    milli = np.zeros((n, g), dtype=np.int64)
    gmem = np.zeros((n, g), dtype=np.int64)
    mig = np.zeros((n, g), dtype=np.int64)
    nic_used: set[tuple[int, int]] = set()
    for a in snap.allocations.values():
        cpu[a.node] += a.cpu_milli
        mem[a.node] += a.memory_mib
        d = a.devices
        if d.mig is not None:
            j = d.gpus[0]
            assert mig[a.node, j] & d.mig_mask == 0, "MIG overlap"
            mig[a.node, j] |= d.mig_mask
        else:
            assert len(set(d.gpus)) == len(d.gpus), "GPU listed twice in one task"
            for j, m in zip(d.gpus, d.gpu_memory_mib, strict=True):
                milli[a.node, j] += d.milli
                gmem[a.node, j] += m
        for k in d.nics:
            assert (a.node, k) not in nic_used, "NIC given twice"
            nic_used.add((a.node, k))
    assert (c.cpu_cap - c.cpu_free == cpu).all()
    assert (c.mem_cap - c.mem_free == mem).all()
    shared = c.gpu_kind == 1
    assert (np.where(shared, 1000 - c.gpu_milli_free, 0) == milli).all()
    assert (np.where(shared, c.gpu_mem_cap - c.gpu_mem_free, 0) == gmem).all()
    assert (c.mig_used == mig).all()
    assert (milli <= 1000).all() and (gmem <= c.gpu_mem_cap).all()


def run(ns, ws, profile: str, seed: int, cycles: int = 4):
    snap = Snapshot(ns, ws, topology_levels=["rack"])
    prof = load_profile(profile)
    rng = np.random.default_rng(seed)
    log = []
    for k in range(cycles):
        before = snap.cluster.gpu_milli_free.copy(), dict(snap.allocations)
        result = run_cycle(snap, prof, float(k), rng)
        assert (snap.cluster.gpu_milli_free == before[0]).all() and snap.allocations == before[1], (
            "run_cycle changed the snapshot"
        )
        snap.apply(result, float(k))
        check_consistency(snap)
        log.append(result.to_dicts())
        if k == 1 and snap.allocations:
            done = sorted({a.task.workload for a in snap.allocations.values()})[0]
            snap.remove_workload(done)
            check_consistency(snap)
    return snap, prof, log


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ns=nodes(), ws=workloads(), profile=st.sampled_from(PROFILES), seed=st.integers(0, 3))
def test_invariants_hold_and_runs_are_deterministic(ns, ws, profile, seed):
    snap, _, log = run(ns, ws, profile, seed)
    if profile != "k8s-default":
        for e in snap.workloads.values():
            assert len(e.bound) == 0 or len(e.bound) >= e.workload.gang_size, f"partial gang {e.name}"
    _, _, log2 = run(ns, ws, profile, seed)
    assert log == log2


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ns=nodes(), ws=workloads())
def test_required_topology_keeps_gangs_in_one_domain(ns, ws):
    snap, _, _ = run(ns, ws, "phalanx", 0, cycles=2)
    for e in snap.workloads.values():
        t = e.workload.topology
        if t is not None and t.required and e.bound:
            level = "rack" if t.level == "rack" else None
            doms = {
                snap.nodes[a.node].topology.get(level) if level else snap.nodes[a.node].name
                for a in e.bound.values()
            }
            assert len(doms) == 1
