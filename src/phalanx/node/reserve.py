"""`phalanx node reserve`: the GPU-reservation pod's program (KAI's mechanism for shares).

The pod asks the stock NVIDIA device plugin for one whole GPU (`nvidia.com/gpu: 1`); inside
it, NVML sees exactly that GPU. This finds its UUID and writes it on the pod itself
(`phalanx.io/reserved-gpu`), where the scheduler reads it to give the pods that share the GPU
`NVIDIA_VISIBLE_DEVICES=<uuid>`. Then it holds the GPU until the pod is deleted.

With `--mig` the pod asks for one MIG device (`nvidia.com/mig-<profile>: 1`), for a fraction a MIG
instance serves, and this reports the MIG device's UUID. It is read first from
`NVIDIA_VISIBLE_DEVICES`, which the device plugin's Allocate answer sets to the device kubelet
handed the pod (Phalanx's MIG plugin and NVIDIA's, with its default `envvar` strategy): that is the
allocation itself, and in the form the container runtime takes. NVML is the fallback (another
device-list strategy leaves the variable a path or unset): inside an unprivileged container NVML
lists the MIG devices given to it, but the calls that place an instance on its GPU need rights the
container lacks, so only the UUIDs are read there.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import ModuleType

from lightkube import Client
from lightkube.resources.core_v1 import Pod

from phalanx.node import nvml

log = logging.getLogger("phalanx.node")
RESERVED_GPU = "phalanx.io/reserved-gpu"


def my_gpu(nvml_module: str) -> str:
    nv = nvml.load(nvml_module)
    try:
        gpus = nvml.gpus(nv)
    finally:
        nv.nvmlShutdown()
    if len(gpus) != 1:
        raise nvml.NvmlUnavailable(f"a reservation pod must see exactly one GPU, NVML shows {len(gpus)}")
    return gpus[0].uuid


def _visible_mig(nv: ModuleType) -> list[str]:
    """The UUIDs of the MIG devices NVML shows (on any GPU it shows)."""
    out: list[str] = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        try:
            count = nv.nvmlDeviceGetMaxMigDeviceCount(h)
        except Exception:  # not MIG-capable
            continue
        for k in range(count):
            try:
                out.append(nvml._text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k))))
            except Exception:  # no instance at k, or not this container's
                continue
    return out


def my_mig(nvml_module: str, visible: str | None = None) -> str:
    """The UUID of the one MIG device this pod holds: the one `NVIDIA_VISIBLE_DEVICES` names
    (`visible`; default: this process's), else the one NVML shows."""
    text = os.environ.get("NVIDIA_VISIBLE_DEVICES", "") if visible is None else visible
    named = [d.strip() for d in text.split(",") if d.strip().startswith("MIG-")]
    if len(named) == 1:
        return named[0]
    if len(named) > 1:
        raise nvml.NvmlUnavailable(
            "a MIG reservation pod must hold exactly one MIG device, "
            f"NVIDIA_VISIBLE_DEVICES names {len(named)}"
        )
    nv = nvml.load(nvml_module)
    try:
        seen = _visible_mig(nv)
    finally:
        nv.nvmlShutdown()
    if len(seen) != 1:
        raise nvml.NvmlUnavailable(
            f"a MIG reservation pod must see exactly one MIG device, NVML shows {len(seen)} "
            f"(and NVIDIA_VISIBLE_DEVICES={text!r} names none)"
        )
    return seen[0]


def run(
    client: Client, namespace: str, name: str, nvml_module: str, once: bool = False, mig: bool = False
) -> str:
    uuid = my_mig(nvml_module) if mig else my_gpu(nvml_module)
    client.patch(Pod, name, {"metadata": {"annotations": {RESERVED_GPU: uuid}}}, namespace=namespace)
    log.info("pod %s/%s holds %s %s", namespace, name, "MIG device" if mig else "GPU", uuid)
    if not once:
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        done.wait()
    return uuid
