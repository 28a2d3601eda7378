"""Informers: list, then watch from the list's resourceVersion; resume after drops, relist on 410.

The store keeps the latest version of every object by kind; each cycle reads a copy of it.
`changed` is set by every event so that the scheduler can run a cycle early. Every change is also
noted in a bounded change feed (`Store.changes`): a reader asks what changed since the generation it
last read, and gets the keys by kind, or None when it fell behind the feed (then it reads everything).

Which kinds are watched follows API discovery (`Informers`): a kind the server does not
serve (a CRD that is not installed) is skipped with one INFO line and looked for again
every `rediscover_s`; scheduling never waits for it. A kind that disappears (its CRD
deleted) is emptied and looked for again the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, Protocol

from phalanx.k8s.client.api import Api, Forbidden, Gone, NotFound
from phalanx.k8s.client.kinds import Kind

log = logging.getLogger("phalanx.k8s")


def object_key(obj: dict[str, Any], default_namespace: str | None = None) -> str:
    """`namespace/name`, the key every room files an object under; a cluster-scoped object (a
    Node, a Queue) is its name alone.

    `default_namespace`: the namespace an object that does not say reads as, where the key must
    match a pod's (`PodInfo.key`: a pod without one is in "default", as the API would put it);
    then a missing name reads as "". Without it, the store's key, where no namespace means none.
    """
    meta = obj.get("metadata") or {}
    if default_namespace is not None:
        return f"{meta.get('namespace', default_namespace)}/{meta.get('name', '')}"
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


# A whole kind changed (listed again, or no longer served): its readers read all of it.
EVERY = "*"
# Changes since a generation, by kind: the keys that changed, or None for the whole kind.
Changes = dict[str, set[str] | None]


class Admitted(NamedTuple):
    """A store's gate on one event (a scheduling shard's: `phalanx.k8s.read.shard`)."""

    keep: bool  # the object is kept (else dropped, or never taken)
    also: tuple[str, str] | None = None  # another change to note beside it: (kind, key)


class Gate(Protocol):
    """What a store keeps (a scheduling shard keeps only its share of the cluster)."""

    def attached(self, store: Store) -> None:
        """The store it guards (a gate may add to it, or forget from it, as what it keeps moves)."""

    def admit(self, kind: str, event: str, obj: dict[str, Any]) -> Admitted:
        """Whether the store keeps the object (told of deletions too)."""

    def relisted(self, kind: str, keys: set[str]) -> None:
        """The kind was listed again and these are the keys kept."""

    def lists_after(self, kind: str) -> str | None:
        """A kind whose first list must be in before this one lists (its admits depend on it)."""


# What the store does to each object as it comes in (it may leave out what no reader reads)
Transform = Callable[[str, dict[str, Any]], dict[str, Any]]


class Store:
    def __init__(
        self, feed: int = 200_000, gate: Gate | None = None, transform: Transform | None = None
    ) -> None:
        self.gate = gate
        self.transform = transform
        self.lock = threading.Lock()
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self.synced: set[str] = set()
        self.changed = threading.Event()
        self.relists = 0
        self.generation = 0  # bumped by every change: lets readers skip work when nothing moved
        # (generation, kind, key) of the last `feed` changes: what a reader missed since it last looked
        self.feed: deque[tuple[int, str, str]] = deque(maxlen=feed)
        if gate is not None:
            gate.attached(self)

    def _moved(self, kind: str, key: str) -> None:
        self.generation += 1
        self.feed.append((self.generation, kind, key))

    def taken(self, kind: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        """A listed object as the store keeps it, or None if it is not kept: an informer applies
        this to each page as it arrives, so that a list never holds what the store leaves out."""
        if self.transform is not None:
            obj = self.transform(kind, obj)
        if self.gate is not None and not self._admitted(kind, "ADDED", obj).keep:
            return None
        return obj

    def replace(self, kind: str, items: list[dict[str, Any]], taken: bool = False) -> None:
        """The kind's objects, as listed (`taken`: each already passed through `taken`)."""
        if not taken:
            items = [t for t in (self.taken(kind, o) for o in items) if t is not None]
        table = {object_key(o): o for o in items}
        with self.lock:
            self.objects[kind] = table
            self.synced.add(kind)
            self.relists += 1
            self._moved(kind, EVERY)
        if self.gate is not None:
            self.gate.relisted(kind, set(table))
        self.changed.set()

    def adopt(self, kind: str, objs: list[dict[str, Any]], fresh: Callable[[str], bool]) -> None:
        """Objects read outside the watch (a gate's own list): each kept unless the store already
        holds it (a watch event since is as new) or `fresh(key)` says it was deleted meanwhile.
        Checked under the store's lock, so that a deletion seen after the check removes it again."""
        if self.transform is not None:
            objs = [self.transform(kind, o) for o in objs]
        with self.lock:
            table = self.objects.setdefault(kind, {})
            for o in objs:
                key = object_key(o)
                if key not in table and fresh(key):
                    table[key] = o
                    self._moved(kind, key)
        if objs:
            self.changed.set()

    def forget(self, kind: str, which: Callable[[dict[str, Any]], bool]) -> None:
        """Drop the objects `which` picks (a gate no longer keeps them), each noted as a change."""
        with self.lock:
            table = self.objects.get(kind, {})
            gone = [k for k, o in table.items() if which(o)]
            for k in gone:
                del table[k]
                self._moved(kind, k)
        if gone:
            self.changed.set()

    def drop(self, kind: str) -> None:
        """The kind is no longer served: forget its objects."""
        with self.lock:
            self.objects.pop(kind, None)
            self.synced.discard(kind)
            self._moved(kind, EVERY)
        self.changed.set()

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        if self.transform is not None:
            obj = self.transform(kind, obj)
        key = object_key(obj)
        gate = Admitted(True)
        if self.gate is not None:  # told of deletions too (what it remembers of the object goes)
            gate = self._admitted(kind, event, obj)
        with self.lock:
            table = self.objects.setdefault(kind, {})
            if gate.keep and event != "DELETED":
                table[key] = obj
            elif table.pop(key, None) is None and self.gate is not None:
                return  # not kept before either: nothing a reader has seen moved
            self._moved(kind, key)
        self.changed.set()

    def _admitted(self, kind: str, event: str, obj: dict[str, Any]) -> Admitted:
        """The shard's gate; a change it reports beside the object is noted in the feed."""
        assert self.gate is not None
        gate = self.gate.admit(kind, event, obj)
        if gate.also is not None:
            with self.lock:
                self._moved(*gate.also)
            self.changed.set()
        return gate

    def changes(self, since: int) -> Changes | None:
        """What changed after generation `since`, by kind; None when the feed no longer reaches back
        that far (the reader fell behind: it reads everything). Costs what changed, not what is held."""
        with self.lock:
            if since == self.generation:
                return {}
            if since > self.generation or not self.feed or self.feed[0][0] > since + 1:
                return None
            out: Changes = {}
            for gen, kind, key in reversed(self.feed):
                if gen <= since:
                    break
                if key == EVERY:
                    out[kind] = None
                    continue
                keys = out.setdefault(kind, set())
                if keys is not None:
                    keys.add(key)
            return out

    def items(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.objects.get(kind, {}).values())

    def table(self, kind: str) -> dict[str, dict[str, Any]]:
        """The kind's objects by key: a copy of the table (a reader may edit it), not of the objects."""
        with self.lock:
            return self.objects.get(kind, {}).copy()

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        with self.lock:
            return self.objects.get(kind, {}).get(key)

    def is_synced(self, kinds: tuple[str, ...]) -> bool:
        with self.lock:
            return all(k in self.synced for k in kinds)


class Informer(threading.Thread):
    """One kind: keeps `store` in step with the API server until `stop` is set or the kind goes away."""

    def __init__(
        self,
        api: Api,
        kind: Kind,
        store: Store,
        stop: threading.Event,
        backoff: float = 0.5,
        on_error: Callable[[str, Exception], None] | None = None,
        watch_timeout_s: int = 300,
    ) -> None:
        super().__init__(name=f"informer-{kind.key}", daemon=True)
        self.api = api
        self.kind = kind
        self.store = store
        self.stop = stop
        self.backoff = backoff
        self.on_error = on_error
        self.watch_timeout_s = watch_timeout_s
        self.resource_version = ""
        self.gone = False  # the server stopped serving the kind

    def run(self) -> None:
        key = self.kind.key
        delay = self.backoff
        while not self.stop.is_set():
            try:
                if not self.resource_version:
                    self._wait_for_first()
                    items, rv = self.api.list(self.kind, each=partial(self.store.taken, key))
                    self.store.replace(key, items, taken=True)
                    self.resource_version = rv
                for event, obj in self.api.watch(self.kind, self.resource_version, self.watch_timeout_s):
                    # the watch works again: the next failure waits the first pause, not one
                    # doubled by every drop since the start (a pods watch under load had reached
                    # 4 s, and a relist after a 410 came after a test's 5 s wait)
                    delay = self.backoff
                    if event != "BOOKMARK":
                        self.store.apply(key, event, obj)
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                    if rv:
                        self.resource_version = rv
                    if self.stop.is_set():
                        return
                delay = self.backoff  # the server closed the stream cleanly: resume
            except Gone:
                log.info("watch of %s expired (410 Gone): listing again", key)
                self.resource_version = ""
            except NotFound:
                if self.kind.optional:
                    log.info("%s is no longer served (CRD removed?): stopped watching it", key)
                    self.gone = True
                    self.store.drop(key)
                    return
                self._failed(NotFound(404, "NotFound", f"{key} not found"), delay)
                delay = min(delay * 2, 30.0)
            except Forbidden as e:  # RBAC: say so, look again later; an optional kind never holds scheduling
                if self.kind.optional and not self.store.is_synced((key,)):
                    self.store.replace(key, [])
                self._failed(e, 30.0)
            except Exception as e:  # a dropped connection, a 5xx, a timeout: resume after a pause
                self._failed(e, delay)
                delay = min(delay * 2, 30.0)

    def _wait_for_first(self) -> None:
        """A gate that keeps this kind's objects by another kind's (a shard keeps the pods on its
        nodes) needs that kind listed first."""
        first = self.store.gate.lists_after(self.kind.key) if self.store.gate is not None else None
        while first is not None and not self.store.is_synced((first,)) and not self.stop.is_set():
            self.stop.wait(0.05)

    def _failed(self, e: Exception, delay: float) -> None:
        if self.stop.is_set():
            return  # shutting down: the connection was closed on purpose
        if self.on_error is not None:
            self.on_error(self.kind.key, e)
        log.warning(
            "watch of %s failed (%s: %s): retrying in %.1f s", self.kind.key, type(e).__name__, e, delay
        )
        self.stop.wait(delay)


class Informers(threading.Thread):
    """Starts an informer for every wanted kind the server serves, and keeps looking for the rest."""

    def __init__(
        self,
        api: Api,
        kinds: tuple[Kind, ...],
        store: Store,
        stop: threading.Event,
        rediscover_s: float = 30.0,
        backoff: float = 0.5,
        watch_timeout_s: int = 300,
    ) -> None:
        super().__init__(name="informers", daemon=True)
        self.api = api
        self.kinds = kinds
        self.store = store
        self.stop = stop
        self.rediscover_s = rediscover_s
        self.backoff = backoff
        self.watch_timeout_s = watch_timeout_s
        self.running: dict[str, Informer] = {}
        self.absent: set[str] = set()
        self.discovered = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        delay = self.backoff
        while not self.stop.is_set():
            try:
                self.discover()
                delay = self.rediscover_s
            except Exception as e:
                log.warning("API discovery failed (%s: %s): retrying in %.1f s", type(e).__name__, e, delay)
                delay = min(max(delay * 2, self.backoff), self.rediscover_s)
            self.stop.wait(delay)

    def discover(self) -> None:
        served = self.api.served(self.kinds)
        with self.lock:
            for k in self.kinds:
                inf = self.running.get(k.key)
                if inf is not None and inf.gone:
                    del self.running[k.key]
                    inf = None
                if k.superseded_by and k.superseded_by in served:
                    continue  # the newer version is watched instead
                if k.key in served or not k.optional:
                    if inf is None:
                        if k.key in self.absent:
                            log.info("%s is served now: watching it", k.key)
                        self.absent.discard(k.key)
                        inf = Informer(
                            self.api,
                            k,
                            self.store,
                            self.stop,
                            self.backoff,
                            watch_timeout_s=self.watch_timeout_s,
                        )
                        self.running[k.key] = inf
                        inf.start()
                elif k.key not in self.absent:
                    self.absent.add(k.key)
                    log.info(
                        "%s is not served by this API server (CRD not installed): skipped; "
                        "looking again every %g s",
                        k.key,
                        self.rediscover_s,
                    )
        self.discovered.set()

    def watched(self) -> tuple[str, ...]:
        with self.lock:
            return tuple(self.running)

    def synced(self) -> bool:
        """Discovery ran and every kind being watched has listed once."""
        return self.discovered.is_set() and self.store.is_synced(self.watched())

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.synced() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.synced()


__all__ = [
    "EVERY",
    "Admitted",
    "Changes",
    "Gate",
    "Informer",
    "Informers",
    "Store",
    "Transform",
    "object_key",
]
