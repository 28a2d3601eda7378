"""What one scheduling shard reads: its pools' nodes, pods and queues (issue 35; `phalanx.spec.shards`).

The watch cache keeps only what the shard may need (`ShardFilter.admit`, called by the store for
every event): the nodes of its pools, the pods waiting for it, every bound pod (a pod of another
shard or scheduler holds capacity on the node it runs on; one on a node of another pool is kept
quietly, waking no cycle, and the read skips it, so that a node joining the shard is read with
what runs there), and every Queue (the read keeps the shard's and says where a tree is split). So
a shard's cycles and what its read builds follow its share of the cluster (its cache still holds
every bound pod), and no node has two owners.

What cannot be placed by one shard is said, never half placed: a gang whose pods name pools of two
shards (each shard sees only its part: the filter remembers the pods it turned away, by gang), a
queue tree split across shards, and, by the default shard, a pod naming a pool no shard owns.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from phalanx.k8s import keys
from phalanx.k8s.client.cache import Admitted, object_key
from phalanx.k8s.client.kinds import NODES, PODS
from phalanx.k8s.read.contain import mapping
from phalanx.k8s.read.queues import queue_spec
from phalanx.spec.shards import ShardOf

# the change feed's kind for gangs whose pods another shard was given (the read then reads everything)
ELSEWHERE = "phalanx/gangs-elsewhere"


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
    turned_away: dict[str, tuple[str, str]] = field(default_factory=dict)  # pod -> (gang, what it names)
    nodes: set[str] = field(default_factory=set)  # the shard's nodes, as the cache last saw them

    def admit(self, kind: str, event: str, obj: dict[str, Any]) -> Admitted:
        """Whether the store keeps the object; a change to note beside it (a gang whose pods another
        shard was given changed: the next read reads everything); and whether no cycle of this
        shard depends on it (a pod running on another shard's node: kept, so that a full read after
        that node joins this shard sees it, but it wakes no cycle here)."""
        if kind == NODES.key:
            name = str(mapping(obj.get("metadata")).get("name", ""))
            keep = event != "DELETED" and self.shard.owns(_labels(obj))
            with self.lock:
                (self.nodes.add if keep else self.nodes.discard)(name)
            return Admitted(keep)
        if kind != PODS.key:
            return Admitted(True)
        key = object_key(obj)
        spec = mapping(obj.get("spec"))
        node = spec.get("nodeName")
        if node:
            with self.lock:
                quiet = node not in self.nodes
            return self._noted(Admitted(True, quiet=quiet), self._forget(key))
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


__all__ = ["ELSEWHERE", "ShardFilter", "shard_queues"]
