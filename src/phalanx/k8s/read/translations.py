"""API objects translated once per version: nodes and pods by (uid, resourceVersion).

A cycle reads every object of the watch cache; most did not change since the last cycle, so their
translation (`parse_node`, `parse_pod`) is looked up instead of made again. Pod copies the scheduler
edited (its assumed binds, `ASSUMED`) are never cached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from phalanx.core.errors import SpecError
from phalanx.core.model import Node
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.nodes import parse_node
from phalanx.k8s.read.pods import PodInfo, parse_pod

T = TypeVar("T")
ASSUMED = "__phalanx_assumed__"  # set on pod copies the scheduler edited (never cached)


class Translations:
    """Parsed nodes and pods by (uid, resourceVersion): an object is translated once per version."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[str, Node | SpecError]] = {}
        self.pods: dict[str, tuple[str, PodInfo | SpecError]] = {}

    @staticmethod
    def _version(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")

    def node(self, obj: dict[str, Any], cfg: AdapterConfig) -> Node:
        return self._memo(self.nodes, obj, lambda: parse_node(obj, cfg))

    def pod(self, obj: dict[str, Any], cfg: AdapterConfig) -> PodInfo:
        if obj.get(ASSUMED):
            return parse_pod(obj, cfg)
        return self._memo(self.pods, obj, lambda: parse_pod(obj, cfg))

    def _memo(self, table: dict[str, tuple[str, Any]], obj: dict[str, Any], fn: Callable[[], T]) -> T:
        uid, rv = self._version(obj)
        if not uid or not rv:
            return fn()
        hit = table.get(uid)
        if hit is not None and hit[0] == rv:
            if isinstance(hit[1], SpecError):
                raise hit[1]
            return hit[1]  # type: ignore[no-any-return]
        try:
            out = fn()
        except SpecError as e:
            table[uid] = (rv, e)
            raise
        table[uid] = (rv, out)
        return out

    def forget_except(self, nodes: set[str], pods: set[str]) -> None:
        """Drop entries of objects that no longer exist (called now and then)."""
        for table, alive in ((self.nodes, nodes), (self.pods, pods)):
            for uid in [u for u in table if u not in alive]:
                del table[uid]
