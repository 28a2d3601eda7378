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
    return len(_devices(h))


def nvmlDeviceGetMigDeviceHandleByIndex(h: dict[str, Any], k: int) -> dict[str, Any]:
    inst = _devices(h)[k]
    profile, start = inst.split("@")
    return {
        "name": f"{h['name']} MIG {profile}",
        "start": int(start),
        "gi": k,
        "uuid": f"MIG-{h['uuid'].removeprefix('GPU-')}-{profile}-{start}",
        "busy": inst in h.get("mig_busy", []),
    }


def nvmlDeviceGetGpuInstanceId(m: dict[str, Any]) -> int:
    return int(m["gi"])


def nvmlDeviceGetGpuInstanceById(h: dict[str, Any], gi: int) -> dict[str, Any]:
    start = _devices(h)[gi].split("@")[1]
    return {"start": int(start)}


def nvmlGpuInstanceGetInfo(gi: dict[str, Any]) -> Any:
    return SimpleNamespace(placement=SimpleNamespace(start=gi["start"]))


def nvmlDeviceGetNvLinkState(h: dict[str, Any], link: int) -> int:
    return 1 if link < len(h.get("nvlinks", [])) else 0


def nvmlDeviceGetNvLinkRemotePciInfo(h: dict[str, Any], link: int) -> Any:
    return nvmlDeviceGetPciInfo({"bus_id": h["nvlinks"][link]})


# ------------------------------------------------------------------------------ MIG: making and unmaking
# A GPU's MIG state is in its entry: "mig_instances" (`profile@start`), "mig_busy" (instances a
# process runs on) and "mig_no_ci" (GPU instances with no compute instance yet: not MIG devices).
# A change is written back (to CONFIG, or to the JSON file, which the other processes read).
NVML_GPU_INSTANCE_PROFILE_COUNT = 10
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 8
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
# NVML's GPU-instance profile enum -> (profile id, slices, memory slots, name suffix by GPU memory)
_GI = {0: (19, 1, 1), 1: (14, 2, 2), 2: (9, 3, 4), 3: (5, 4, 4), 4: (0, 7, 8), 7: (20, 1, 1), 9: (15, 1, 2)}
_CI = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}  # compute-instance profile enum -> slices (its id is the enum)
CALLS: list[str] = []  # what was made and unmade, in order (unit tests read it)


def _raw() -> dict[str, Any]:
    if CONFIG is not None:
        return CONFIG
    with open(os.environ["PHALANX_FAKE_NVML"]) as f:
        return json.load(f)  # type: ignore[no-any-return]


def _change(uuid: str, fn: Any) -> Any:
    """Apply `fn` to the GPU's entry and write it back."""
    cfg = _raw()
    gpu = next(g for g in cfg["gpus"] if g["uuid"] == uuid)
    out = fn(gpu)
    if CONFIG is None:
        path = os.environ["PHALANX_FAKE_NVML"]
        with open(path + ".tmp", "w") as f:
            json.dump(cfg, f)
        os.replace(path + ".tmp", path)
    return out


def _devices(h: dict[str, Any]) -> list[str]:
    return [i for i in h.get("mig_instances", []) if i not in h.get("mig_no_ci", [])]


def _slots(h: dict[str, Any], inst: str) -> set[int]:
    from phalanx.core.mig import resolve_geometry

    geo = resolve_geometry(h["name"].replace(" ", "-"), int(h["memory_mib"]))
    assert geo is not None
    name, _, start = inst.partition("@")
    prof = geo.profiles[name]
    return set(range(int(start), int(start) + prof.slots))


def _profile_name(h: dict[str, Any], pid: int) -> str:
    from phalanx.core.mig import resolve_geometry

    geo = resolve_geometry(h["name"].replace(" ", "-"), int(h["memory_mib"]))
    assert geo is not None
    return next(p.name for p in geo.profiles.values() if p.gi_profile_id == pid)


def nvmlDeviceGetGpuInstanceProfileInfo(h: dict[str, Any], k: int) -> Any:
    if not h.get("mig") or k not in _GI:
        raise NVMLError("Not Supported")
    pid, slices, slots = _GI[k]
    return SimpleNamespace(id=pid, sliceCount=slices, memorySizeMB=slots * int(h["memory_mib"]) // 8)


def _fill(refs: Any, count: Any, items: list[dict[str, Any]]) -> None:
    """NVML's out-parameters: the array and the count (a ctypes byref)."""
    for k, item in enumerate(items):
        refs[k] = item
    count._obj.value = len(items)


def nvmlDeviceGetGpuInstances(h: dict[str, Any], pid: int, refs: Any, count: Any) -> None:
    name = _profile_name(h, pid)
    mine = [i for i in h.get("mig_instances", []) if i.split("@")[0] == name]
    _fill(refs, count, [{"uuid": h["uuid"], "inst": i} for i in mine])


def nvmlGpuInstanceGetComputeInstances(gi: dict[str, Any], cp: int, refs: Any, count: Any) -> None:
    h = next(g for g in _raw()["gpus"] if g["uuid"] == gi["uuid"])
    if gi["inst"] in h.get("mig_no_ci", []) or gi["inst"] not in h.get("mig_instances", []):
        return _fill(refs, count, [])
    pid = next(p for p, *_ in _GI.values() if _profile_name(h, p) == gi["inst"].split("@")[0])
    slices = next(s for p, s, _ in _GI.values() if p == pid)
    _fill(refs, count, [dict(gi)] if _CI.get(cp) == slices else [])


def nvmlComputeInstanceDestroy(ci: dict[str, Any]) -> None:
    def go(h: dict[str, Any]) -> None:
        if ci["inst"] in h.get("mig_busy", []):
            raise NVMLError("In use by another client")
        h.setdefault("mig_no_ci", []).append(ci["inst"])

    _change(ci["uuid"], go)
    CALLS.append(f"destroy ci {ci['inst']}")


def nvmlGpuInstanceDestroy(gi: dict[str, Any]) -> None:
    def go(h: dict[str, Any]) -> None:
        if gi["inst"] not in h.get("mig_no_ci", []):
            raise NVMLError("In use by another client")  # its compute instance is still there
        h["mig_instances"].remove(gi["inst"])
        h["mig_no_ci"].remove(gi["inst"])

    _change(gi["uuid"], go)
    CALLS.append(f"destroy gi {gi['inst']}")


def nvmlDeviceCreateGpuInstanceWithPlacement(h: dict[str, Any], pid: int, placement: Any) -> dict[str, Any]:
    inst = f"{_profile_name(h, pid)}@{placement.start}"

    def go(g: dict[str, Any]) -> None:
        taken = set().union(*(_slots(g, i) for i in g.get("mig_instances", [])))
        if taken & _slots(g, inst):
            raise NVMLError("Insufficient Resources")
        g.setdefault("mig_instances", []).append(inst)
        g.setdefault("mig_no_ci", []).append(inst)

    _change(h["uuid"], go)
    CALLS.append(f"create gi {inst}")
    return {"uuid": h["uuid"], "inst": inst}


def nvmlGpuInstanceGetComputeInstanceProfileInfo(gi: dict[str, Any], cp: int, eng: int) -> Any:
    if cp not in _CI:
        raise NVMLError("Not Supported")
    return SimpleNamespace(id=cp, sliceCount=_CI[cp])


def nvmlGpuInstanceCreateComputeInstance(gi: dict[str, Any], cp: int) -> dict[str, Any]:
    _change(gi["uuid"], lambda h: h["mig_no_ci"].remove(gi["inst"]))
    CALLS.append(f"create ci {gi['inst']}")
    return dict(gi)


def nvmlDeviceGetComputeRunningProcesses(m: dict[str, Any]) -> list[Any]:
    return [SimpleNamespace(pid=4242)] if m.get("busy") else []
