"""`phalanx node reserve`: the GPU-reservation pod's program (KAI's mechanism for shares).

The pod asks the stock NVIDIA device plugin for one whole GPU (`nvidia.com/gpu: 1`); inside
it, NVML sees exactly that GPU. This finds its UUID and writes it on the pod itself
(`phalanx.io/reserved-gpu`), where the scheduler reads it to give the pods that share the GPU
`NVIDIA_VISIBLE_DEVICES=<uuid>`. Then it holds the GPU until the pod is deleted.
"""

from __future__ import annotations

import logging
import signal
import threading

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


def run(client: Client, namespace: str, name: str, nvml_module: str, once: bool = False) -> str:
    uuid = my_gpu(nvml_module)
    client.patch(Pod, name, {"metadata": {"annotations": {RESERVED_GPU: uuid}}}, namespace=namespace)
    log.info("pod %s/%s holds GPU %s", namespace, name, uuid)
    if not once:
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        done.wait()
    return uuid
