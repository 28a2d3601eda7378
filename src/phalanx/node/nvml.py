"""NVML, or a module with the same function names (tests use a fake one; see tests/fake_nvml.py).

`nvidia-ml-py` (imported as `pynvml`) is NVIDIA's own binding. It is loaded only when asked
for, so that machines without NVIDIA's library (and CI) never need it.
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
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


def _mig_handles(nv: ModuleType, h: Any) -> Iterator[tuple[Any, str]]:
    """The GPU's MIG devices: each one's handle and `profile@start` (profiles named as nvidia-smi
    names them); one NVML does not answer for is skipped."""
    try:
        count = nv.nvmlDeviceGetMaxMigDeviceCount(h)
    except Exception:
        return
    for k in range(count):
        try:
            m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            name = _text(nv.nvmlDeviceGetName(m))  # "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
            gi = nv.nvmlDeviceGetGpuInstanceById(h, nv.nvmlDeviceGetGpuInstanceId(m))
            start = int(nv.nvmlGpuInstanceGetInfo(gi).placement.start)
        except Exception:
            continue
        yield m, f"{name.rsplit(' ', 1)[-1]}@{start}"


def _mig_instances(nv: ModuleType, h: Any) -> list[str]:
    """Existing GPU instances as `profile@start`."""
    return [where for _, where in _mig_handles(nv, h)]


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


# ---------------------------------------------------------------------------------------- MIG recuts
class MigBusy(Exception):
    """A process runs on an instance of the GPU: it is not cut (a running slice is never lost)."""


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a GPU instance with its compute instance) as containers get it."""

    gpu: int  # the parent GPU's index
    slice: str  # "1g.10gb@3"
    uuid: str
    busy: bool  # a process runs on it


def mig_devices(nv: ModuleType, gpu: GpuInfo) -> list[MigDevice]:
    """The MIG devices of a MIG-enabled GPU, with their UUIDs and whether a process runs on each."""
    out: list[MigDevice] = []
    for m, where in _mig_handles(nv, nv.nvmlDeviceGetHandleByIndex(gpu.index)):
        try:
            uuid = _text(nv.nvmlDeviceGetUUID(m))
        except Exception:
            continue
        try:
            busy = bool(nv.nvmlDeviceGetComputeRunningProcesses(m))
        except Exception:  # not answered: count it as busy, so that it is never cut
            busy = True
        out.append(MigDevice(gpu.index, where, uuid, busy))
    return out


def _gi_profiles(nv: ModuleType, h: Any) -> dict[int, Any]:
    """The GPU's GPU-instance profiles by their profile id (the `ID` nvidia-smi mig -lgip shows)."""
    out: dict[int, Any] = {}
    for k in range(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 16))):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, k)
        except Exception:
            continue
        out[int(info.id)] = info
    return out


def _listed(nv: ModuleType, fn: Any, handle: Any, pid: int, kind: str) -> list[Any]:
    """An NVML list call with its out-parameters (an array of handles and their count)."""
    struct = getattr(nv, kind, None)
    refs: Any = (struct * 8)() if struct is not None else [None] * 8
    count = ctypes.c_uint(0)
    fn(handle, pid, refs, ctypes.byref(count))
    return [refs[k] for k in range(count.value)]


def _destroy_all(nv: ModuleType, h: Any, profiles: dict[int, Any]) -> None:
    """Every compute instance, then every GPU instance (NVML refuses a GPU instance that still has one)."""
    ci_count = int(getattr(nv, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 8))
    for pid in profiles:
        for gi in _listed(nv, nv.nvmlDeviceGetGpuInstances, h, pid, "c_nvmlGpuInstance_t"):
            for cp in range(ci_count):
                try:
                    cis = _listed(
                        nv, nv.nvmlGpuInstanceGetComputeInstances, gi, cp, "c_nvmlComputeInstance_t"
                    )
                except Exception:
                    continue
                for ci in cis:
                    nv.nvmlComputeInstanceDestroy(ci)
            nv.nvmlGpuInstanceDestroy(gi)


def _create(nv: ModuleType, h: Any, info: Any, start: int, compute: int) -> None:
    """One GPU instance at `start`, and one compute instance over all of its slices."""
    struct = getattr(nv, "c_nvmlGpuInstancePlacement_t", None)
    size = int(info.sliceCount)
    placement = struct(start, size) if struct is not None else SimpleNamespace(start=start, size=size)
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, int(info.id), placement)
    shared = int(getattr(nv, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
    for cp in range(int(getattr(nv, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 8))):
        try:
            ci = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, cp, shared)
        except Exception:
            continue
        if int(ci.sliceCount) == compute:
            nv.nvmlGpuInstanceCreateComputeInstance(gi, int(ci.id))
            return
    raise NvmlUnavailable(f"no compute-instance profile of {compute} slice(s) on GPU instance at {start}")


def recut(nv: ModuleType, gpu: GpuInfo, layout: list[str]) -> None:
    """Cut an idle MIG GPU into `layout` (`profile@start`): destroy its instances and make these.
    MigBusy when a process runs on one of its instances (nothing is touched then); NvmlUnavailable
    when NVML refuses (the GPU may be left part-cut: the next try destroys and makes all again)."""
    from phalanx.core.mig import resolve_geometry

    busy = [d.slice for d in mig_devices(nv, gpu) if d.busy]
    if busy:
        raise MigBusy(f"a process runs on {', '.join(busy)}")
    geo = resolve_geometry(gpu.name.replace(" ", "-"), gpu.memory_mib)
    if geo is None:
        raise NvmlUnavailable(f"{gpu.name} has no known MIG geometry")
    h = nv.nvmlDeviceGetHandleByIndex(gpu.index)
    profiles = _gi_profiles(nv, h)
    wanted = []
    for item in layout:
        name, _, at = item.partition("@")
        prof = geo.profiles.get(name)
        if prof is None or not at.isdigit() or prof.gi_profile_id not in profiles:
            raise NvmlUnavailable(f"{item!r} is not a MIG instance {gpu.name} offers")
        wanted.append((profiles[prof.gi_profile_id], int(at), prof.compute))
    try:
        _destroy_all(nv, h, profiles)
        for info, start, compute in wanted:
            _create(nv, h, info, start, compute)
    except NvmlUnavailable:
        raise
    except Exception as e:  # NVMLError_InUse, _InsufficientResources, ...
        raise NvmlUnavailable(f"NVML refused the recut of GPU {gpu.index}: {e}") from None
