"""`phalanx scheduler --shadow`: decide beside another scheduler, bind and evict nothing, compare.

The pods of `cfg.scheduler_name` (the other scheduler's: `default-scheduler`, KAI's, Volcano's)
are taken as Phalanx's. Each pod seen waiting is judged once, when its scheduler places it: the
cycle runs on the cluster as it was before that placement (the pods placed since the last
cycle put back to waiting, everything else as it is) and Phalanx's decision for the pod is set
against the real one. Agreements and disagreements are counted by reason
(`phalanx_shadow_decisions_total{verdict,reason}`), shown in the dashboard's recent decisions,
and summed up in its state (`shadow`), which `phalanx status --shadow` prints.

Only reads: the watch (list, watch, discovery). No Lease (one shadow replica is enough and it
writes nothing), no Events, no status, no attained-service ConfigMap, no binds, no evictions.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge

from phalanx.core.decisions import CycleResult
from phalanx.core.profile import Profile
from phalanx.k8s.act.explain import describe
from phalanx.k8s.client.api import Api
from phalanx.k8s.client.cache import Informers, Store, object_key
from phalanx.k8s.client.kinds import JOBS, WATCHED
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.decide.cycle import decide
from phalanx.k8s.read.gather import gather
from phalanx.k8s.read.translations import Translations
from phalanx.k8s.read.unread import unread_left_out
from phalanx.k8s.read.world import World
from phalanx.k8s.view.board import Board, Visible, _shown
from phalanx.k8s.view.server import Metrics

log = logging.getLogger("phalanx.k8s")
AGREE, DISAGREE = "agree", "disagree"
SAME_NODE = "same node"
FULLER = "would have packed onto a fuller node"
EMPTIER = "would have spread onto an emptier node"
OTHER = "would have chosen another node as full"
WHOLE_GANG = "would have waited for the whole gang"


def _node(obj: dict[str, Any]) -> str:
    return str((obj.get("spec") or {}).get("nodeName") or "")


class ShadowStore(Store):
    """The watch cache, remembering which pods of the watched scheduler it saw waiting."""

    def __init__(self, scheduler_name: str) -> None:
        super().__init__(transform=unread_left_out)
        self.scheduler_name = scheduler_name
        self.seen_waiting: set[str] = set()  # pod uids

    def _note(self, obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        if spec.get("schedulerName", "default-scheduler") == self.scheduler_name and not _node(obj):
            with self.lock:
                self.seen_waiting.add(str((obj.get("metadata") or {}).get("uid") or object_key(obj)))

    def replace(self, kind: str, items: list[dict[str, Any]], taken: bool = False) -> None:
        if kind == "pods":
            for o in items:
                self._note(o)
        super().replace(kind, items, taken)

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        if kind == "pods" and event != "DELETED":
            self._note(obj)
        super().apply(kind, event, obj)


@dataclass(frozen=True)
class Verdict:
    pod: str
    workload: str
    real: str  # the node its scheduler chose
    ours: str  # the node Phalanx would have chosen ("" if it would have waited)
    verdict: str
    reason: str
    why: str = ""  # Phalanx's pending reason, when it would have waited


class Shadow:
    def __init__(
        self,
        api: Api,
        cfg: AdapterConfig,
        profile: Profile,
        clock: Callable[[], float] = time.time,
        seed: int = 0,
    ) -> None:
        self.api, self.cfg, self.profile, self.clock = api, cfg, profile, clock
        self.store = ShadowStore(cfg.scheduler_name)
        self.stop_event = threading.Event()
        self.informers = Informers(api, WATCHED, self.store, self.stop_event, cfg.rediscover_seconds)
        self.translations = Translations()
        self.rng = np.random.default_rng(seed)
        self.metrics = Metrics()
        self.decisions = Counter(
            "phalanx_shadow_decisions_total",
            "Placements of the watched scheduler, judged against what Phalanx would have done",
            ["verdict", "reason"],
            registry=self.metrics.registry,
        )
        self.would_place = Gauge(
            "phalanx_shadow_would_place_pods",
            "Pods the watched scheduler leaves waiting that Phalanx would place now",
            registry=self.metrics.registry,
        )
        self.board = ShadowBoard(mode="shadow", pool_label=cfg.pool_label)
        self.judged: set[str] = set()  # pod uids
        self.tally: dict[tuple[str, str], int] = {}
        self.verdicts: deque[Verdict] = deque(maxlen=500)
        self.partial: dict[str, str] = {}  # gangs the watched scheduler placed short of their minimum
        self.placeable: list[str] = []  # pods it leaves waiting that Phalanx would place now
        self.cycles = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.informers.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.store.changed.set()

    def close(self) -> None:
        self.stop()
        self.api.close_watches()  # shut down, not closed under the informers

    def ready(self) -> bool:
        return self.informers.synced()

    def wait_synced(self, timeout: float = 10.0) -> bool:
        return self.informers.wait_synced(timeout)

    def run(self) -> None:
        seen = -1  # the store's generation at the last cycle: a quiet cluster is not cycled
        while not self.stop_event.is_set():
            if self.ready() and self.store.generation != seen:
                seen = self.store.generation
                try:
                    self.step()
                except Exception:  # a bad cycle must not stop the shadow
                    log.exception("shadow cycle failed")
            self.store.changed.wait(self.cfg.cycle_seconds)
            self.store.changed.clear()

    # ------------------------------------------------------------------ one cycle
    def step(self) -> list[Verdict]:
        now = self.clock()
        pods = self.store.items("pods")
        mine = self.cfg.scheduler_name
        placed: dict[str, str] = {}  # pods placed since they were seen waiting, not judged yet
        view = []
        for p in pods:
            uid = str((p.get("metadata") or {}).get("uid") or object_key(p))
            spec = p.get("spec") or {}
            if (
                spec.get("schedulerName", "default-scheduler") == mine
                and _node(p)
                and uid in self.store.seen_waiting
                and uid not in self.judged
            ):
                placed[object_key(p)] = _node(p)
                p = copy.deepcopy(p)  # as it was before its bind: waiting
                p["spec"].pop("nodeName", None)
                p["status"] = {"phase": "Pending"}
                p["__phalanx_assumed__"] = True  # an edited copy: never memoised
            view.append(p)
        read = gather(self.store.items, self.store.is_synced((JOBS.key,)), self.cfg, view)
        world = read.world(self.cfg, now, self.translations)
        free = world.snapshot.cluster.gpu_free_total.copy()
        names = [n.name for n in world.snapshot.nodes]
        result = decide(world, self.profile, now, self.rng).result  # placements compared, no forecast
        self.cycles += 1
        if self.cycles % 100 == 0:  # pods gone: forget them (a shadow runs for weeks)
            alive = {str((p.get("metadata") or {}).get("uid") or object_key(p)) for p in pods}
            self.judged &= alive
            with self.store.lock:
                self.store.seen_waiting &= alive
        out = self._judge(world, result, placed, dict(zip(names, free.tolist(), strict=True)), pods, now)
        with self.board.lock:
            self.board.shadow = self.summary()
        if self.board.wanted():
            self.board.update_later(world, result, {}, now)
        return out

    def _judge(
        self,
        world: World,
        result: CycleResult,
        placed: dict[str, str],
        free: dict[str, float],
        pods: list[dict[str, Any]],
        now: float,
    ) -> list[Verdict]:
        binds = {b.task: b for b in result.binds}
        why = {p.workload: describe(p) for p in result.pending}
        real = {object_key(p): _node(p) for p in pods}
        group_of = {p.key: g for g in world.groups.values() for p in g.pods}
        out: list[Verdict] = []
        for key, node in sorted(placed.items()):
            g = group_of.get(key)
            wl = g.name if g is not None else key
            b = binds.get(key)
            if b is not None and b.node == node:
                v = Verdict(key, wl, node, b.node, AGREE, SAME_NODE)
            elif b is not None:
                ours, theirs = free.get(b.node, 0.0), free.get(node, 0.0)
                reason = FULLER if ours < theirs else EMPTIER if ours > theirs else OTHER
                v = Verdict(key, wl, node, b.node, DISAGREE, reason)
            else:
                text = why.get(wl) or "; ".join(world.blocked.get(wl, [])) or "not taken in"
                size = g.min_available if g is not None else 1
                if size > 1:
                    reason = WHOLE_GANG
                else:
                    plugin = next(
                        (p.reasons[0].plugin for p in result.pending if p.workload == wl and p.reasons), ""
                    )
                    reason = f"would have waited ({plugin})" if plugin else "would have waited"
                v = Verdict(key, wl, node, "", DISAGREE, reason, text)
            out.append(v)
        for v in out:
            self.judged.add(self._uid(pods, v.pod))
            self.tally[(v.verdict, v.reason)] = self.tally.get((v.verdict, v.reason), 0) + 1
            self.decisions.labels(v.verdict, v.reason).inc()
            self.verdicts.appendleft(v)
            self.board.remember(
                now, f"shadow {v.verdict}", v.pod, v.real, f"Phalanx: {v.ours or 'wait'}; {v.reason}"
            )
            log.info(
                "shadow: %s %s on %s, Phalanx: %s (%s)", v.verdict, v.pod, v.real, v.ours or "wait", v.reason
            )
        for g in world.groups.values():
            bound = sum(1 for p in g.pods if real.get(p.key))
            if 0 < bound < g.min_available:
                self.partial[g.name] = f"{bound} of {g.min_available} pods placed, the gang cannot start"
            else:
                self.partial.pop(g.name, None)
        for name in [n for n in self.partial if n not in world.groups]:
            del self.partial[name]  # its pods (or the group itself) are gone: nothing is partly placed
        self.placeable = sorted(t for t in binds if t not in placed and not real.get(t))
        self.would_place.set(len(self.placeable))
        return out

    @staticmethod
    def _uid(pods: list[dict[str, Any]], key: str) -> str:
        for p in pods:
            if object_key(p) == key:
                return str((p.get("metadata") or {}).get("uid") or key)
        return key

    def summary(self) -> dict[str, Any]:
        """What `phalanx status --shadow` prints: counts by verdict and reason, gangs placed partially,
        pods Phalanx would place now, and the latest verdicts."""
        judged = sum(self.tally.values())
        agreed = sum(n for (v, _), n in self.tally.items() if v == AGREE)
        return {
            "scheduler": self.cfg.scheduler_name,
            "profile": self.profile.name,
            "judged": judged,
            "agreed": agreed,
            "by_reason": [{"verdict": v, "reason": r, "pods": n} for (v, r), n in sorted(self.tally.items())],
            "partial_gangs": dict(sorted(self.partial.items())),
            "would_place_now": self.placeable,
            "recent": [v.__dict__ for v in list(self.verdicts)[:50]],
        }


class ShadowBoard(Board):
    """The dashboard's board, with the shadow's summary in its state (each caller sees the pods
    of the namespaces it may see; the counts are the whole cluster's)."""

    shadow: dict[str, Any] = {}

    def state_json(self, visible: Visible | None = None) -> bytes:
        body = json.loads(super().state_json(visible))
        with self.lock:
            s = dict(self.shadow)
        if visible is not None and s:
            s["partial_gangs"] = {k: v for k, v in s["partial_gangs"].items() if _shown(k, visible)}
            s["would_place_now"] = [k for k in s["would_place_now"] if _shown(k, visible)]
            s["recent"] = [r for r in s["recent"] if _shown(r["pod"], visible)]
        body["shadow"] = s
        return json.dumps(body, separators=(",", ":")).encode()
