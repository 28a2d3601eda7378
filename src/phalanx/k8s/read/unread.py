"""What no cycle reads, left out of an object as it comes in (as kube-scheduler's informers strip
managedFields): managedFields, kubectl's last-applied-configuration, and containers' command,
args and environment (which may also hold secrets).

The watch cache keeps each object for as long as it exists, so what it keeps is most of the
scheduler's memory at scale; a capture (`phalanx capture`) writes objects the same way. Nothing of
ours reads these fields back, and no write of ours sends a cached object back whole (status and
annotations are patched).
"""

from __future__ import annotations

from typing import Any

NOTES = ("kubectl.kubernetes.io/last-applied-configuration",)
CONTAINER = ("command", "args", "env", "envFrom")


def unread_left_out(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` (of the store's `kind` key: "pods", ...) without what no cycle reads; changed in place."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        notes = meta.get("annotations")
        if isinstance(notes, dict):
            for k in NOTES:
                notes.pop(k, None)
    spec = obj.get("spec")
    if kind == "pods" and isinstance(spec, dict):
        for key in ("containers", "initContainers"):
            containers = spec.get(key)
            for c in containers if isinstance(containers, list) else ():
                if isinstance(c, dict):
                    for k in CONTAINER:
                        c.pop(k, None)
    return obj


__all__ = ["unread_left_out"]
