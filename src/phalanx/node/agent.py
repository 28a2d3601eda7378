"""`phalanx node discover`: publish the node's device topology, and GPU labels where GFD is absent.

Runs as a DaemonSet (one process per node). It patches the Node only when what it found
changed, and looks again every `interval` seconds (devices rarely change; a MIG
reconfiguration or a replaced NIC is picked up at the next look).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Node

from phalanx.core.errors import SpecError
from phalanx.node import nvml, topology
from phalanx.spec.dra import gpu_model

log = logging.getLogger("phalanx.node")
TOPOLOGY = "phalanx.io/device-topology"
LABELLED_BY = "phalanx.io/gpu-labels"  # set when we wrote the GPU labels (so we may update them)
GFD_PRODUCT, GFD_MEMORY, GFD_COUNT = "nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.count"


def find(
    sys_root: Path, nvml_module: str, kubelet_config: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """This machine's topology annotation (with a note, and no GPUs, when NVML is not there; with
    the NUMA policy and CPUs when the kubelet's configuration is given), and the GPUs' product
    names as NVML gives them."""
    note = ""
    gpus: list[nvml.GpuInfo] = []
    try:
        nv = nvml.load(nvml_module)
        try:
            gpus = nvml.gpus(nv)
        finally:
            nv.nvmlShutdown()
    except nvml.NvmlUnavailable as e:
        note = str(e)
    # the model as the adapter derives it from GFD's product label, so both paths agree
    out = topology.discover(gpus, sys_root, lambda name: gpu_model(name.replace(" ", "-")))
    if not gpus:
        out["note"] = note or "NVML sees no GPU on this node"
    out.update(topology.numa_fields(sys_root, kubelet_config or {}))
    return out, [g.name for g in sorted(gpus, key=lambda g: g.index)]


def read_kubelet_config(path: Path | None) -> dict[str, Any]:
    """The kubelet's configuration file (KubeletConfiguration YAML); {} when none is given. Read
    every look: a changed policy is published with the next one."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SpecError("--kubelet-config", f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise SpecError("--kubelet-config", f"{path} is not a KubeletConfiguration (a YAML mapping)")
    return data


def labels_for(topo: dict[str, Any], names: list[str]) -> dict[str, str]:
    """GPU Feature Discovery's labels (product, memory, count) for what we found."""
    if not topo["gpus"]:
        return {}
    first = topo["gpus"][0]
    product = names[0].replace(" ", "-") if names else first["model"]
    return {
        GFD_PRODUCT: product,
        GFD_MEMORY: str(first["memoryMiB"]),
        GFD_COUNT: str(len(topo["gpus"])),
        LABELLED_BY: "discover",
    }


def publish(client: Client, node_name: str, topo: dict[str, Any], labels: dict[str, str]) -> bool:
    """Patch the node if what it says differs from what we found; True if it was patched."""
    node = client.get(Node, node_name)
    meta = node.metadata
    have_notes = dict(meta.annotations or {}) if meta else {}
    have_labels = dict(meta.labels or {}) if meta else {}
    text = json.dumps(topo, sort_keys=True, separators=(",", ":"))
    patch: dict[str, Any] = {}
    if have_notes.get(TOPOLOGY) != text:
        patch.setdefault("metadata", {})["annotations"] = {TOPOLOGY: text}
    gfd = GFD_PRODUCT in have_labels and have_labels.get(LABELLED_BY) != "discover"
    if labels and not gfd and any(have_labels.get(k) != v for k, v in labels.items()):
        patch.setdefault("metadata", {})["labels"] = labels
    if not patch:
        return False
    client.patch(Node, node_name, patch)
    return True


def recut_once(client: Client, node_name: str, nvml_module: str, pod_resources: Path | None = None) -> bool:
    """Carry out the MIG repartitions asked of this node (`phalanx.node.recut`); True when a GPU's
    layout changed, so that the topology is published at once. Kubelet's PodResources record, where
    its socket is given, counts as use too (a device just handed out has no process yet)."""
    from phalanx.node import podresources, recut

    allocated: dict[str, list[str]] = {}
    if pod_resources is not None:
        try:
            allocated = podresources.devices(pod_resources, "")
        except Exception as e:  # no kubelet socket: the pods' annotations and NVML still say
            log.warning("node %s: kubelet's PodResources not read (%s)", node_name, e)

    try:
        nv = nvml.load(nvml_module)
    except nvml.NvmlUnavailable as e:
        log.info("node %s: no MIG recuts: %s", node_name, e)
        return False
    try:
        given = recut.look(client, node_name, nv, allocated)
    except Exception as e:  # the API is away: ask again at the next look
        log.warning("node %s: MIG recuts not looked at: %s", node_name, e)
        return False
    finally:
        nv.nvmlShutdown()
    return any(a.state == "applied" for a in given.values())


def run(
    client: Client,
    node_name: str,
    sys_root: Path,
    nvml_module: str,
    interval: float,
    once: bool = False,
    kubelet_config: Path | None = None,
    mig_recut: bool = False,
    mig_interval: float = 5.0,
    pod_resources: Path | None = None,
) -> dict[str, Any]:
    """Publish every `interval` s; with `mig_recut`, look every `mig_interval` s for repartitions
    the scheduler asked of this node, and publish at once after one."""
    next_full = -math.inf
    while True:
        cut = recut_once(client, node_name, nvml_module, pod_resources) if mig_recut else False
        if cut or time.monotonic() >= next_full:
            next_full = time.monotonic() + interval
            topo, names = find(sys_root, nvml_module, read_kubelet_config(kubelet_config))
            if not topo["gpus"]:
                log.info("node %s: no GPUs published: %s", node_name, topo.get("note", ""))
            changed = publish(client, node_name, topo, labels_for(topo, names))
            log.info(
                "node %s: %d GPU(s), %d RDMA NIC(s)%s",
                node_name,
                len(topo["gpus"]),
                len(topo["nics"]),
                ", patched" if changed else ", unchanged",
            )
            if once:
                return topo
        time.sleep(mig_interval if mig_recut else interval)
