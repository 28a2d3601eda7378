"""The node's devices and how they hang together: GPUs from NVML, RDMA NICs and the PCIe tree from sysfs.

A device's PCIe switch is the upstream port of the switch it sits behind: in sysfs, the
device's path runs root complex > root port > switch upstream port > switch downstream port >
device, and devices that share the upstream port share the switch (so a NIC there is a NIC
"beside" the GPU). A device right below a root port counts that root port as its switch.
NUMA nodes come from `numa_node` (-1, no NUMA, is node 0). NVLink groups are the connected
components of the GPUs' NVLink peers. The result is the JSON of the `phalanx.io/device-topology`
node annotation the scheduler reads (`phalanx.k8s.read.nodes.DeviceTopology`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from phalanx.node.nvml import GpuInfo

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def pci_chain(sys_root: Path, bdf: str) -> list[str]:
    """The PCI path of a device, root complex first, the device last (empty when sysfs lacks it)."""
    link = sys_root / "bus" / "pci" / "devices" / bdf
    if not link.exists():
        return []
    parts = Path(os.path.realpath(link)).parts
    return [p for p in parts if p.startswith("pci") or _BDF.match(p)]


def switch_of(chain: list[str]) -> str:
    """The switch a device hangs off (see the module doc)."""
    if len(chain) >= 5:
        return chain[-3]
    if len(chain) >= 2:
        return chain[-2]
    return chain[0] if chain else "?"


def numa_of(sys_root: Path, bdf: str) -> int:
    try:
        v = int((sys_root / "bus" / "pci" / "devices" / bdf / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return 0
    return max(v, 0)


def rdma_nics(sys_root: Path) -> list[dict[str, Any]]:
    """RDMA devices of /sys/class/infiniband: their PCI function, netdev and link speed."""
    base = sys_root / "class" / "infiniband"
    out = []
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        target = Path(os.path.realpath(dev / "device"))
        bdf = target.name if _BDF.match(target.name) else ""
        nets = (
            sorted(p.name for p in (dev / "device" / "net").iterdir())
            if (dev / "device" / "net").is_dir()
            else []
        )
        speed = 0.0
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []:
            m = _RATE.match((port / "rate").read_text()) if (port / "rate").is_file() else None
            if m:
                speed = max(speed, float(m.group(1)))
        out.append({"rdma": dev.name, "bdf": bdf, "netdev": nets[0] if nets else "", "gbps": speed or 100.0})
    return out


def _nvlink_groups(gpus: list[GpuInfo]) -> dict[str, int]:
    """Connected components of the NVLink graph, numbered by their first GPU."""
    parent = {g.bus_id: g.bus_id for g in gpus}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for g in gpus:
        for p in g.nvlink_peers:
            if p in parent:
                parent[find(g.bus_id)] = find(p)
    roots: dict[str, int] = {}
    return {g.bus_id: roots.setdefault(find(g.bus_id), len(roots)) for g in gpus}


def discover(gpus: list[GpuInfo], sys_root: Path, model_of: Any) -> dict[str, Any]:
    """The `phalanx.io/device-topology` annotation for these GPUs and the RDMA NICs sysfs shows."""
    nics = rdma_nics(sys_root)
    switches: dict[str, int] = {}

    def switch_id(bdf: str) -> int:
        return switches.setdefault(switch_of(pci_chain(sys_root, bdf)), len(switches))

    groups = _nvlink_groups(gpus)
    out_gpus = []
    for g in sorted(gpus, key=lambda g: g.index):
        entry: dict[str, Any] = {
            "index": g.index,
            "uuid": g.uuid,
            "model": model_of(g.name),
            "memoryMiB": g.memory_mib,
            "numa": numa_of(sys_root, g.bus_id),
            "pcieSwitch": switch_id(g.bus_id),
            "nvlinkGroup": groups[g.bus_id],
            "mig": g.mig,
        }
        if g.mig_instances:
            entry["migInstances"] = list(g.mig_instances)
        out_gpus.append(entry)
    out_nics = [
        {
            "index": k,
            "name": n["netdev"] or n["rdma"],
            "numa": numa_of(sys_root, n["bdf"]) if n["bdf"] else 0,
            "pcieSwitch": switch_id(n["bdf"]) if n["bdf"] else len(switches) + k,
            "bandwidthGbps": n["gbps"],
        }
        for k, n in enumerate(nics)
    ]
    return {"gpus": out_gpus, "nics": out_nics}


def cpu_list(text: str) -> set[int]:
    """A Linux CPU list ("0-3,8,10-11") as the CPUs it names; raises ValueError if it is not one."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        out.update(range(int(lo), int(hi) + 1) if sep else {int(lo)})
    return out


def numa_cpus(sys_root: Path, reserved: set[int]) -> list[int]:
    """CPUs of each NUMA node (node0 first) that pods may have: sysfs' cpulist less the kubelet's
    reservedSystemCPUs. Empty when sysfs shows no NUMA nodes."""
    base = sys_root / "devices" / "system" / "node"
    found: dict[int, int] = {}
    for d in base.glob("node[0-9]*") if base.is_dir() else []:
        try:
            found[int(d.name[4:])] = len(cpu_list((d / "cpulist").read_text().strip()) - reserved)
        except (OSError, ValueError):
            continue
    return [found.get(k, 0) for k in range(max(found) + 1)] if found else []


def numa_fields(sys_root: Path, kubelet_config: dict[str, Any]) -> dict[str, Any]:
    """`numaPolicy` and `numaCpus` of the annotation, from the kubelet's configuration (nothing
    when its Topology Manager policy is none)."""
    policy = str(kubelet_config.get("topologyManagerPolicy") or "none")
    if policy == "none":
        return {}
    reserved = cpu_list(str(kubelet_config.get("reservedSystemCPUs") or ""))
    out: dict[str, Any] = {"numaPolicy": policy}
    cpus = numa_cpus(sys_root, reserved)
    if cpus:
        out["numaCpus"] = cpus
    return out
