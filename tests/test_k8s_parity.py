"""Parity: one cluster and one set of workloads, through the simulator's driver and through the
Kubernetes adapter (fake API server, real client), give the same placements.

The cluster is described once below; the simulator side builds core objects from it directly,
the adapter side builds Node and Pod objects, so each side's translation is exercised.
"""

from __future__ import annotations

import json

import numpy as np

from fakeapi import FakeApi
from kube_objects import node, pod, pod_group
from phalanx.core.cycle import run_cycle
from phalanx.core.model import Gpu, GpuRequest, Nic, Node, PodSet, TaskRequest, TopologyConstraint, Workload
from phalanx.core.snapshot import Snapshot
from phalanx.k8s.read.pods import timestamp
from phalanx.profiles import load_profile
from test_k8s_adapter import scheduler, step

CREATED = "2026-11-29T10:00:00Z"
# (name, rack, model, memory MiB, GPUs, NICs, MIG, pool)
NODES = [
    *[(f"dgx-{k}", f"r{k // 2}", "H100", 81920, 8, 4, False, "training") for k in range(4)],
    ("a100-mig", "r1", "A100", 40960, 2, 0, True, "training"),
    *[(f"t4-{k}", "r2", "T4", 16384, 2, 0, False, "inference") for k in range(2)],
]
# (workload, count, min, gpu request, NICs, rack required, pool selector)
WORKLOADS = [
    ("llm", 2, 2, GpuRequest.whole(8), 4, True, ""),
    ("finetune", 2, 2, GpuRequest.whole(2), 1, False, ""),
    ("chat", 4, 4, GpuRequest.fraction(0.5), 0, False, ""),
    ("embed", 3, 3, GpuRequest.memory(6144), 0, False, "inference"),
    ("notebook", 1, 1, GpuRequest.mig("3g.20gb"), 0, False, ""),
    ("eval", 7, 7, GpuRequest.mig("1g.5gb"), 0, False, ""),
    ("sweep", 3, 3, GpuRequest.whole(8), 0, False, ""),
]


def core_nodes() -> list[Node]:
    out = []
    for name, rack, model, mem, gpus, nics, mig, pool in NODES:
        out.append(
            Node(
                name,
                112_000,
                2048 * 1024,
                tuple(Gpu(j, model, mem, j // 4, j // 2, 0, mig) for j in range(gpus)),
                tuple(Nic(k, (2 * k) // 4, k, 400.0) for k in range(nics)),
                {"pool": pool, "topology.phalanx.io/rack": rack},
                topology={"rack": rack},
            )
        )
    return out


def api_nodes() -> list[dict]:
    out = []
    for name, rack, model, mem, gpus, nics, mig, pool in NODES:
        topo = {
            "gpus": [
                {
                    "index": j,
                    "model": model,
                    "memoryMiB": mem,
                    "numa": j // 4,
                    "pcieSwitch": j // 2,
                    "mig": mig,
                }
                for j in range(gpus)
            ],
            "nics": [
                {"index": k, "numa": (2 * k) // 4, "pcieSwitch": k, "bandwidthGbps": 400} for k in range(nics)
            ],
        }
        out.append(
            node(
                name,
                gpus=0 if mig else gpus,
                product=model,
                memory=mem,
                cpu="112",
                mem="2Ti",
                labels={"pool": pool, "topology.phalanx.io/rack": rack},
                annotations={"phalanx.io/device-topology": json.dumps(topo)},
            )
        )
    return out


def core_workloads() -> list[Workload]:
    out = []
    for name, count, least, gpu, nics, rack, pool in WORKLOADS:
        req = TaskRequest(
            1000,
            1024,
            gpu,
            rdma_nics=nics,
            nic_same_pcie=bool(nics),
            node_selector={"pool": pool} if pool else {},
        )
        tasks = tuple(f"default/{name}-{k}" for k in range(count))
        out.append(
            Workload(
                f"default/{name}",
                (PodSet("ps0", count, req, tasks),),
                min_available=least,
                creation_time=timestamp(CREATED),
                topology=TopologyConstraint("rack", True) if rack else None,
            )
        )
    return out


def api_pods() -> tuple[list[dict], list[dict]]:
    pods, groups = [], []
    for name, count, least, gpu, nics, rack, pool in WORKLOADS:
        groups.append(
            pod_group(name, least, **({"topology": {"level": "rack", "required": True}} if rack else {}))
        )
        notes = {"scheduling.k8s.io/group-name": name}
        res: dict[str, str] = {}
        whole = 0
        if gpu.kind.value == "whole":
            whole = gpu.devices
        elif gpu.kind.value == "fraction":
            notes["gpu-fraction"] = f"{gpu.milli / 1000:g}"
        elif gpu.kind.value == "memory":
            notes["gpu-memory"] = str(gpu.memory_mib)
        else:
            res[f"nvidia.com/mig-{gpu.mig_profile}"] = "1"
        if nics:
            res["rdma/hca"] = str(nics)
            notes["phalanx.io/rdma-same-pcie"] = "true"
        for k in range(count):
            p = pod(f"{name}-{k}", gpus=whole, annotations=dict(notes), resources=res, created=CREATED)
            if pool:
                p["spec"]["nodeSelector"] = {"pool": pool}
            pods.append(p)
    return pods, groups


def simulator_placements(profile: str) -> dict[str, tuple]:
    snap = Snapshot(core_nodes(), core_workloads(), topology_levels=["zone", "spine", "rack"])
    prof = load_profile(profile)
    rng = np.random.default_rng(0)
    out = {}
    for t in range(1, 10):
        result = run_cycle(snap, prof, float(t), rng)
        snap.apply(result, float(t))
        for b in result.binds:
            out[b.task] = (b.node, b.gpus, b.gpu_milli, b.mig, b.nics)
        if not result.binds and not result.evictions:
            break
    return out


def adapter_placements(profile: str) -> dict[str, tuple]:
    fake = FakeApi(timeout_s=0.6).start()
    try:
        for n in api_nodes():
            fake.put(n)
        pods, groups = api_pods()
        for g in groups:
            fake.put(g)
        for p in pods:
            fake.put(p)
        s = scheduler(fake, profile=profile)
        out = {}
        for _ in range(10):
            report = step(s, fake)
            for b in report.result.binds:
                out[b.task] = (b.node, b.gpus, b.gpu_milli, b.mig, b.nics)
            if not report.result.binds:
                break
        s.stop()
        bound = {
            f"default/{o['metadata']['name']}": o["spec"].get("nodeName") for o in fake.all("v1", "pods")
        }
        assert {t: v[0] for t, v in out.items()} == {t: n for t, n in bound.items() if n}
        return out
    finally:
        fake.stop()


def test_simulator_and_adapter_place_alike():
    for profile in ("phalanx", "k8s-default"):
        sim = simulator_placements(profile)
        k8s = adapter_placements(profile)
        assert len(sim) >= 15, profile  # most of the 22 pods fit (the 3 x 8-GPU sweep cannot)
        assert k8s == sim, profile
