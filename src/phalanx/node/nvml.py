"""NVML, or a module with the same function names (tests use a fake one; see tests/fake_nvml.py).

`nvidia-ml-py` (imported as `pynvml`) is NVIDIA's own binding. It is loaded only when asked
for, so that machines without NVIDIA's library (and CI) never need it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


class NvmlUnavailable(Exception):
    """No NVML on this machine (no driver, no library, or no module): say so, do not crash."""


@dataclass
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_mib: int
    bus_id: str  # 0000:05:00.0, as sysfs names it
    mig: bool = False
    mig_instances: list[str] = field(default_factory=list)  # "3g.40gb@4"
    nvlink_peers: list[str] = field(default_factory=list)  # bus ids of the GPUs its NVLinks reach


def load(module: str = "pynvml") -> ModuleType:
    try:
        nv = importlib.import_module(module)
    except ImportError as e:
        raise NvmlUnavailable(f"no NVML module {module!r} ({e}); install nvidia-ml-py on GPU nodes") from None
    try:
        nv.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        raise NvmlUnavailable(f"NVML could not start: {e}") from None
    return nv


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def bus_id(raw: Any) -> str:
    """NVML's `00000000:05:00.0` -> sysfs's `0000:05:00.0`."""
    text = _text(raw).lower()
    domain, _, rest = text.partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def gpus(nv: ModuleType) -> list[GpuInfo]:
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        info = GpuInfo(
            index=i,
            uuid=_text(nv.nvmlDeviceGetUUID(h)),
            name=_text(nv.nvmlDeviceGetName(h)),
            memory_mib=int(nv.nvmlDeviceGetMemoryInfo(h).total) // 2**20,
            bus_id=bus_id(nv.nvmlDeviceGetPciInfo(h).busId),
        )
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(h)
            info.mig = bool(current)
        except Exception:  # not MIG-capable
            info.mig = False
        if info.mig:
            info.mig_instances = _mig_instances(nv, h)
        info.nvlink_peers = _nvlink_peers(nv, h)
        out.append(info)
    return out


def _mig_instances(nv: ModuleType, h: Any) -> list[str]:
    """Existing GPU instances as `profile@start` (profiles named as nvidia-smi names them)."""
    out: list[str] = []
    try:
        count = nv.nvmlDeviceGetMaxMigDeviceCount(h)
    except Exception:
        return out
    for k in range(count):
        try:
            m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
        except Exception:
            continue
        try:
            name = _text(nv.nvmlDeviceGetName(m))  # "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
            gi = nv.nvmlDeviceGetGpuInstanceById(h, nv.nvmlDeviceGetGpuInstanceId(m))
            start = int(nv.nvmlGpuInstanceGetInfo(gi).placement.start)
        except Exception:
            continue
        out.append(f"{name.rsplit(' ', 1)[-1]}@{start}")
    return out


def _nvlink_peers(nv: ModuleType, h: Any) -> list[str]:
    peers = []
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if not nv.nvmlDeviceGetNvLinkState(h, link):
                continue
            peers.append(bus_id(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
        except Exception:
            continue
    return sorted(set(peers))
