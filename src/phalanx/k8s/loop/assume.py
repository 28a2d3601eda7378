"""What the scheduler did that the watch may not show yet (kube-scheduler's "assume").

A bind or an eviction takes effect on the API at once, but the watch reports it a little later;
until then the next cycle must see the pod where we put it (bound, with its devices) or on its
way out (terminating: it holds its devices until it is gone), or it would be placed twice or its
devices given away. So must a gang's plan written for a later bind (a share waiting for its
reservation pod): a cycle that does not see it places the gang again, maybe elsewhere, and
another share beside nothing. An assumption ends when the watch catches up, or after `ttl` seconds.
"""

from __future__ import annotations

import copy
from collections.abc import Container
from datetime import UTC, datetime
from typing import Any

from phalanx.core.decisions import Bind
from phalanx.k8s.client.cache import object_key
from phalanx.k8s.keys import GANG_PLAN
from phalanx.k8s.read.devices import encode
from phalanx.k8s.read.translations import ASSUMED

DEFAULT_GRACE_S = 30  # the API server's default terminationGracePeriodSeconds


def grace_end(pod: dict[str, Any], evicted_at: float) -> str:
    """The deletionTimestamp the API server writes for an eviction at `evicted_at`: that time plus
    the pod's grace period, in whole seconds as the API serializes it."""
    grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    seconds = grace if isinstance(grace, int) and grace >= 0 else DEFAULT_GRACE_S
    end = datetime.fromtimestamp(int(evicted_at) + seconds, tz=UTC)
    return end.strftime("%Y-%m-%dT%H:%M:%SZ")


class Assumptions:
    def __init__(self, ttl: float = 60.0) -> None:
        self.assumed: dict[str, tuple[Bind, float]] = {}  # task -> (bind, when)
        self.gone: dict[str, float] = {}  # evicted pods, until the watch shows them terminating or gone
        # gangs' plans written on their holder pod: holder -> (workload, plan, resourceVersion before, when)
        self.plans: dict[str, tuple[str, str, str, float]] = {}
        self.ttl = ttl
        self.overlay: dict[str, dict[str, Any]] = {}  # the last `apply`'s edited copies, by key

    def bound(self, task: str, b: Bind, now: float) -> None:
        self.assumed[task] = (b, now)

    def evicted(self, task: str, now: float) -> None:
        self.gone[task] = now

    def planned(self, holder: str, workload: str, plan: str, before: str, now: float) -> None:
        """`plan` was written on pod `holder` (`keys.GANG_PLAN`), whose resourceVersion was `before`."""
        self.plans[holder] = (workload, plan, before, now)

    def unplanned(self, workloads: Container[str]) -> None:
        """These gangs' plans were cleared (undone): no longer assumed."""
        for holder in [h for h, (w, *_) in self.plans.items() if w in workloads]:
            del self.plans[holder]

    def stamp(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """Which pods are assumed: part of what a cycle's inputs are a version of."""
        return tuple(sorted(self.assumed)), tuple(sorted(self.gone)), tuple(sorted(self.plans))

    def __bool__(self) -> bool:
        return bool(self.assumed or self.gone or self.plans)

    def apply(
        self, pods: list[dict[str, Any]], now: float, keys: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """The store's pods with our recent binds and evictions applied (the watch lags behind);
        `keys`: the pods' keys, as the store files them (else worked out here). The edited copies
        are also kept in `overlay`, by key. Nothing assumed: the store's pods as they are, at once."""
        if not self:
            self.overlay = {}
            return pods
        keys = keys if keys is not None else [object_key(p) for p in pods]
        table = dict(zip(keys, pods, strict=True))
        self.apply_table(table, now)
        return list(table.values())

    def apply_table(self, table: dict[str, dict[str, Any]], now: float) -> None:
        """`apply` on the pods by key (a copy of the watch cache's table, edited in place): only the
        assumed pods are looked at."""
        self.overlay = {}
        for key in list(self.plans):
            p = table.get(key)
            _, plan, before, when = self.plans[key]
            meta = (p or {}).get("metadata") or {}
            if p is None or meta.get("resourceVersion") != before or now - when >= self.ttl:
                del self.plans[key]  # gone, or the watch shows our write (or a later one)
                continue
            p = copy.deepcopy(p)
            p[ASSUMED] = True
            p.setdefault("metadata", {}).setdefault("annotations", {})[GANG_PLAN] = plan
            table[key] = self.overlay[key] = p
        for key in list(self.gone):
            p = table.get(key)
            if p is None:
                del self.gone[key]  # gone from the store too
            elif now - self.gone[key] >= self.ttl:
                del self.gone[key]
            elif not (p.get("metadata") or {}).get("deletionTimestamp"):
                # evicted, the watch does not show it yet: it still holds its devices until it is
                # gone (a graceful deletion waits for the kubelet), so it counts as terminating,
                # until the end the API server gives it (without this, the pods of one eviction
                # the watch has and has not shown yet read as ending at different times)
                p = copy.deepcopy(p)
                p[ASSUMED] = True
                p.setdefault("metadata", {})["deletionTimestamp"] = grace_end(p, self.gone[key])
                table[key] = self.overlay[key] = p
        for key in list(self.assumed):
            p = table.get(key)
            hit = self.assumed[key]
            if p is None or (p.get("spec") or {}).get("nodeName") or now - hit[1] >= self.ttl:
                del self.assumed[key]  # the watch caught up (or never will), or the pod is gone
                continue
            b = hit[0]
            p = copy.deepcopy(p)
            p[ASSUMED] = True
            p.setdefault("spec", {})["nodeName"] = b.node
            notes = p.setdefault("metadata", {}).setdefault("annotations", {})
            notes.update({k: v for k, v in encode(b).items() if v is not None})
            table[key] = self.overlay[key] = p
