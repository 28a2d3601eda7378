"""What one scheduling shard reads: its pools' nodes, pods and queues (issue 35; `phalanx.spec.shards`).

The watch cache keeps only what the shard may need (`ShardFilter.admit`, called by the store for
every event): the nodes of its pools, the pods waiting for it, every pod bound to one of its nodes
(a pod of another shard or scheduler holds capacity there), and every Queue (the read keeps the
shard's and says where a tree is split). So a shard's cycles, its read and its memory follow its
share of the cluster, and no node has two owners.

A node that joins the shard (relabelled, or new) is kept only once the pods already on it are in
the cache: listed from the API server by `spec.nodeName` before the store takes the node (pods
deleted while that list was in flight are not put back). A node that leaves takes its pods out of
the cache. At start the pods are listed after the nodes, so that the gate knows which to keep.

What cannot be placed by one shard is said, never half placed: a gang whose pods name pools of two
shards (each shard sees only its part: the filter remembers the pods it turned away, by gang), a
queue tree split across shards, and, by the default shard, a pod naming a pool no shard owns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phalanx.k8s import keys
from phalanx.k8s.client.api import Api
from phalanx.k8s.client.cache import Admitted, Store, object_key
from phalanx.k8s.client.kinds import NODES, PODS
from phalanx.k8s.read.contain import mapping
from phalanx.k8s.read.queues import queue_spec
from phalanx.spec.shards import ShardOf

log = logging.getLogger("phalanx.k8s")

# the change feed's kind for gangs whose pods another shard was given (the read then reads everything)
ELSEWHERE = "phalanx/gangs-elsewhere"

# The pods bound to one node, as the API server has them now (a node joining the shard)
PodsOn = Callable[[str], list[dict[str, Any]]]


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return mapping(mapping(obj.get("metadata")).get("labels"))


def _gang(obj: dict[str, Any]) -> str:
    """The named gang a pod joins (`namespace/name`), or ""."""
    labels = _labels(obj)
    notes = mapping(mapping(obj.get("metadata")).get("annotations"))
    for k in keys.GROUP_KEYS:
        name = labels.get(k) or notes.get(k)
        if name:
            ns = mapping(obj.get("metadata")).get("namespace", "default")
            return f"{ns}/{name}"
    return ""


@dataclass
class ShardFilter:
    """The store's gate: which objects a shard keeps, and the gangs it saw pods of go elsewhere."""

    shard: ShardOf
    scheduler_name: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    # the pods on a node, read from the API server (None: a cache fed by lists alone, as `status`'s)
    pods_on: PodsOn | None = None
    turned_away: dict[str, tuple[str, str]] = field(default_factory=dict)  # pod -> (gang, what it names)
    nodes: set[str] = field(default_factory=set)  # the shard's nodes, as the cache last saw them
    # nodes joining while their pods are listed: the pods deleted meanwhile (not to be put back)
    joining: dict[str, set[str]] = field(default_factory=dict)
    store: Store | None = None

    def attached(self, store: Store) -> None:
        self.store = store

    def lists_after(self, kind: str) -> str | None:
        return NODES.key if kind == PODS.key else None

    def relisted(self, kind: str, keys: set[str]) -> None:
        """Nodes listed again: those no longer there (or no longer the shard's) leave it."""
        if kind != NODES.key:
            return
        with self.lock:
            gone = self.nodes - keys
            self.nodes -= gone
        self._left(gone)

    def admit(self, kind: str, event: str, obj: dict[str, Any]) -> Admitted:
        """Whether the store keeps the object, and a change to note beside it (a gang whose pods
        another shard was given changed: the next read reads everything)."""
        if kind == NODES.key:
            return self._node(event, obj)
        if kind != PODS.key:
            return Admitted(True)
        key = object_key(obj)
        spec = mapping(obj.get("spec"))
        node = spec.get("nodeName")
        if node:
            with self.lock:
                keep = node in self.nodes
                if event == "DELETED" and node in self.joining:
                    self.joining[node].add(key)
            return self._noted(Admitted(keep), self._forget(key))
        if spec.get("schedulerName") != self.scheduler_name:
            return self._noted(Admitted(False), self._forget(key))  # another scheduler's, waiting
        labels = _labels(obj)
        if event == "DELETED" or self.shard.owns(labels) or self.shard.unowned(labels):
            return self._noted(Admitted(event != "DELETED"), self._forget(key))
        gang = _gang(obj)
        if not gang:
            return self._noted(Admitted(False), self._forget(key))
        with self.lock:
            was = self.turned_away.get(key)
            self.turned_away[key] = (gang, self.shard.elsewhere(labels))
        return self._noted(Admitted(False), gang if was is None or was[0] != gang else "")

    def _node(self, event: str, obj: dict[str, Any]) -> Admitted:
        name = str(mapping(obj.get("metadata")).get("name", ""))
        keep = event != "DELETED" and self.shard.owns(_labels(obj))
        with self.lock:
            was = name in self.nodes
            (self.nodes.add if keep else self.nodes.discard)(name)
        if keep and not was and not self._joined(name):
            with self.lock:
                self.nodes.discard(name)
            return Admitted(False)  # looked at again on its next change
        if was and not keep:
            self._left({name})
        return Admitted(keep)

    def _joined(self, name: str) -> bool:
        """The pods already on a node that joins are put in the cache before the node is. Before the
        pods' first list there is nothing to read (that list brings them)."""
        store = self.store
        if store is None or self.pods_on is None or not store.is_synced((PODS.key,)):
            return True
        with self.lock:
            self.joining[name] = set()
        try:
            pods = self.pods_on(name)
        except Exception as e:  # the API server did not answer: the node waits for its next change
            log.warning(
                "node %s joins shard %s, but its pods could not be read (%s: %s): not used yet",
                name,
                self.shard.me.name,
                type(e).__name__,
                e,
            )
            with self.lock:
                del self.joining[name]
            return False

        def fresh(key: str) -> bool:
            with self.lock:
                return key not in self.joining[name]

        store.adopt(PODS.key, pods, fresh)
        with self.lock:
            del self.joining[name]
        return True

    def _left(self, gone: set[str]) -> None:
        """The pods on nodes that left the shard are dropped from the cache."""
        if gone and self.store is not None:
            self.store.forget(PODS.key, lambda o: mapping(o.get("spec")).get("nodeName") in gone)

    @staticmethod
    def _noted(gate: Admitted, gang: str) -> Admitted:
        return gate._replace(also=(ELSEWHERE, gang)) if gang else gate

    def _forget(self, key: str) -> str:
        with self.lock:
            was = self.turned_away.pop(key, None)
        return was[0] if was is not None else ""

    def split(self) -> dict[str, list[str]]:
        """Gangs some of whose waiting pods this shard turned away: gang -> what those name."""
        out: dict[str, set[str]] = {}
        with self.lock:
            for gang, where in self.turned_away.values():
                out.setdefault(gang, set()).add(where)
        return {g: sorted(w) for g, w in out.items()}


def shard_queues(queues: list[dict[str, Any]], shard: ShardOf) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The shard's queues, and why each other queue is not its own (for workloads that name one);
    a queue of the shard whose parent belongs to another shard is refused, naming both."""
    mine: list[dict[str, Any]] = []
    problems: dict[str, str] = {}
    owner: dict[str, str] = {}
    for q in queues:
        name = str(mapping(q.get("metadata")).get("name", ""))
        where = shard.elsewhere(_labels(q))
        if where:
            owner[name] = where
            problems[name] = f"queue {name!r} belongs to {where}, not to shard {shard.me.said()}"
        else:
            mine.append(q)
    out = []
    for q in mine:
        name = str(mapping(q.get("metadata")).get("name", ""))
        try:
            parent = str(queue_spec(q).get("parent") or "")
        except Exception:  # the tree's own read names what is wrong with it
            parent = ""
        if parent in owner:
            problems[name] = (
                f"queue {name!r} is in shard {shard.me.name} but its parent {parent!r} belongs to "
                f"{owner[parent]}: a queue tree is scheduled by one shard"
            )
        else:
            out.append(q)
    return out, problems


def pods_on_node(api: Api) -> PodsOn:
    """Lists the pods bound to one node (a field selector the API server serves from its cache)."""

    def read(node: str) -> list[dict[str, Any]]:
        items, _ = api.list(PODS, field_selector=f"spec.nodeName={node}")
        return items

    return read


__all__ = ["ELSEWHERE", "PodsOn", "ShardFilter", "pods_on_node", "shard_queues"]
