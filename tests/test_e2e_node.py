"""`phalanx node discover` against a real API server: what it patches, and that it patches only changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fake_sysfs
from e2e_kube import Kube
from kube_objects import node
from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.nodes import parse_node

pytestmark = pytest.mark.e2e
TESTS = Path(__file__).resolve().parent


def _discover(kube: Kube, name: str, sys_root: Path, nvml: Path) -> str:
    env = {
        **os.environ,
        "PHALANX_FAKE_NVML": str(nvml),
        "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path]),
    }
    args = ["node", "discover", "--once", "--node-name", name, "--kubeconfig", str(kube.cp.kubeconfig)]
    args += ["--sys-root", str(sys_root), "--nvml-module", "fake_nvml"]
    res = subprocess.run(
        [sys.executable, "-m", "phalanx.cli.main", *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def test_discover_publishes_topology_and_labels_once(kube: Kube, tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"gpus": fake_sysfs.dgx(tmp_path / "sys")}))
    bare = node("dgx-0", gpus=8, extra={"rdma/hca": "4"})
    for k in (keys.GFD_PRODUCT, keys.GFD_MEMORY):
        del bare["metadata"]["labels"][k]  # no GPU Feature Discovery on this cluster
    kube.api.create("nodes", bare)
    out = _discover(kube, "dgx-0", tmp_path / "sys", nvml)
    assert "8 GPU(s), 4 RDMA NIC(s), patched" in out
    got = kube.api.get("nodes", "dgx-0") or {}
    labels = got["metadata"]["labels"]
    assert labels[keys.GFD_PRODUCT] == "NVIDIA-H100-80GB-HBM3" and labels[keys.GFD_COUNT] == "8"
    topo = json.loads(got["metadata"]["annotations"][keys.DEVICE_TOPOLOGY])
    assert [g["pcieSwitch"] for g in topo["gpus"]] == [0, 0, 1, 1, 2, 2, 3, 3]
    n = parse_node(got, AdapterConfig())  # what the scheduler makes of it
    assert [(g.model, g.memory_mib, g.numa) for g in n.gpus] == [("H100", 81559, k // 4) for k in range(8)]
    assert [x.pcie_switch for x in n.nics] == [0, 1, 2, 3]
    rv = got["metadata"]["resourceVersion"]
    assert "unchanged" in _discover(kube, "dgx-0", tmp_path / "sys", nvml)
    assert (kube.api.get("nodes", "dgx-0") or {})["metadata"]["resourceVersion"] == rv


def test_discover_leaves_gpu_feature_discovery_labels_alone(kube: Kube, tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"gpus": fake_sysfs.workstation(tmp_path / "sys")}))
    kube.api.create("nodes", node("ws", gpus=1, product="NVIDIA-GeForce-RTX-4090", memory=24564))
    _discover(kube, "ws", tmp_path / "sys", nvml)
    got = kube.api.get("nodes", "ws") or {}
    assert keys.DEVICE_TOPOLOGY in got["metadata"]["annotations"]
    assert "phalanx.io/gpu-labels" not in got["metadata"]["labels"]  # GFD's labels stay GFD's


def test_node_without_nvml_gets_a_note_and_keeps_its_gpus(kube: Kube, tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"missing": True}))
    (tmp_path / "sys").mkdir()
    kube.api.create("nodes", node("nodriver", gpus=4))
    out = _discover(kube, "nodriver", tmp_path / "sys", nvml)
    assert "no GPUs published: NVML could not start" in out
    got = kube.api.get("nodes", "nodriver") or {}
    topo = json.loads(got["metadata"]["annotations"][keys.DEVICE_TOPOLOGY])
    assert topo["gpus"] == [] and "NVML could not start" in topo["note"]
    assert len(parse_node(got, AdapterConfig()).gpus) == 4  # kubelet's count still stands


def test_device_plugin_reads_and_marks_pods_on_the_real_api_server(kube: Kube) -> None:
    from lightkube import Client
    from lightkube.config.kubeconfig import KubeConfig

    from kube_objects import pod
    from phalanx.node.deviceplugin import GPU_ALLOCATED, ApiPods, GpuDevice, Plugin

    kube.api.create("nodes", node("n0", gpus=4))
    kube.create(pod("elsewhere", gpus=2, node="n1", annotations={keys.GPU_DEVICES: "0,1"}))
    kube.create(pod("ours", gpus=2, node="n0", annotations={keys.GPU_DEVICES: "2,3"}))
    client = Client(KubeConfig.from_file(str(kube.cp.kubeconfig)))
    uuids = [f"GPU-{k}" for k in range(4)]
    plugin = Plugin([GpuDevice(k, uuids[k]) for k in range(4)], ApiPods(client, "n0"))
    assert [p["metadata"]["name"] for p in plugin.source.pods()] == ["ours"]  # this node's only
    assert plugin.prefer(uuids, [], 2) == ["GPU-2", "GPU-3"]
    plugin.given_out(["GPU-2", "GPU-3"])
    got = kube.api.get_pod("default", "ours") or {}
    assert got["metadata"]["annotations"][GPU_ALLOCATED] == "GPU-2,GPU-3"
    assert plugin.prefer(uuids, [], 2) == ["GPU-0", "GPU-1"]  # handed out: no longer waiting
