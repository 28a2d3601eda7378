"""A GPU reservation pod read back: which slot (node, GPU index) it holds.

The reservation pods themselves are made and deleted by the act side (`shares`); the world reads
them from the store with this, so reading never depends on acting.
"""

from __future__ import annotations

from typing import Any

from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig

Slot = tuple[str, int]  # (node, GPU index)


def slot_of(pod: dict[str, Any], cfg: AdapterConfig) -> Slot | None:
    """(node, GPU index) of a reservation pod; None for any other pod (or one in another namespace)."""
    meta = pod.get("metadata") or {}
    if meta.get("namespace") != cfg.reservation_namespace:
        return None
    index = (meta.get("labels") or {}).get(keys.GPU_RESERVATION)
    node = (pod.get("spec") or {}).get("nodeName") or (meta.get("annotations") or {}).get(keys.NODE_INTENT)
    if index is None or not str(index).isdigit() or not node:
        return None
    return str(node), int(index)
