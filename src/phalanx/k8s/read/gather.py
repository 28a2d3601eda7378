"""What one cycle reads, gathered from a store of API objects by kind key.

The live scheduler reads its watch cache, a replay reads a capture file (`phalanx.k8s.trial.capture`):
both gather here and build the world with the same `build_world`, so a capture of a cluster
replays to the snapshot the scheduler would have built from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phalanx.k8s.client.cache import object_key
from phalanx.k8s.client.kinds import (
    DATASETS,
    DEVICE_CLASSES,
    JOBS,
    POD_GROUPS,
    QUEUES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.carry import Carry
from phalanx.k8s.read.claims import DraObjects
from phalanx.k8s.read.contain import mapping
from phalanx.k8s.read.kueue import Kueue
from phalanx.k8s.read.kueue import load as load_kueue
from phalanx.k8s.read.patch import Feed, patch, remember
from phalanx.k8s.read.translations import Translations
from phalanx.k8s.read.world import World, build_world

Items = Callable[[str], list[dict[str, Any]]]


@dataclass
class Gathered:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    queues: list[dict[str, Any]]
    dra: DraObjects
    kueue: Kueue | None
    jobs: dict[str, dict[str, Any]] | None  # None: Jobs not listed (not served, not readable, not yet)
    split: dict[str, list[str]] | None = None  # a shard's gangs with pods another shard was given
    datasets: list[dict[str, Any]] | None = None  # Phalanx's Datasets (the distributed cache's placement)

    def world(
        self,
        cfg: AdapterConfig,
        now: float,
        memo: Translations | None = None,
        carry: Carry | None = None,
        stamp: object = None,
        feed: Feed | None = None,
    ) -> World:
        """The cycle's world: with `feed` (what changed since the kept world was read), the kept world
        patched where it can be (`phalanx.k8s.read.patch`), else built and indexed for the next patch."""
        memo = memo or Translations()
        if carry is not None and feed is not None and feed.changes is not None and self._patchable(feed):
            patched = patch(
                carry,
                feed.changes,
                feed.pod,
                feed.node,
                cfg,
                now,
                memo,
                get=feed.get,
                kueue=self.kueue,
                jobs=self.jobs,
                stamp=stamp,
                split=self.split,
            )
            if patched is not None:
                return patched
        last = carry.world if carry is not None else None
        w = build_world(
            self.nodes,
            self.pods,
            self.groups,
            self.queues,
            cfg,
            now,
            memo,
            dra=self.dra,
            kueue=self.kueue,
            jobs=self.jobs,
            carry=carry,
            stamp=stamp,
            split=self.split,
            datasets=self.datasets,
        )
        if carry is not None and feed is not None and (w is not last or carry.index is None):
            remember(carry, w, self.nodes, self.pods, self.groups, cfg, memo)
        return w

    def _patchable(self, feed: Feed) -> bool:
        """A kept world is patched only while no distributed Dataset changed or failed: the patch
        reads no Datasets (their bytes per node and failures come with a full read)."""
        dist = [
            d for d in self.datasets or () if mapping(mapping(d).get("spec")).get("cache") == "distributed"
        ]
        if not dist:
            return True
        changes = feed.changes or {}
        if DATASETS.key in changes and changes[DATASETS.key] != set():
            return False
        return not any(
            mapping(mapping(mapping(d).get("status")).get("distributed")).get("state") == "failed"
            for d in dist
        )


def gather(
    items: Items,
    jobs_listed: bool,
    cfg: AdapterConfig,
    pods: list[dict[str, Any]] | None = None,
    split: dict[str, list[str]] | None = None,
) -> Gathered:
    """The objects of every kind a cycle reads; `pods`, if given, replaces the store's (the scheduler
    passes its pods with the binds it assumes); `split`: a shard's gangs with pods elsewhere."""
    kq, _ = load_kueue(items, cfg.kueue)
    return Gathered(
        items("nodes"),
        items("pods") if pods is None else pods,
        [o for k in POD_GROUPS for o in items(k.key)],
        [o for k in QUEUES for o in items(k.key)],
        DraObjects(items(DEVICE_CLASSES.key), items(RESOURCE_SLICES.key), items(RESOURCE_CLAIMS.key)),
        kq,
        {object_key(j): j for j in items(JOBS.key)} if jobs_listed else None,
        split,
        items(DATASETS.key),
    )
