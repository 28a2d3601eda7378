"""A stand-in for NVIDIA's `pynvml` with the same function names, for tests on machines without GPUs.

Its GPUs come from `CONFIG` (set by the test) or from the JSON file `$PHALANX_FAKE_NVML` names (a
subprocess, e.g. `phalanx node reserve`, reads it there): a list of
{"uuid", "name", "memory_mib", "bus_id", "mig": bool, "nvlinks": [bus ids]}; `{"missing": true}`
makes nvmlInit fail as it does on a node without the driver.

Inside a container, NVML sees only the GPUs the NVIDIA container runtime put there, the ones
`NVIDIA_VISIBLE_DEVICES` names (by UUID or index; `all` or unset: every GPU; `none`/`void`: none).
The fake does the same, so that a pod given GPUs by a device plugin sees just those.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

CONFIG: dict[str, Any] | None = None
NVML_NVLINK_MAX_LINKS = 18


class NVMLError(Exception):
    pass


def _cfg() -> dict[str, Any]:
    if CONFIG is not None:
        return _visible(CONFIG)
    path = os.environ.get("PHALANX_FAKE_NVML", "")
    if not path:
        raise NVMLError("NVML Shared Library Not Found")
    with open(path) as f:
        return _visible(json.load(f))


def _visible(cfg: dict[str, Any]) -> dict[str, Any]:
    """The GPUs NVIDIA_VISIBLE_DEVICES lets a container see, as the NVIDIA runtime would."""
    wanted = os.environ.get("NVIDIA_VISIBLE_DEVICES", "all").strip()
    if wanted in ("", "all") or "gpus" not in cfg:
        return cfg
    names = {w.strip() for w in wanted.split(",")} - {"none", "void"}
    gpus = [g for k, g in enumerate(cfg["gpus"]) if g["uuid"] in names or str(k) in names]
    return {**cfg, "gpus": gpus}


def nvmlInit() -> None:
    if _cfg().get("missing"):
        raise NVMLError("NVML Shared Library Not Found")


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_cfg()["gpus"])


def nvmlDeviceGetHandleByIndex(i: int) -> dict[str, Any]:
    return _cfg()["gpus"][i]  # type: ignore[no-any-return]


def nvmlDeviceGetUUID(h: dict[str, Any]) -> str:
    return str(h["uuid"])


def nvmlDeviceGetName(h: dict[str, Any]) -> str:
    return str(h["name"])


def nvmlDeviceGetMemoryInfo(h: dict[str, Any]) -> Any:
    return SimpleNamespace(total=int(h["memory_mib"]) * 2**20)


def nvmlDeviceGetPciInfo(h: dict[str, Any]) -> Any:
    domain, _, rest = h["bus_id"].partition(":")
    return SimpleNamespace(busId=f"{int(domain, 16):08X}:{rest.upper()}")


def nvmlDeviceGetMigMode(h: dict[str, Any]) -> tuple[int, int]:
    if "mig" not in h:
        raise NVMLError("Not Supported")
    return (1, 1) if h["mig"] else (0, 0)


def nvmlDeviceGetMaxMigDeviceCount(h: dict[str, Any]) -> int:
    return len(h.get("mig_instances", []))


def nvmlDeviceGetMigDeviceHandleByIndex(h: dict[str, Any], k: int) -> dict[str, Any]:
    profile, start = h["mig_instances"][k].split("@")
    return {"name": f"{h['name']} MIG {profile}", "start": int(start), "gi": k}


def nvmlDeviceGetGpuInstanceId(m: dict[str, Any]) -> int:
    return int(m["gi"])


def nvmlDeviceGetGpuInstanceById(h: dict[str, Any], gi: int) -> dict[str, Any]:
    start = h["mig_instances"][gi].split("@")[1]
    return {"start": int(start)}


def nvmlGpuInstanceGetInfo(gi: dict[str, Any]) -> Any:
    return SimpleNamespace(placement=SimpleNamespace(start=gi["start"]))


def nvmlDeviceGetNvLinkState(h: dict[str, Any], link: int) -> int:
    return 1 if link < len(h.get("nvlinks", [])) else 0


def nvmlDeviceGetNvLinkRemotePciInfo(h: dict[str, Any], link: int) -> Any:
    return nvmlDeviceGetPciInfo({"bus_id": h["nvlinks"][link]})
