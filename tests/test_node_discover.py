"""`phalanx node discover`: NVML + sysfs -> the device-topology annotation the adapter reads.

The fixtures are a fake sysfs tree (tests/fake_sysfs.py) and a fake NVML module with NVML's
function names (tests/fake_nvml.py); on a GPU machine the same code runs on pynvml and /sys.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import fake_nvml
import fake_sysfs
from kube_objects import node
from phalanx.cli.main import app
from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.nodes import parse_node
from phalanx.node import agent, reserve


@pytest.fixture
def nvml() -> Iterator[None]:
    yield
    fake_nvml.CONFIG = None


def _gpu(k: int, switch: int, numa: int) -> dict[str, Any]:
    return {
        "index": k,
        "memoryMiB": 81559,
        "mig": False,
        "model": "H100",
        "numa": numa,
        "nvlinkGroup": 0,
        "pcieSwitch": switch,
        "uuid": f"GPU-{k:08d}-aaaa-bbbb-cccc-000000000000",
    }


DGX = {
    "gpus": [_gpu(k, k // 2, k // 4) for k in range(8)],
    "nics": [
        {"bandwidthGbps": 400.0, "index": 0, "name": "ibp20s0", "numa": 0, "pcieSwitch": 0},
        {"bandwidthGbps": 400.0, "index": 1, "name": "ibp36s0", "numa": 0, "pcieSwitch": 1},
        {"bandwidthGbps": 400.0, "index": 2, "name": "ibp180s0", "numa": 1, "pcieSwitch": 2},
        {"bandwidthGbps": 400.0, "index": 3, "name": "ibp196s0", "numa": 1, "pcieSwitch": 3},
    ],
}


def test_dgx_layout_exact_annotation(tmp_path: Path, nvml: None) -> None:
    fake_nvml.CONFIG = {"gpus": fake_sysfs.dgx(tmp_path)}
    topo, names = agent.find(tmp_path, "fake_nvml")
    assert topo == DGX
    assert agent.labels_for(topo, names) == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "8",
        "phalanx.io/gpu-labels": "discover",
    }


def test_workstation_exact_annotation(tmp_path: Path, nvml: None) -> None:
    fake_nvml.CONFIG = {"gpus": fake_sysfs.workstation(tmp_path)}
    topo, _ = agent.find(tmp_path, "fake_nvml")
    assert topo == {
        "gpus": [
            {
                "index": 0,
                "memoryMiB": 24564,
                "mig": False,
                "model": "NVIDIA-GeForce-RTX-4090",
                "numa": 0,  # sysfs says -1: no NUMA
                "nvlinkGroup": 0,
                "pcieSwitch": 0,  # right below the root port
                "uuid": "GPU-11111111-2222-3333-4444-555555555555",
            }
        ],
        "nics": [],
    }


def test_nvlink_pairs_make_groups_and_mig_instances_are_listed(tmp_path: Path, nvml: None) -> None:
    gpus = fake_sysfs.dgx(tmp_path)
    for k, g in enumerate(gpus):  # NVLink bridges between GPU pairs, no NVSwitch
        g["nvlinks"] = [gpus[k ^ 1]["bus_id"]] * 4
    gpus[7].update(mig=True, mig_instances=["3g.40gb@0", "2g.20gb@4", "1g.10gb@6"])
    fake_nvml.CONFIG = {"gpus": gpus}
    topo, _ = agent.find(tmp_path, "fake_nvml")
    assert [g["nvlinkGroup"] for g in topo["gpus"]] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert topo["gpus"][7]["mig"] is True
    assert topo["gpus"][7]["migInstances"] == ["3g.40gb@0", "2g.20gb@4", "1g.10gb@6"]
    n = parse_node(node("n", annotations={keys.DEVICE_TOPOLOGY: json.dumps(topo)}), AdapterConfig())
    assert [(m.profile, m.start) for m in n.mig_instances[7]] == [
        ("3g.40gb", 0),
        ("2g.20gb", 4),
        ("1g.10gb", 6),
    ]
    assert [g.nvlink_group for g in n.gpus] == [0, 0, 1, 1, 2, 2, 3, 3]


HAND_WRITTEN = {  # what docs/kubernetes.md asks an operator to write for the same DGX
    "gpus": [
        {"index": k, "model": "H100", "memoryMiB": 81559, "numa": k // 4, "pcieSwitch": k // 2}
        for k in range(8)
    ],
    "nics": [{"index": k, "numa": k // 2, "pcieSwitch": k, "bandwidthGbps": 400} for k in range(4)],
}


def test_adapter_reads_discovered_annotation_into_the_same_node_as_a_hand_written_one(
    tmp_path: Path, nvml: None
) -> None:
    fake_nvml.CONFIG = {"gpus": fake_sysfs.dgx(tmp_path)}
    topo, names = agent.find(tmp_path, "fake_nvml")
    cfg = AdapterConfig(rdma_resources=("rdma/ib",))
    discovered = node("dgx", labels=agent.labels_for(topo, names), extra={"rdma/ib": "4"})
    discovered["metadata"]["annotations"][agent.TOPOLOGY] = json.dumps(topo, separators=(",", ":"))
    hand = node("dgx", labels=agent.labels_for(topo, names), extra={"rdma/ib": "4"})
    hand["metadata"]["annotations"][keys.DEVICE_TOPOLOGY] = json.dumps(HAND_WRITTEN)
    a, b = parse_node(discovered, cfg), parse_node(hand, cfg)
    assert a == b
    assert len(a.gpus) == 8 and len(a.nics) == 4
    # and it differs from the guess the adapter makes without any annotation (NICs spread evenly,
    # four GPUs a NUMA node) only where the guess was wrong: here, nowhere but the labels' guess
    guessed = parse_node(node("dgx", labels=agent.labels_for(topo, names), extra={"rdma/ib": "4"}), cfg)
    assert [g.pcie_switch for g in guessed.gpus] == [g.pcie_switch for g in a.gpus]


def test_node_and_adapter_agree_on_the_keys() -> None:
    assert agent.TOPOLOGY == keys.DEVICE_TOPOLOGY
    assert (agent.GFD_PRODUCT, agent.GFD_MEMORY, agent.GFD_COUNT) == (
        keys.GFD_PRODUCT,
        keys.GFD_MEMORY,
        keys.GFD_COUNT,
    )
    assert reserve.RESERVED_GPU == keys.RESERVED_GPU


@pytest.mark.parametrize(
    ("config", "module", "says"),
    [
        ({"missing": True}, "fake_nvml", "NVML could not start: NVML Shared Library Not Found"),
        (None, "phalanx_no_such_nvml", "no NVML module 'phalanx_no_such_nvml'"),
        ({"gpus": []}, "fake_nvml", "NVML sees no GPU on this node"),
    ],
)
def test_no_nvml_or_no_gpu_is_a_note_not_a_crash(
    tmp_path: Path, nvml: None, config: dict[str, Any] | None, module: str, says: str
) -> None:
    fake_nvml.CONFIG = config
    topo, names = agent.find(tmp_path, module)
    assert topo["gpus"] == [] and says in topo["note"]
    assert agent.labels_for(topo, names) == {}
    # the adapter keeps kubelet's GPU count for such a node instead of seeing none
    n = parse_node(node("n", gpus=4, annotations={keys.DEVICE_TOPOLOGY: json.dumps(topo)}), AdapterConfig())
    assert len(n.gpus) == 4


def test_cli_print(tmp_path: Path, nvml: None) -> None:
    fake_nvml.CONFIG = {"gpus": fake_sysfs.workstation(tmp_path)}
    res = CliRunner().invoke(
        app, ["node", "discover", "--print", "--sys-root", str(tmp_path), "--nvml-module", "fake_nvml"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["gpus"][0]["uuid"] == "GPU-11111111-2222-3333-4444-555555555555"


def test_cli_bad_sys_root_is_one_clear_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["node", "discover", "--print", "--sys-root", str(tmp_path / "nope")])
    assert res.exit_code == 2
    assert "--sys-root" in res.output and "is not a folder" in res.output
    assert "Traceback" not in res.output


def test_fake_nvml_has_the_names_and_arities_of_nvidias_binding() -> None:
    """The same code runs on pynvml: every function the fake offers exists there, same parameters."""
    import inspect

    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    for name, fn in vars(fake_nvml).items():
        if name.startswith("nvml") and callable(fn):
            real = getattr(pynvml, name, None)
            assert real is not None, name
            want = [p for p in inspect.signature(fn).parameters]
            have = [
                p
                for p, v in inspect.signature(real).parameters.items()
                if v.default is inspect.Parameter.empty
            ]
            assert len(want) == len(have), (name, want, have)


def test_real_binding_without_a_driver_is_a_note(tmp_path: Path) -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver: the note case cannot happen here")
    topo, _ = agent.find(tmp_path, "pynvml")
    assert topo["gpus"] == [] and topo["note"].startswith("NVML could not start")


def test_the_kubelets_numa_policy_and_each_numa_nodes_cpus_are_published(tmp_path: Path, nvml: None) -> None:
    fake_nvml.CONFIG = {"gpus": fake_sysfs.dgx(tmp_path)}
    for k, cpus in enumerate(("0-55,112-167", "56-111,168-223")):  # 112 hyperthreads each
        d = tmp_path / "devices" / "system" / "node" / f"node{k}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    cfg = tmp_path / "kubelet.yaml"
    cfg.write_text(
        "kind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\nreservedSystemCPUs: 0-1,56\n"
    )
    topo, _ = agent.find(tmp_path, "fake_nvml", agent.read_kubelet_config(cfg))
    assert topo == {**DGX, "numaPolicy": "single-numa-node", "numaCpus": [110, 111]}
    n = parse_node(node("n", annotations={keys.DEVICE_TOPOLOGY: json.dumps(topo)}), AdapterConfig())
    assert n.numa_policy == "single-numa-node" and n.numa_cpu_milli == (110_000, 111_000)
    cfg.write_text("topologyManagerPolicy: none\n")  # none: nothing more is published
    assert agent.find(tmp_path, "fake_nvml", agent.read_kubelet_config(cfg))[0] == DGX


def test_a_kubelet_config_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "kubelet.yaml"
    bad.write_text("- a list\n")
    r = CliRunner().invoke(
        app, ["node", "discover", "--print", f"--sys-root={tmp_path}", f"--kubelet-config={bad}"]
    )
    assert r.exit_code == 2 and "--kubelet-config" in r.output and "not a KubeletConfiguration" in r.output, (
        r.output
    )
