"""A GPU reservation pod read back: which slot it holds.

A slot is (node, GPU index) for a whole GPU, and (node, GPU index, "profile@start") for a MIG
instance that serves a fraction. A MIG reservation pod's instance is read from its
`phalanx.io/mig-slice` and `phalanx.io/gpu-devices`, which the MIG device plugin corrects when
kubelet handed it another instance than the one chosen (the slot follows what it really holds).

The reservation pods themselves are made and deleted by the act side (`shares`); the world reads
them from the store with this, so reading never depends on acting.
"""

from __future__ import annotations

from typing import Any

from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig

Slot = tuple[str, int] | tuple[str, int, str]  # (node, GPU index[, MIG instance "profile@start"])


def slot_mig(slot: Slot) -> str:
    """The MIG instance a slot holds ("profile@start"), or "" for a whole GPU."""
    return slot[2] if len(slot) == 3 else ""


def slot_text(slot: Slot) -> str:
    """The slot as messages say it: "GPU 0 of n1", "MIG instance 1g.10gb@3 of GPU 0 of n1"."""
    mig = slot_mig(slot)
    return f"MIG instance {mig} of GPU {slot[1]} of {slot[0]}" if mig else f"GPU {slot[1]} of {slot[0]}"


def slot_of(pod: dict[str, Any], cfg: AdapterConfig) -> Slot | None:
    """The slot of a reservation pod; None for any other pod (or one in another namespace)."""
    meta = pod.get("metadata") or {}
    if meta.get("namespace") != cfg.reservation_namespace:
        return None
    notes = meta.get("annotations") or {}
    index = (meta.get("labels") or {}).get(keys.GPU_RESERVATION)
    node = (pod.get("spec") or {}).get("nodeName") or notes.get(keys.NODE_INTENT)
    if index is None or not str(index).isdigit() or not node:
        return None
    mig = str(notes.get(keys.MIG_SLICE) or "")
    if mig:
        gpu = str(notes.get(keys.GPU_DEVICES) or "").strip()
        return str(node), int(gpu) if gpu.isdigit() else int(index), mig
    return str(node), int(index)
