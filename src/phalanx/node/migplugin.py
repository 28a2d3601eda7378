"""`phalanx node device-plugin --mig-strategy mixed`: MIG devices as `nvidia.com/mig-<profile>`, recuts too.

NVIDIA's device plugin in its `mixed` strategy offers each MIG profile as a resource of its own, and
reads the instances once at its start (after a reconfiguration, the MIG manager restarts it). Here a
MIG GPU may be cut anew while pods run on the node's other GPUs (`phalanx node discover
--mig-recut`), so the plugin looks at NVML every `interval` seconds: a profile seen for the first
time gets a plugin registered for it, and each plugin's ListAndWatch sends its new device list, so
kubelet's offer follows the cut without a restart. A profile no GPU has any more stays registered
with no devices.

The device a pod gets is the one the scheduler chose (`phalanx.io/mig-slice` on the GPU of
`phalanx.io/gpu-devices`), through GetPreferredAllocation as for whole GPUs; containers get
`NVIDIA_VISIBLE_DEVICES=<MIG device UUID>`, as with NVIDIA's plugin.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.node import nvml, podresources, topology
from phalanx.node.deviceplugin import GPU_ALLOCATED, GPU_DEVICES, Plugin, PodSource

log = logging.getLogger("phalanx.node")
MIG_PREFIX = "nvidia.com/mig-"
MIG_SLICE = "phalanx.io/mig-slice"


@dataclass(frozen=True)
class MigSlot:
    gpu: int
    slice: str  # "1g.10gb@3"
    uuid: str
    numa: int = 0

    @property
    def profile(self) -> str:
        return self.slice.partition("@")[0]


def mig_slots(sys_root: Path, nvml_module: str) -> list[MigSlot]:
    """The MIG devices of the node's MIG-enabled GPUs, by GPU and start."""
    nv = nvml.load(nvml_module)
    try:
        out = []
        for g in nvml.gpus(nv):
            if g.mig:
                numa = topology.numa_of(sys_root, g.bus_id)
                out += [MigSlot(d.gpu, d.slice, d.uuid, numa) for d in nvml.mig_devices(nv, g)]
    finally:
        nv.nvmlShutdown()
    return sorted(out, key=lambda s: (s.gpu, int(s.slice.partition("@")[2] or 0), s.slice))


@dataclass
class Inventory:
    """The node's MIG devices as NVML showed them last (read by every profile's plugin)."""

    slots: list[MigSlot] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, slots: list[MigSlot]) -> None:
        with self.lock:
            self.slots = list(slots)

    def of(self, profile: str) -> list[MigSlot]:
        with self.lock:
            return [s for s in self.slots if s.profile == profile]


@dataclass
class MigPlugin(Plugin):
    inventory: Inventory = field(default_factory=Inventory)
    profile: str = ""

    def listed(self) -> list[tuple[str, int]]:
        return [(s.uuid, s.numa) for s in self.inventory.of(self.profile)]

    def wanted(self, pod: dict[str, Any]) -> list[str] | None:
        notes = (pod.get("metadata") or {}).get("annotations") or {}
        chosen, gpu = str(notes.get(MIG_SLICE, "")), str(notes.get(GPU_DEVICES, "")).strip()
        for s in self.inventory.of(self.profile):
            if s.slice == chosen and str(s.gpu) == gpu:
                return [s.uuid]
        return None


def reconcile(source: PodSource, inventory: Inventory, got: dict[str, list[str]]) -> list[str]:
    """Make the pods' annotations say which MIG device kubelet gave each (`got`: its PodResources
    record, device IDs by `namespace/name`): the device (`phalanx.io/gpu-allocated`) and, for a pod
    the scheduler placed, the slice and GPU it is on, which the scheduler's accounting reads. Kubelet
    gives the device the plugin prefers, but the plugin can only guess which pod is being admitted:
    several pods bound in the same second make that guess wrong, and then this puts it right.
    Returns the pods corrected."""
    by_uuid = {s.uuid: s for s in inventory.slots}
    fixed = []
    for p in source.pods():
        meta = p.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        slots = [by_uuid[i] for i in got.get(key, []) if i in by_uuid]
        if len(slots) != 1:  # a pod asks for one MIG slice
            continue
        s = slots[0]
        notes = meta.get("annotations") or {}
        want = {GPU_ALLOCATED: s.uuid}
        if MIG_SLICE in notes:
            want |= {MIG_SLICE: s.slice, GPU_DEVICES: str(s.gpu)}
        if all(notes.get(k) == v for k, v in want.items()):
            continue
        if MIG_SLICE in notes and notes.get(MIG_SLICE) != s.slice:
            log.info(
                "pod %s got %s on GPU %d, not the chosen %s: its annotations follow",
                key,
                s.slice,
                s.gpu,
                notes[MIG_SLICE],
            )
        source.note(p, want)
        fixed.append(key)
    return fixed


def serve(
    source: PodSource,
    socket_dir: Path,
    read: Any,
    stop: threading.Event,
    interval: float = 2.0,
    pod_resources: Path = podresources.SOCKET,
) -> None:
    """Keep a plugin for every MIG profile the node has had, their devices as `read()` gives them
    every `interval` seconds, until `stop`; and the pods' annotations as kubelet allocated them."""
    inventory = Inventory()
    plugins: dict[str, threading.Thread] = {}
    while not stop.is_set():
        try:
            inventory.set(read())
        except nvml.NvmlUnavailable as e:
            log.warning("MIG devices not read: %s", e)
        if plugins:
            try:
                reconcile(source, inventory, podresources.devices(pod_resources, MIG_PREFIX))
            except Exception as e:  # kubelet away, or a pod patch refused: the next look tries again
                log.warning("MIG allocations not read back: %s", e)
        for profile in sorted({s.profile for s in inventory.slots} - set(plugins)):
            plugin = MigPlugin(
                [],
                source,
                socket_dir,
                resource=MIG_PREFIX + profile,
                endpoint=f"phalanx-mig-{profile}.sock",
                stop=stop,
                inventory=inventory,
                profile=profile,
            )
            plugins[profile] = threading.Thread(target=plugin.run, name=f"mig-{profile}", daemon=True)
            plugins[profile].start()
            log.info("serving %s%s", MIG_PREFIX, profile)
        stop.wait(interval)
    for t in plugins.values():
        t.join(timeout=10)
