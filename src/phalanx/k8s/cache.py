"""Informers: list, then watch from the list's resourceVersion; resume after drops, relist on 410.

The store keeps the latest version of every object by kind; each cycle reads a copy of it.
`changed` is set by every event so that the scheduler can run a cycle early.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from phalanx.k8s.api import Api, Gone

log = logging.getLogger("phalanx.k8s")


def object_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Store:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self.synced: set[str] = set()
        self.changed = threading.Event()
        self.relists = 0

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self.lock:
            self.objects[kind] = {object_key(o): o for o in items}
            self.synced.add(kind)
            self.relists += 1
        self.changed.set()

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        with self.lock:
            table = self.objects.setdefault(kind, {})
            if event == "DELETED":
                table.pop(object_key(obj), None)
            else:
                table[object_key(obj)] = obj
        self.changed.set()

    def items(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.objects.get(kind, {}).values())

    def is_synced(self, kinds: tuple[str, ...]) -> bool:
        with self.lock:
            return all(k in self.synced for k in kinds)


class Informer(threading.Thread):
    """One kind: keeps `store` in step with the API server until `stop` is set."""

    def __init__(
        self,
        api: Api,
        kind: str,
        store: Store,
        stop: threading.Event,
        backoff: float = 0.5,
        absent_retry: float = 30.0,
        on_error: Callable[[str, Exception], None] | None = None,
    ) -> None:
        super().__init__(name=f"informer-{kind}", daemon=True)
        self.api = api
        self.kind = kind
        self.store = store
        self.stop = stop
        self.backoff = backoff
        self.absent_retry = absent_retry
        self.on_error = on_error
        self.resource_version = ""

    def run(self) -> None:
        delay = self.backoff
        while not self.stop.is_set():
            try:
                if not self.resource_version:
                    items, rv = self.api.list(self.kind)
                    self.store.replace(self.kind, items)
                    if not rv:  # the CRD is not installed: look again later
                        self.stop.wait(self.absent_retry)
                        continue
                    self.resource_version = rv
                for event, obj in self.api.watch(self.kind, self.resource_version):
                    self.store.apply(self.kind, event, obj)
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                    if rv:
                        self.resource_version = rv
                    if self.stop.is_set():
                        return
                delay = self.backoff  # the server closed the stream cleanly: resume
            except Gone:
                log.info("watch of %s expired (410): listing again", self.kind)
                self.resource_version = ""
            except Exception as e:  # a dropped connection, a 5xx, a timeout: resume after a pause
                if self.on_error is not None:
                    self.on_error(self.kind, e)
                log.warning("watch of %s failed (%s): retrying in %.1f s", self.kind, type(e).__name__, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 30.0)
