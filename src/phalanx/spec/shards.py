"""Scheduling shards: which node pools each scheduler process owns (issue 35).

A large cluster is split by its owners into node pools (per GPU generation, per tenant); a shard is
one scheduler Deployment, with its own Lease and profile, that sees only the nodes, the pods and the
queues of its pools, as KAI-Scheduler's `SchedulingShard` and Volcano's `NodeShard` do. A pool is the
value of a pool label (`phalanx.io/node-pool`; KAI's `kai.scheduler/node-pool` is read too, so a KAI
user keeps their labels) on the Node, the Pod (or its PodGroup) and the Queue. Something that names
no pool belongs to the default shard. Pools never overlap: a pool named by two shards, or two
default shards, is refused here, so no node can have two owners.

The file (`phalanx scheduler --shards FILE --shard NAME`; the chart renders it from `shards:`):

    labels: [phalanx.io/node-pool, kai.scheduler/node-pool]   # optional; the first one present wins
    shards:
      - name: h100
        pools: [h100]
        profile: binpack     # optional: its own profile (the twin uses it; the chart passes it too)
      - name: rest
        default: true        # nodes, pods and queues that name no pool
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from phalanx.core.errors import SpecError
from phalanx.spec.common import load_yaml, validate

POOL_LABELS = ("phalanx.io/node-pool", "kai.scheduler/node-pool")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")  # room for "phalanx-scheduler-" before it


class _ShardDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    pools: list[str] = Field(default_factory=list)
    default: bool = False
    profile: str = ""


class _ShardsDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: list[str] = Field(default_factory=lambda: list(POOL_LABELS))
    shards: list[_ShardDoc]


@dataclass(frozen=True)
class Shard:
    name: str
    pools: tuple[str, ...]
    default: bool = False  # owns what names no pool
    profile: str = ""  # its own profile ("" : the one given the process)

    def said(self) -> str:
        """How reasons name the shard and what it owns."""
        owns = [*self.pools, *(["what names no pool"] if self.default else [])]
        return f"{self.name} ({', '.join(owns)})"


@dataclass(frozen=True)
class Shards:
    """Every shard of the cluster, and the labels a pool is read from."""

    shards: tuple[Shard, ...]
    labels: tuple[str, ...] = POOL_LABELS

    def get(self, name: str) -> Shard:
        for s in self.shards:
            if s.name == name:
                return s
        have = ", ".join(s.name for s in self.shards)
        raise SpecError("--shard", f"no shard named {name!r} in the shards file (it has: {have})")

    def pool_of(self, labels: Mapping[str, str] | None) -> str:
        """The pool an object names ("" for none): the first pool label it carries."""
        if labels:
            for key in self.labels:
                value = labels.get(key)
                if value:
                    return str(value)
        return ""

    def owner(self, pool: str) -> Shard | None:
        """The shard that owns `pool` ("" : the default shard); None if no shard does."""
        for s in self.shards:
            if (pool in s.pools) if pool else s.default:
                return s
        return None

    def said(self) -> str:
        return "; ".join(s.said() for s in self.shards)


@dataclass(frozen=True)
class ShardOf:
    """This process's shard among all of them."""

    shards: Shards
    me: Shard

    def owns(self, labels: Mapping[str, str] | None) -> bool:
        pool = self.shards.pool_of(labels)
        return pool in self.me.pools if pool else self.me.default

    def unowned(self, labels: Mapping[str, str] | None) -> str:
        """Why a pod of ours is this (default) shard's to explain: it names a pool no shard owns ("")."""
        pool = self.shards.pool_of(labels)
        if not pool or not self.me.default or self.shards.owner(pool) is not None:
            return ""
        return f"it names pool {pool!r}, which no scheduling shard owns (shards: {self.shards.said()})"

    def elsewhere(self, labels: Mapping[str, str] | None) -> str:
        """The shard that owns what these labels name, said ("" when it is this one)."""
        pool = self.shards.pool_of(labels)
        owner = self.shards.owner(pool)
        if owner is self.me:
            return ""
        where = f"pool {pool!r}" if pool else "no pool"
        return f"{where} ({f'shard {owner.name}' if owner else 'no shard'})"


def parse_shards(doc: object, where: str) -> Shards:
    """The shards file as read; every mistake named with where it is."""
    d = validate(_ShardsDoc, doc, where)
    if not d.shards:
        raise SpecError(f"{where}: shards", "lists no shard")
    if not d.labels or any(not k for k in d.labels):
        raise SpecError(f"{where}: labels", "needs at least one non-empty label key")
    seen: dict[str, str] = {}  # pool -> the shard that has it
    names: set[str] = set()
    defaults: list[str] = []
    for i, s in enumerate(d.shards):
        at = f"{where}: shards[{i}]"
        if not _NAME.match(s.name):
            raise SpecError(f"{at}.name", f"{s.name!r} is not a DNS label of at most 40 characters")
        if s.name in names:
            raise SpecError(f"{at}.name", f"{s.name!r} is named twice")
        names.add(s.name)
        if not s.pools and not s.default:
            raise SpecError(at, f"shard {s.name!r} owns nothing: give it pools, or default: true")
        for pool in s.pools:
            if not pool:
                raise SpecError(f"{at}.pools", "an empty pool name")
            if pool in seen:
                raise SpecError(
                    f"{at}.pools",
                    f"pool {pool!r} is in shards {seen[pool]!r} and {s.name!r}: a node has one owner",
                )
            seen[pool] = s.name
        if s.default:
            defaults.append(s.name)
    if len(defaults) > 1:
        raise SpecError(where, f"shards {defaults[0]!r} and {defaults[1]!r} are both default: one at most")
    shards = tuple(Shard(s.name, tuple(s.pools), s.default, s.profile) for s in d.shards)
    return Shards(shards, tuple(d.labels))


def load_shards(path: Path) -> Shards:
    return parse_shards(load_yaml(path), str(path))


__all__ = ["POOL_LABELS", "Shard", "ShardOf", "Shards", "load_shards", "parse_shards"]
