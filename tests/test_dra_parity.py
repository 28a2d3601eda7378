"""DRA parity: one cluster (ResourceSlices as NVIDIA's GPU driver and DraNet publish them) and one
set of workloads with claims, through the simulator's YAML and through the Kubernetes adapter
(fake API server, real client), give the same placements and the same devices per claim."""

from __future__ import annotations

import copy

import numpy as np
import yaml

from fakeapi import FakeApi
from kube_objects import node, pod
from phalanx.core.cycle import run_cycle
from phalanx.profiles import load_profile
from phalanx.spec.cluster import parse_cluster
from phalanx.spec.workloads import parse_workloads
from test_k8s_adapter import scheduler, step

GPU = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


def _gpu(k: int, root: int, shares: bool = False) -> dict:
    d = {
        "name": f"gpu-{k}",
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{root:02x}"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    if shares:
        d["allowMultipleAllocations"] = True
        d["capacity"]["memory"]["requestPolicy"] = {
            "default": "80Gi",
            "validRange": {"min": "1Mi", "step": "1Mi"},
        }
    return d


def _nic(k: int) -> dict:
    return {
        "name": f"nic-{k}",
        "attributes": {
            "rdma": {"bool": True},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{k:02x}"},
        },
    }


CLUSTER = {
    "topology_levels": ["rack"],
    "device_classes": [
        {"name": "gpu.nvidia.com", "selectors": [{"cel": {"expression": GPU}}]},
        {"name": "dranet", "selectors": [{"cel": {"expression": "device.driver == 'dra.net'"}}]},
    ],
    "nodes": [
        *[
            {
                "name": f"dgx-{k}",
                "cpu": 128,
                "memory": "1Ti",
                "topology": {"rack": f"r{k // 2}"},
                "labels": {"topology.phalanx.io/rack": f"r{k // 2}"},
                "dra_slices": [
                    {"driver": "gpu.nvidia.com", "devices": [_gpu(j, j // 2) for j in range(4)]},
                    {"driver": "dra.net", "devices": [_nic(j) for j in range(2)]},
                ],
            }
            for k in range(3)
        ],
        {
            "name": "share-0",
            "cpu": 64,
            "memory": "256Gi",
            "dra_slices": [
                {"driver": "gpu.nvidia.com", "devices": [_gpu(0, 0, shares=True), _gpu(1, 0, shares=True)]}
            ],
        },
    ],
}
PAIR = {
    "requests": [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
        {"name": "nic", "exactly": {"deviceClassName": "dranet", "count": 1}},
    ],
    "constraints": [{"requests": ["gpus", "nic"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
}
SHARE = {
    "requests": [
        {
            "name": "gpu",
            "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": "device.allowMultipleAllocations"}}],
                "capacity": {"requests": {"memory": "30Gi"}},
            },
        }
    ]
}
FULL = {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 4}}]}
WORKLOADS = [  # (name, tasks, claim spec, rack required)
    ("train", 4, PAIR, True),
    ("infer", 3, SHARE, False),
    ("solo", 1, FULL, False),
]


def sim_side() -> dict[str, tuple[str, tuple[str, ...]]]:
    cluster = parse_cluster(copy.deepcopy(CLUSTER))
    wl = {
        "workloads": [
            {
                "name": n,
                "creation_time": float(k),
                "topology": {"level": "rack", "required": True} if rack else None,
                "podsets": [
                    {
                        "name": "p",
                        "count": count,
                        "cpu": 1,
                        "memory": "1Gi",
                        "claims": [{"name": "c", "devices": spec}],
                    }
                ],
            }
            for k, (n, count, spec, rack) in enumerate(WORKLOADS)
        ]
    }
    workloads, _ = parse_workloads(wl, "workloads", cluster.dra_context())
    snap = cluster.snapshot()
    for w in workloads:
        snap.add_workload(w)
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for c in range(4):
        result = run_cycle(snap, load_profile("phalanx"), float(c), np.random.default_rng(0), apply=True)
        for b in result.binds:
            wname, rest = b.task.split("/", 1)
            devs = tuple(sorted(f"{r.request}={r.device}" for cl in b.claims for r in cl.results))
            out[f"{wname}-{rest.split('-')[-1]}"] = (b.node, devs)
    return out


def adapter_side() -> dict[str, tuple[str, tuple[str, ...]]]:
    fake = FakeApi(timeout_s=0.6).start()
    try:
        for c in CLUSTER["device_classes"]:
            fake.put(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": c["name"]},
                    "spec": {"selectors": c["selectors"]},
                }
            )
        for n in CLUSTER["nodes"]:
            obj = node(n["name"], gpus=0, cpu=str(n["cpu"]), mem=n["memory"], labels=n.get("labels") or {})
            obj["metadata"]["labels"] = n.get("labels") or {}
            fake.put(obj)
            per_driver: dict[str, int] = {}
            for sl in n["dra_slices"]:
                per_driver[sl["driver"]] = per_driver.get(sl["driver"], 0) + 1
            for k, sl in enumerate(n["dra_slices"]):
                spec = copy.deepcopy(sl) | {
                    "nodeName": n["name"],
                    "pool": {
                        "name": n["name"],
                        "generation": 1,
                        "resourceSliceCount": per_driver[sl["driver"]],
                    },
                }
                fake.put(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": f"{n['name']}-{k}"},
                        "spec": spec,
                    }
                )
        for k, (n, count, spec, _rack) in enumerate(WORKLOADS):
            for i in range(count):
                fake.put(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaim",
                        "metadata": {"name": f"{n}-{i}-c", "namespace": "default"},
                        "spec": {"devices": spec},
                    }
                )
                notes = {"phalanx.io/pod-group": n}
                if _rack:
                    notes |= {"phalanx.io/topology-level": "rack", "phalanx.io/topology-required": "true"}
                p = pod(f"{n}-{i}", cpu="1", mem="1Gi", annotations=notes, created=f"2026-11-29T10:00:0{k}Z")
                p["spec"]["resourceClaims"] = [{"name": "c", "resourceClaimTemplateName": "t"}]
                p["status"]["resourceClaimStatuses"] = [{"name": "c", "resourceClaimName": f"{n}-{i}-c"}]
                fake.put(p)
        s = scheduler(fake)
        for _ in range(4):
            step(s, fake)
        s.stop()
        out: dict[str, tuple[str, tuple[str, ...]]] = {}
        claims = {c["metadata"]["name"]: c for c in fake.all("resource.k8s.io/v1", "resourceclaims")}
        for p in fake.all("v1", "pods"):
            if not p["spec"].get("nodeName"):
                continue
            name = p["metadata"]["name"]
            results = claims[f"{name}-c"]["status"]["allocation"]["devices"]["results"]
            out[name] = (
                p["spec"]["nodeName"],
                tuple(sorted(f"{r['request']}={r['device']}" for r in results)),
            )
        return out
    finally:
        fake.stop()


def test_simulator_and_adapter_allocate_the_same_devices() -> None:
    sim, k8s = sim_side(), adapter_side()
    assert sim == k8s
    assert {n for n, _ in sim.values()} >= {"dgx-0", "dgx-1", "share-0"}
    trains = [sim[f"train-{i}"][0] for i in range(4)]
    assert len(set(trains)) == 2  # a rack of two nodes, two pods each
    assert sum(1 for n, _ in sim.values() if n == "share-0") == 3  # three 30Gi shares on two 80Gi GPUs
    assert "solo-0" in sim and sim["solo-0"][0] == "dgx-2"


_ = yaml
