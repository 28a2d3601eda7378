"""`phalanx scheduler`: informers -> world -> `decide` (the core's `run_cycle`) -> API calls.

One cycle (`step`): read the store into the world (`_read`), decide (`phalanx.k8s.decide`), act
on the cycle's Scene (`_act`: binds an earlier run planned but did not make, then the decisions),
then forecast, explain and report (`_tell`), and update metrics. Cycles run every `cycle_seconds`
and early when the store changes; only the leader runs them (or every replica, with leader
election off). Explanations are written in the background: they never hold up a bind. Every
"now", and every interval (quiet recheck, audit), is read from the one injected clock.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from phalanx.core.decisions import Bind, CycleResult
from phalanx.core.profile import Profile
from phalanx.core.snapshot import Snapshot
from phalanx.core.snapshot_diff import differences
from phalanx.k8s import keys
from phalanx.k8s.act import recuts
from phalanx.k8s.act.executor import Executor, Outcome, Scene, Streamed
from phalanx.k8s.act.explain import Explainer
from phalanx.k8s.act.staging import StageRequests
from phalanx.k8s.client.api import Api
from phalanx.k8s.client.cache import Informers, Store
from phalanx.k8s.client.kinds import JOBS, NODES, POD_GROUPS, PODS, QUEUES, WATCHED, keys_of
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.decide.cycle import Decision, Forecasting, decide
from phalanx.k8s.loop.assume import Assumptions
from phalanx.k8s.loop.group_lookup import GroupLookup
from phalanx.k8s.loop.heap import Heap
from phalanx.k8s.loop.leader import LEASE, LeaderElector
from phalanx.k8s.loop.repeat_memory import Memory, RepeatMemory
from phalanx.k8s.loop.report import board_cycle, cycle_metrics, held_preemptors
from phalanx.k8s.loop.service import CONFIGMAP, AttainedService, ServiceStore
from phalanx.k8s.read.carry import Carry
from phalanx.k8s.read.contain import label
from phalanx.k8s.read.gather import Gathered, gather
from phalanx.k8s.read.kueue import Kueue
from phalanx.k8s.read.patch import Feed
from phalanx.k8s.read.shard import ShardFilter, pods_on_node
from phalanx.k8s.read.translations import Translations
from phalanx.k8s.read.unread import unread_left_out
from phalanx.k8s.read.world import World
from phalanx.k8s.view.board import Board
from phalanx.k8s.view.server import Metrics

log = logging.getLogger("phalanx.k8s")
POD_GROUP_KINDS = keys_of(POD_GROUPS)
QUEUE_KINDS = keys_of(QUEUES)
# after a cycle that evicted, the attained service (with who was evicted for what, and when) is
# saved within this, not only every service_save_s: churn runs with kill -9 of the leader found
# the repeat guard and the eviction budgets forgetting what the killed leader had evicted
EVICTED_SAVE_S = 1.0


@dataclass
class StepReport:
    world: World
    result: CycleResult | None
    outcome: Outcome


@dataclass
class Read:
    """What a cycle read: the pods (with the binds and evictions it assumes), every kind gathered,
    and the world built from them."""

    pods: list[dict[str, Any]]
    gathered: Gathered
    world: World
    by_key: dict[str, dict[str, Any]] | None = None  # the same pods by key


class Scheduler:
    def __init__(
        self,
        api: Api,
        cfg: AdapterConfig,
        profile: Profile,
        identity: str = "phalanx-0",
        clock: Callable[[], float] = time.time,
        executor: Executor | None = None,
        seed: int = 0,
    ) -> None:
        self.api = api
        self.cfg = cfg
        self.profile = profile
        self.clock = clock  # the one clock: the cycle's "now" and every interval below
        self.service = AttainedService(cfg.history_half_life_s)
        self.service_store = ServiceStore(api, cfg.lease_namespace, CONFIGMAP + cfg.shard_suffix())
        self.service_loaded = False  # read back from the API since we last started to lead
        self.service_saved = 0.0
        self.evictions_unsaved = False  # evictions made since the last save of the attained service
        # who was evicted for which preemptor shape, when: the repeat guard's memory across cycles,
        # saved with the attained service (phalanx.k8s.loop.repeat_memory)
        self.repeats = RepeatMemory()
        # a scheduling shard keeps only its pools' nodes and waiting pods (phalanx.k8s.read.shard)
        self.shard = (
            ShardFilter(cfg.shard, cfg.scheduler_name, pods_on=pods_on_node(api))
            if cfg.shard is not None
            else None
        )
        self.store = Store(gate=self.shard, transform=unread_left_out)
        self.stop_event = threading.Event()
        self.executor = executor or Executor(api, workers=cfg.bind_workers)
        if self.shard is not None:
            self.executor.node_check = self._node_in_shard
        if cfg.gpu_shares == "reservation":
            self.executor.share_gpus(cfg, clock)
        self.explainer = Explainer(api)
        self.elector = LeaderElector(
            api,
            cfg.lease_namespace,
            identity,
            name=LEASE + cfg.shard_suffix(),
            duration_s=cfg.lease_seconds,
            clock=clock,
        )
        self.metrics = Metrics(cfg.shard.me.name if cfg.shard is not None else "")
        self.rng = np.random.default_rng(seed)
        self.informers = Informers(api, WATCHED, self.store, self.stop_event, cfg.rediscover_seconds)
        self.lookup = GroupLookup(api, self.store, self.informers.watched)
        self.translations = Translations()
        self.carry = Carry()  # the snapshot kept from one cycle to the next
        self.heap = Heap(cfg.gc_full_every_s)  # full collections between cycles, not inside them
        self.audited = clock()
        self.cycles = 0
        # what we did that the watch may not show yet (kube-scheduler's "assume")
        self.assume = Assumptions(ttl=60.0)
        self.kueue_unhonoured: list[str] = []
        # start forecasts: run times learnt from finished pods add up across cycles
        self.forecasting = Forecasting(cfg.forecast_budget_s, default_queue=cfg.default_queue, courtesy=True)
        self.board = Board(pool_label=cfg.pool_label, clock=clock)
        self.last_insight: dict[str, str] = {}
        self.staging = StageRequests(api, cfg.stage_ahead_s)
        # the store's generation when a cycle left nothing to do (None: the next cycle must run)
        self.quiet_at: int | None = None
        # when the clock alone may change the last cycle's answer (the core's wake-up, `result.wake`)
        self.wake_at = math.inf
        self.last_cycle = -math.inf  # when the last cycle ran (the clock's time)

    @property
    def evicted_for(self) -> Memory:
        """The repeat guard's memory of evictions (kept by `repeats`)."""
        return self.repeats.evicted_for

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self.cfg.shard is not None:
            log.info(
                "scheduling shard %s (Lease %s); every shard: %s",
                self.cfg.shard.me.said(),
                self.elector.name,
                self.cfg.shard.shards.said(),
            )
        self.informers.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.store.changed.set()

    def close(self) -> None:
        """Stop, and let the binds and explanations in flight finish; close the watches."""
        self.stop()
        self.executor.close()
        self.explainer.close()
        self.api.close_watches()  # shut down, not closed under the informers

    def ready(self) -> bool:
        """Discovery ran and every served kind listed once; kinds the server lacks are not waited for."""
        return self.informers.synced()

    def wait_synced(self, timeout: float = 10.0) -> bool:
        return self.informers.wait_synced(timeout)

    def run(self) -> None:
        """Until stopped: lead (or not, with leader election off) and cycle.

        Raises LeaseNamespaceMissing when the Lease cannot be written at all: looping on it
        would schedule nothing and say so only in the log.
        """
        if self.cfg.leader_elect:
            self.elector.prepare()
            self.elector.start(self.stop_event)
        while not self.stop_event.is_set():
            leading = self.elector.leading if self.cfg.leader_elect else True
            self.metrics.leader.set(1 if leading else 0)
            if not leading:
                self.service_loaded = False  # another leader went on: read its record when we lead
                self.quiet_at = None
                self.carry.drop()
            if leading and self.ready():
                if self.quiet():
                    self.metrics.skipped.inc()
                else:
                    try:
                        self.step()
                    except Exception:  # a bad cycle must not kill the scheduler
                        self.quiet_at = None
                        self.wake_at = math.inf
                        self.carry.drop()  # whatever it left half done: the next cycle starts afresh
                        log.exception("cycle failed")
            self.store.changed.wait(self._pause())
            self.store.changed.clear()
        if self.elector.fatal is not None:
            raise self.elector.fatal

    def quiet(self) -> bool:
        """Whether a cycle now would decide nothing: nothing in the store changed since a cycle
        that left nothing binding, evicting or to clean up, the core's wake-up is not due (a
        guard's end, a rank change: `phalanx.core.wake`), and no browser looks at an older view.
        Work that waits for capacity waits for a change, not for the next period. Drift with no
        one moment (fair-share history decaying) is looked at every `quiet_recheck_s`, as a quiet
        cluster is."""
        now = self.clock()
        save_due = self._save_due(now)
        return (
            self.quiet_at is not None
            and self.quiet_at == self.store.generation
            and 0 <= now - self.last_cycle < self.cfg.quiet_recheck_s
            and now < self.wake_at
            and not save_due  # the attained-service record is kept fresh even on a quiet cluster
            and not self.board.wants_cycle()  # a browser opened on a view older than the last cycle
        )

    def _pause(self) -> float:
        """How long the loop waits for a change: a period, or less when the core's wake-up is sooner."""
        return max(0.0, min(self.cfg.cycle_seconds, self.wake_at - self.clock()))

    # ------------------------------------------------------------------ one cycle
    def step(self) -> StepReport:
        """One cycle: read, keep the attained service, decide, act, then explain and report; the
        collector off meanwhile (`Heap.cycle`)."""
        with self.heap.cycle():
            return self._step()

    def _step(self) -> StepReport:
        t0 = time.perf_counter()
        now = self.clock()
        self.last_cycle = now
        generation = self.store.generation  # before the reads: a change during the cycle counts
        read = self._read(now, generation)
        if self.lookup.look(read.world):  # a gang's PodGroup its watch had not delivered yet
            generation = self.store.generation
            read = self._read(now, generation)
        world = read.world
        self._keep_service(world.snapshot, now)
        self.cycles += 1
        if self.cycles % 100 == 0:
            self._forget_translations()
            self.repeats.forget_old(now)  # by age: a gang evicted may be absent while it is remade
        self.repeats.claim(world.snapshot)  # as an earlier leader saved it
        out = Outcome()
        for task in world.stale_intents:
            self.executor.clear_intent(task)
        t_read = time.perf_counter()
        scene = Scene.of(world, read.pods, read.gathered.dra, read.by_key)
        streamed = self.executor.stream(scene)  # gangs bound as the core places them
        self.explainer.writer.pause()  # binds first: explanations wait for the burst to pass
        try:
            try:
                decision = decide(
                    world,
                    self.profile,
                    now,
                    self.rng,
                    evicted_for=self.repeats.evicted_for,
                    recent=self.repeats.recent,
                    stream=streamed,
                )
            except BaseException:
                self._assume(streamed.wait(), streamed.binds, now)  # what was bound before it failed
                raise
            result = decision.result
            if result.binds or result.evictions or result.repartitions:
                self.carry.applied = True  # the snapshot moved on: the next cycle reads again
            t_decide = time.perf_counter()
            binds = self._act(world, scene, result, out, now, streamed)
        finally:
            self.explainer.writer.resume()
        if out.evicted:  # who was evicted and when, saved soon: a leader killed before the next
            self.evictions_unsaved = True  # save forgot them (the repeat guard, spent budgets)
            self._save_service(now)
        t_act = time.perf_counter()
        self._tell(read, scene, decision, out, binds, now)
        t_end = time.perf_counter()
        phases = {"read": t_read - t0, "decide": t_decide - t_read, "act": t_act - t_decide}
        phases["report"] = t_end - t_act
        for name, took in phases.items():
            self.metrics.phase.labels(name).observe(took)
        cycle_metrics(self.metrics, world, result, out, t_end - t0, self.cfg.pool_label)
        full = self.heap.after_cycle(now)
        if full is not None:
            self.metrics.gc_full.observe(full)
        self.quiet_at = None if self._busy(world, result, out) else generation
        self.wake_at = min(result.wake.at if result.wake is not None else math.inf, self._staging_due())
        if out.bound or out.evicted or out.broken:
            log.info(
                "cycle %d: %d bound, %d evicted, %d gang(s) undone, %d waiting (%.2f s: %s)",
                self.cycles,
                len(out.bound),
                len(out.evicted),
                len(out.broken),
                len(result.pending) + len(world.blocked),
                t_end - t0,
                ", ".join(f"{k} {v:.3f}" for k, v in phases.items()),
            )
        return StepReport(world, result, out)

    def _read(self, now: float, generation: int) -> Read:
        """The store -> the cycle's world: kept from the last cycle where nothing changed, checked
        now and then against one built from scratch."""
        assumed = self.assume.stamp()
        by_key = self.store.table(PODS.key)
        self.assume.apply_table(by_key, now)
        pods = list(by_key.values())
        split = self.shard.split() if self.shard is not None else None
        gathered = gather(self.store.items, self.store.is_synced((JOBS.key,)), self.cfg, pods, split)
        self._kueue_unhonoured(gathered.kueue)
        rebuilt, patched = self.carry.rebuilt, self.carry.patched
        if self.board.reading():  # the dashboard still reads the last snapshot: leave it that one
            self.carry.drop()
        stamp = (generation, self.assume.stamp())
        feed = self._feed({key for keys_ in (*assumed, *stamp[1]) for key in keys_})
        world = gathered.world(self.cfg, now, self.translations, self.carry, stamp, feed)
        self.carry.at = generation
        if self.carry.rebuilt != rebuilt or world.snapshot is not self.carry.snap:
            self.metrics.rebuilds.inc()
            self.metrics.reads.labels("rebuilt").inc()
        else:
            self.metrics.reads.labels("patched" if self.carry.patched != patched else "kept").inc()
            self.metrics.recorded.observe(self.carry.recorded)
            world = self._audit(world, gathered, now)
        return Read(pods, gathered, world, by_key)

    def _feed(self, assumed: set[str]) -> Feed:
        """What changed since the kept world was read: the watch cache's feed, and the pods whose
        assumption began or ended (the store does not see those); lookups as this cycle reads them."""
        changes = None
        if self.carry.at is not None:
            changes = self.store.changes(self.carry.at)
            if changes is None:
                self.metrics.feed_behind.inc()
        if changes is not None and assumed:
            keys_ = changes.get(PODS.key, set())
            if keys_ is not None:
                changes[PODS.key] = keys_ | assumed
        overlay = self.assume.overlay
        return Feed(
            changes,
            lambda k: overlay.get(k) or self.store.get(PODS.key, k),
            lambda n: self.store.get(NODES.key, n),
            self.store.get,
        )

    def _node_in_shard(self, name: str) -> str:
        """A node relabelled out of the shard's pools since the read is not bound to (the watch
        cache's view of it, as kube-scheduler's binds trust its cache)."""
        if self.store.get(NODES.key, name) is not None:
            return ""
        assert self.cfg.shard is not None
        return f"node {name} is no longer in shard {self.cfg.shard.me.said()} (relabelled or gone)"

    def _keep_service(self, snap: Snapshot, now: float) -> None:
        """Attained service: read back once per leadership, added to the snapshot, saved now and then."""
        self._load_service(now)
        self.service.apply(snap, now)
        self._save_service(now)

    def _act(
        self, world: World, scene: Scene, result: CycleResult, out: Outcome, now: float, streamed: Streamed
    ) -> dict[str, Bind]:
        """Decisions -> API calls: GPU-share reservations tidied, binds an earlier run planned finished,
        then this cycle's evictions and binds (joined to those `streamed` while the cycle was decided);
        what was done is assumed until the watch shows it. Returns every bind tried, by task."""
        self.executor.tidy_shares(world, self.assume.gone, out)
        if world.unfinished:
            self.executor.finish(world.unfinished, scene, out)
        out.merge(self.executor.apply(result, scene, streamed))
        # for the node agents (the GPUs serve nothing till they answer); one not asked: the kept
        # snapshot would hold it as being cut, so the next cycle builds one from the API
        if result.repartitions and recuts.ask(self.api, self.executor.retry, result.repartitions, now):
            self.carry.drop()
        binds = {b.task: b for b in [*world.unfinished, *result.binds]}
        self._assume(out, binds, now)
        world.snapshot.look_again({binds[t].workload for t in out.deferred if t in binds} | out.broken.keys())
        return binds

    def _assume(self, out: Outcome, binds: dict[str, Bind], now: float) -> None:
        """What the API was asked is taken as done until the watch shows it."""
        for task in out.bound:
            self.assume.bound(task, binds[task], now)
        for task in out.evicted:
            self.assume.evicted(task, now)
        self.assume.unplanned(out.broken)  # undone: their plans were cleared
        for holder, (workload, plan, before) in out.planned.items():
            self.assume.planned(holder, workload, plan, before, now)

    def _tell(
        self, read: Read, scene: Scene, decision: Decision, out: Outcome, binds: dict[str, Bind], now: float
    ) -> None:
        """After the binds: the start forecasts, staging ahead of them, Events and status (written in
        the background), and the dashboard's record."""
        world, result, queues = read.world, decision.result, read.gathered.queues
        ours = {str((q.get("metadata") or {}).get("name")) for q in queues if keys.is_ours(q)}
        named = [p for p in world.problems if p.startswith(("Node ", "Queue "))]
        left_out = {  # the nodes and queues that cannot be read (looked for only when there are some)
            label(kind, o): o
            for kind, objs in (("Node", self.store.items("nodes") if named else []), ("Queue", queues))
            for o in objs
            if named and label(kind, o) in world.problems
        }
        ahead = decision.foresee(self.forecasting, finished=read.pods)
        insight = ahead.texts
        self.last_insight = insight
        if self.cfg.stage_ahead_s > 0:
            nodes = partial(self.store.items, NODES.key)
            self.staging.update(world.snapshot, ahead, nodes, partial(self.store.get, NODES.key), now)
        held = held_preemptors(result, out, binds)
        self.explainer.write(
            world, result, scene.pods, ours, left_out, insight, held, out.bound, out.broken, set(out.told)
        )
        board_cycle(self.board, world, result, out, binds, insight, now)

    def _staging_due(self) -> float:
        """When a forecast start comes within the staging horizon (its data is asked for then)."""
        return self.staging.due if self.cfg.stage_ahead_s > 0 else math.inf

    def _busy(self, world: World, result: CycleResult, out: Outcome) -> bool:
        """Whether the next cycle must run even if nothing in the store changes (work that only
        waits does not: the core's wake-up says when the clock alone changes its answer)."""
        return bool(
            result.binds
            or result.evictions
            or world.blocked
            or world.waiting_pods
            or world.unfinished
            or world.stale_intents
            or world.idle_reservations
            or world.orphan_shares
            or out.deferred
            or out.not_evicted
            or self.assume
        )

    def _load_service(self, now: float) -> None:
        """Attained service and fair-share history as the last leader left them (once per leadership)."""
        if self.service_loaded:
            return
        try:
            saved = self.service_store.read()
        except Exception as e:  # the API is away: try again next cycle, schedule meanwhile
            log.warning("cannot read the attained service (ConfigMap %s): %s", self.service_store.name, e)
            return
        self.service_loaded = True
        self.service_saved = now  # no write before a full interval: the record is as good as ours
        if saved is not None:
            self.service.load(saved)
            log.info(
                "attained service of %d workload(s), usage history of %d queue(s), %d workload(s)'"
                " evictions and %d eviction(s) of the last hour read back",
                self.service.tracked(),
                len(self.service.history),
                len(self.service.evictions),
                len(self.service.recent),
            )
        self.repeats.read_back(self.service.evictions, self.service.recent)

    def _save_due(self, now: float) -> bool:
        """Every `service_save_s`, and `EVICTED_SAVE_S` after evictions not saved yet."""
        every = EVICTED_SAVE_S if self.evictions_unsaved else self.cfg.service_save_s
        return self.service_loaded and now - self.service_saved >= every

    def _save_service(self, now: float) -> None:
        if not self._save_due(now):
            return
        self.service_saved = now
        self.service.evictions = self.repeats.to_saved(now)
        self.service.recent = self.repeats.recent_saved(now)
        try:
            self.service_store.write(self.service.to_dict())
            self.evictions_unsaved = False
        except Exception as e:  # not fatal: the next interval tries again
            log.warning("cannot write the attained service (ConfigMap %s): %s", self.service_store.name, e)

    def _kueue_unhonoured(self, k: Kueue | None) -> None:
        """Migrating from Kueue: what cannot be carried over, logged when it changes."""
        if k is not None and k.mode == "migrate" and k.unhonoured != self.kueue_unhonoured:
            for line in k.unhonoured:
                log.warning("Kueue migration: %s", line)
            self.kueue_unhonoured = k.unhonoured

    def _audit(self, world: World, read: Gathered, now: float) -> World:
        """Now and then, the kept snapshot against one built from scratch: on a difference (a bug of
        ours), say what differs and go on with the one from scratch."""
        every = self.cfg.world_audit_s
        if every <= 0 or 0 <= now - self.audited < every:
            return world
        self.audited = now
        scratch = read.world(self.cfg, now, self.translations)
        diff = differences(scratch.snapshot, world.snapshot)
        if not diff:
            return world
        self.metrics.drift.inc()
        log.error(
            "the kept snapshot differs from one built from scratch (using that one): %s", "; ".join(diff)
        )
        self.carry.drop()
        return scratch

    def _forget_translations(self) -> None:
        uids = {
            str((o.get("metadata") or {}).get("uid", ""))
            for kind in ("nodes", "pods")
            for o in self.store.items(kind)
        }
        self.translations.forget_except(uids, uids)
