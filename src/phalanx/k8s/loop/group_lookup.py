"""A gang's PodGroup read directly when its pods came before it on the watches.

Pods and PodGroups come on separate watches, so a cycle can see a gang's pods before the
PodGroup that was made first: read without it, the pods present would be the gang (a gang of
one, placed alone or evicting for one). So when a cycle's world has a group that its pods name
(our label, KAI's, Volcano's or scheduler-plugins' key) but no PodGroup object, the PodGroup is
asked for directly, once per group, in every PodGroup kind the scheduler watches; one found is put
in the watch cache as its watch would have put it, and the cycle reads again. One not found is a
group of the pods present, as before (its PodGroup, if made later, comes on its watch).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from phalanx.k8s.client.api import Api, ApiError
from phalanx.k8s.client.cache import Store
from phalanx.k8s.client.kinds import BY_KEY, PODS
from phalanx.k8s.keys import POD_GROUP_KINDS
from phalanx.k8s.read.groups import group_id
from phalanx.k8s.read.world import World

log = logging.getLogger("phalanx.k8s")
KINDS = tuple(f"{g}/{v}/{p}" for g, v, p in POD_GROUP_KINDS)
FORGET_S = 600.0  # a group looked up this long ago may be looked up again (its pods remade)
AT_MOST = 32  # lookups a cycle: a burst of label-only groups is spread over cycles


class GroupLookup:
    """Which groups were looked up, and the lookups themselves. Only the pods that changed since the
    last look are looked at (the watch cache's feed), so a cycle's cost follows what changed."""

    def __init__(self, api: Api, store: Store, watched: Callable[[], tuple[str, ...]]) -> None:
        self.api = api
        self.store = store
        self.watched = watched  # the kind keys being watched (`Informers.watched`)
        self.done: dict[tuple[str, str], float] = {}
        self.found = 0
        self.since: int | None = None  # the cache's generation at the last look (None: look at all)
        # groups found missing past a cycle's AT_MOST: their pods are not in the next feed, so they
        # are kept here for the next look (else they were never looked up unless their pods changed)
        self.later: list[tuple[str, str]] = []

    def _changed_pods(self) -> list[dict[str, Any]]:
        """The pods that changed since the last look (all of them the first time, or when the feed
        no longer reaches back that far)."""
        now = self.store.generation  # first: a change while this reads is seen again next time
        changes = self.store.changes(self.since) if self.since is not None else None
        self.since = now
        if changes is None:
            return self.store.items(PODS.key)
        keys_ = changes.get(PODS.key, set())
        if keys_ is None:
            return self.store.items(PODS.key)
        return [o for k in sorted(keys_) if (o := self.store.get(PODS.key, k)) is not None]

    def missing(self, world: World) -> list[tuple[str, str]]:
        """(namespace, name) of the groups whose changed pods name a PodGroup the cache does not hold,
        after those left over from the last look that still lack it."""
        out: dict[tuple[str, str], None] = {}
        for ns, name in self.later:
            g = world.groups.get(f"{ns}/{name}")
            if g is not None and g.pod_group is None and (ns, name) not in self.done:
                out[(ns, name)] = None
        for obj in self._changed_pods():
            meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
            if (spec.get("schedulingGroup") or {}).get("podGroupName"):
                continue  # Kubernetes' own PodGroups: their pods wait for them (read.groups)
            ns = str(meta.get("namespace") or "default")
            gid = group_id(ns, meta.get("labels") or {}, meta.get("annotations") or {})
            g = world.groups.get(gid) if gid else None
            if g is None or g.pod_group is not None:
                continue
            key = (ns, gid.partition("/")[2])
            if key not in self.done:
                out[key] = None
        return list(out)

    def look(self, world: World) -> bool:
        """Look the missing PodGroups up; True when one was found (the cycle reads again)."""
        todo = self.missing(world)
        self.later = todo[AT_MOST:]
        if not todo:
            return False
        now = time.monotonic()
        if len(self.done) > 4096:
            self.done = {k: t for k, t in self.done.items() if now - t < FORGET_S}
        watched = set(self.watched())
        kinds = [BY_KEY[k] for k in KINDS if k in watched]
        found = False
        for ns, name in todo[:AT_MOST]:
            self.done[(ns, name)] = now
            for kind in kinds:
                try:
                    obj = self.api.get(kind, name, ns)
                except ApiError as e:  # a lookup is a best effort: the watch still brings it
                    log.info("could not look up %s %s/%s: %s", kind.key, ns, name, e)
                    continue
                if obj is not None:
                    log.info(
                        "PodGroup %s/%s (%s) came after its pods on the watches: read directly",
                        ns,
                        name,
                        kind.key,
                    )
                    self.store.apply(kind.key, "ADDED", obj)
                    self.found += 1
                    found = True
        return found
