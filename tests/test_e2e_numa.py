"""NUMA alignment on a real API server: a node whose phalanx.io/device-topology says
single-numa-node gets Guaranteed pods' GPUs and cores on one NUMA node; a pod no NUMA node can
take stays pending, and its Event says why."""

from __future__ import annotations

import json
import time

import pytest

from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod

pytestmark = pytest.mark.e2e
TOPOLOGY = {
    "gpus": [{"index": k, "numa": k // 4, "pcieSwitch": k // 2} for k in range(8)],
    "numaPolicy": "single-numa-node",
    "numaCpus": [56, 56],
}


def guaranteed(name: str, cores: int, gpus: int) -> dict:
    p = pod(name, gpus=gpus)
    res = p["spec"]["containers"][0]["resources"]
    res["limits"].update({"cpu": str(cores), "memory": "8Gi"})
    res["requests"] = {"cpu": str(cores), "memory": "8Gi"}
    return p


def test_guaranteed_pods_get_gpus_and_cores_on_one_numa_node(kube: Kube) -> None:
    kube.api.create(
        "nodes", node("n", gpus=8, annotations={"phalanx.io/device-topology": json.dumps(TOPOLOGY)})
    )
    with running(kube):
        for name in ("a", "b"):
            kube.create(guaranteed(name, 30, 3))
            wait_for(f"{name} bound", lambda name=name: kube.node_of(name) == "n")
        kube.create(guaranteed("c", 20, 2))  # 2 GPUs free, one per NUMA node; 26 cores on each
        wait_for(
            "c told why",
            lambda: any("no NUMA node can take" in m for _, m in kube.events("c")),
            timeout=30,
        )
        time.sleep(0.5)
        assert not kube.node_of("c")
    numa = {}
    for name in ("a", "b"):
        gpus = [
            int(x) for x in kube.pods()[name]["metadata"]["annotations"]["phalanx.io/gpu-devices"].split(",")
        ]
        numa[name] = {g // 4 for g in gpus}
    assert sorted(map(sorted, numa.values())) == [[0], [1]], numa
