"""Fake sysfs trees for topology discovery: a DGX-like node and a one-GPU workstation.

Only what discovery reads: /sys/devices/pci*/... device folders (with numa_node),
/sys/bus/pci/devices/<bdf> links to them, /sys/class/infiniband/<dev>/{device, ports/1/rate,
device/net/<ifname>}. The links are relative, as the kernel's are, so a tree still reads right
when it is mounted somewhere else (a container's hostPath).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _device(root: Path, chain: list[str], numa: int) -> Path:
    d = root / "devices" / Path(*chain)
    d.mkdir(parents=True, exist_ok=True)
    (d / "numa_node").write_text(f"{numa}\n")
    link = root / "bus" / "pci" / "devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(d, link.parent))
    return d


def _nic(root: Path, dev: Path, name: str, ifname: str, gbps: int) -> None:
    ib = root / "class" / "infiniband" / name
    (ib / "ports" / "1").mkdir(parents=True)
    (ib / "ports" / "1" / "rate").write_text(f"{gbps} Gb/sec (4X NDR)\n")
    (ib / "device").symlink_to(os.path.relpath(dev, ib))
    (dev / "net" / ifname).mkdir(parents=True)


def dgx(root: Path, switches: int = 4, uuid_prefix: str = "GPU-") -> list[dict[str, Any]]:
    """8 GPUs and 4 RDMA NICs behind 4 PCIe switches (2 GPUs + 1 NIC each), on 2 NUMA nodes,
    all GPUs in one NVLink domain (NVSwitch). Returns the fake NVML's GPU list. With fewer
    `switches`, the first ones only (2: 4 GPUs and 2 NICs on NUMA node 0)."""
    gpus = []
    for sw in range(switches):
        numa = sw // 2
        rc = "pci0000:00" if numa == 0 else "pci0000:80"
        bus = 0x10 * (sw + 1) + (0x80 if numa else 0)
        port = f"0000:{0x80 if numa else 0:02x}:{1 + sw % 2:02x}.0"  # root port
        up = f"0000:{bus:02x}:00.0"
        for slot in range(3):
            down = f"0000:{bus + 1:02x}:{slot:02x}.0"
            dev = f"0000:{bus + 2 + slot:02x}:00.0"
            d = _device(root, [rc, port, up, down, dev], numa)
            if slot < 2:
                gpus.append(dev)
            else:
                _nic(root, d, f"mlx5_{sw}", f"ibp{bus + 2 + slot}s0", 400)
    return [
        {
            "uuid": f"{uuid_prefix}{k:08d}-aaaa-bbbb-cccc-000000000000",
            "name": "NVIDIA H100 80GB HBM3",
            "memory_mib": 81559,
            "bus_id": b,
            "mig": False,
            "nvlinks": [o for o in gpus if o != b],
        }
        for k, b in enumerate(gpus)
    ]


def workstation(root: Path) -> list[dict[str, Any]]:
    """One GPU right below a root port, no RDMA NIC, no NUMA (numa_node -1)."""
    _device(root, ["pci0000:00", "0000:00:01.0", "0000:01:00.0"], -1)
    return [{"uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA GeForce RTX 4090",
             "memory_mib": 24564, "bus_id": "0000:01:00.0"}]  # fmt: skip
