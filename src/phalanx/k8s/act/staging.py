"""Staging ahead: ask the node caches for a waiting gang's dataset on the nodes it is about to get.

After each cycle the start forecast (`phalanx.k8s.decide.insight`) says where each waiting workload
would start and when. For a workload that names a dataset and should start within the horizon,
the scheduler writes a request on each of those nodes, `phalanx.io/stage-datasets`
(`{"ns/name": "<workload>"}`), which the node's cache agent (`phalanx cache`) stages before the
gang is bound. A request stays while it is wanted and for `ttl` seconds after (a forecast cut
short by its budget does not drop it); the Node annotation is the only channel, so the request
is visible (`kubectl get node -o yaml`), survives a restart of either side, and needs no port.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any

from phalanx.core.snapshot import Snapshot
from phalanx.k8s import keys
from phalanx.k8s.client.api import Api
from phalanx.k8s.client.kinds import NODES
from phalanx.k8s.decide.insight import Insight

log = logging.getLogger("phalanx.staging")


class StageRequests:
    def __init__(self, api: Api, ttl: float, horizon: float | None = None) -> None:
        self.api = api
        self.ttl = ttl
        self.horizon = ttl if horizon is None else horizon
        self.wanted: dict[tuple[str, str], tuple[str, float]] = {}  # (node, dataset) -> (workload, when)
        # nodes that may carry a request: ours, and any found when every node was last looked at
        # (at the first update and every `ttl` seconds: an earlier or another leader's requests)
        self.marked: set[str] = set()
        self.scanned: float | None = None
        # when the next forecast start comes within the horizon (the scheduler's loop wakes then)
        self.due = math.inf

    def plan(self, snap: Snapshot, ahead: Insight, now: float) -> dict[str, dict[str, str]]:
        """Node -> {dataset: workload} that should be requested now."""
        self.due = math.inf
        for workload, nodes in ahead.nodes.items():
            entry = snap.workloads.get(workload)
            start = ahead.starts.get(workload)
            if entry is None or start is None:
                continue
            if start - now > self.horizon:
                if any(ps.request.dataset for ps in entry.workload.podsets):
                    self.due = min(self.due, start - self.horizon)
                continue
            datasets = {ps.request.dataset for ps in entry.workload.podsets if ps.request.dataset}
            for ds in sorted(datasets):
                frac = snap.dataset_fraction(ds)
                for i in nodes:
                    if frac[i] < 1.0:
                        self.wanted[(snap.nodes[i].name, ds)] = (workload, now)
        for k, (_, when) in list(self.wanted.items()):
            if now - when > self.ttl:
                del self.wanted[k]
        out: dict[str, dict[str, str]] = {}
        for (node, ds), (workload, _) in sorted(self.wanted.items()):
            out.setdefault(node, {})[ds] = workload
        return out

    def update(
        self,
        snap: Snapshot,
        ahead: Insight,
        nodes: Callable[[], list[dict[str, Any]]],
        node: Callable[[str], dict[str, Any] | None],
        now: float,
    ) -> None:
        """Write the requests that changed; clear those no longer wanted. `nodes`: every Node (read
        now and then, for requests another leader left); `node`: one by name. Otherwise only nodes
        wanted now or that carried a request are looked at."""
        want = self.plan(snap, ahead, now)
        if self.scanned is None or now - self.scanned >= self.ttl:
            self.scanned = now
            self.marked |= {_name(o) for o in nodes() if keys.STAGE_DATASETS in _notes(o)}
        for name in sorted(self.marked | set(want)):
            obj = node(name)
            if obj is None:
                self.marked.discard(name)
                continue
            have = _notes(obj).get(keys.STAGE_DATASETS)
            text = json.dumps(want[name], sort_keys=True, separators=(",", ":")) if name in want else None
            if text is None and have is None:
                self.marked.discard(name)
            if have == text or (have is None and text is None):
                continue
            try:
                self.api.patch(NODES, name, None, {"metadata": {"annotations": {keys.STAGE_DATASETS: text}}})
                if text:
                    log.info("node %s: stage ahead %s", name, text)
                    self.marked.add(name)
            except Exception as e:  # a request is an optimisation: the next cycle tries again
                log.warning("node %s: staging request not written: %s", name, e)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _notes(obj: dict[str, Any]) -> dict[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}
