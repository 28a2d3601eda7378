"""Carry out a cycle's decisions through the API: evictions, then gangs of binds, in parallel.

Each pod is bound by one call: the Binding carries the device assignment as annotations,
which the API server copies onto the pod. A gang of several pods first gets its plan (every
member's node, devices and pod uid) on its first pod, one write per gang; if the scheduler
dies before all members are bound, the next one reads the plan and finishes the binds
(`World.unfinished`). A bind that answers 409 is checked: bound to the same node means an
earlier attempt got through (we never bind twice); bound elsewhere, or the pod gone, breaks
the gang, and the pods we bound are evicted so that no gang stays partly bound by us.
5xx, 429, timeouts and dropped connections are retried with exponential backoff.

Gangs are bound concurrently by a pool of workers (one gang per worker, its members in
order), which is what lets the API server, not our round trips, set the pace.

What the calls act on (pod objects, uids, ResourceClaims, DRA devices) is the cycle's `Scene`, handed
in with the decisions: nothing of one cycle is left on the executor for the next.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal, TypeVar

from phalanx.core.decisions import Bind, CycleResult
from phalanx.core.dra import ClaimAllocation, DraDevice
from phalanx.k8s import keys
from phalanx.k8s.act import failpoint
from phalanx.k8s.act.shares import Shares, is_share, slots_of
from phalanx.k8s.act.step import BindStep, Broke, Step
from phalanx.k8s.client.api import Api, ApiError, Conflict, NotFound
from phalanx.k8s.client.cache import object_key
from phalanx.k8s.client.kinds import PODS, RESOURCE_CLAIMS
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read import extended
from phalanx.k8s.read.claims import DraObjects
from phalanx.k8s.read.devices import ALL, binding_notes, encode_plan, stale_keys
from phalanx.k8s.read.dra import allocation_of, status_of
from phalanx.k8s.read.reservations import slot_text
from phalanx.k8s.read.world import World

log = logging.getLogger("phalanx.k8s")
T = TypeVar("T")


@dataclass
class Outcome:
    bound: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)  # workload -> why its gang was undone
    deferred: list[str] = field(default_factory=list)  # binds left for the next cycle (API trouble)
    not_evicted: list[str] = field(default_factory=list)  # evictions refused (PDB) or failed
    refusals: dict[str, str] = field(default_factory=dict)  # not evicted: the API's answer
    told: list[str] = field(default_factory=list)  # evicted pods whose Preempted Event is written
    # plans written for gangs that wait (a share's reservation pod): holder -> (workload, plan, rv before)
    planned: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def merge(self, other: Outcome) -> None:
        self.told += other.told
        self.bound += other.bound
        self.evicted += other.evicted
        self.broken.update(other.broken)
        self.deferred += other.deferred
        self.not_evicted += other.not_evicted
        self.refusals.update(other.refusals)
        self.planned.update(other.planned)


@dataclass
class Scene:
    """What one cycle's API calls act on, as the cycle read it: handed to the executor with the
    decisions rather than set on it before each call."""

    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # pod objects by namespace/name
    uids: Mapping[str, str] = field(default_factory=dict)  # pod uids by namespace/name
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)  # ResourceClaims; our writes update it
    device_classes: dict[str, dict[str, Any]] = field(default_factory=dict)  # DeviceClasses by name
    dra_devices: dict[tuple[str, str, str], DraDevice] = field(default_factory=dict)
    group_claims: dict[str, dict[str, str]] = field(default_factory=dict)  # claims reserved for a PodGroup
    extended: dict[str, extended.ExtendedAsk] = field(default_factory=dict)  # claims to make (pending key)
    claims_lock: threading.Lock = field(default_factory=threading.Lock)  # gangs are bound concurrently

    @classmethod
    def of(
        cls,
        world: World,
        pods: list[dict[str, Any]],
        dra: DraObjects,
        by_key: dict[str, dict[str, Any]] | None = None,
    ) -> Scene:
        """`by_key`: the same pods by key, as the cycle read them (else worked out)."""
        by_key = by_key if by_key is not None else {object_key(p): p for p in pods}
        return cls(
            pods=by_key,
            uids=Uids(by_key),
            claims={object_key(c): c for c in dra.claims},
            device_classes={str((c.get("metadata") or {}).get("name")): c for c in dra.classes},
            dra_devices=world.snapshot.dra_devices,
            group_claims=world.group_claims,
            extended=world.extended_claims,
        )


class Uids(Mapping[str, str]):
    """Pod uids by key, read from the pods when asked: a cycle binds a few pods of many."""

    def __init__(self, pods: Mapping[str, dict[str, Any]]) -> None:
        self._pods = pods

    def __getitem__(self, key: str) -> str:
        return str((self._pods[key].get("metadata") or {}).get("uid", ""))

    def __iter__(self) -> Iterator[str]:
        return iter(self._pods)

    def __len__(self) -> int:
        return len(self._pods)


class Streamed:
    """Gangs the core handed out before its cycle ended, bound at once by the executor's workers
    while the cycle goes on (the first binds of a burst need not wait for the whole burst to be
    decided). Gangs with DRA claims or GPU shares are left for the cycle's end, where claims and
    reservation pods are tidied first."""

    def __init__(self, executor: Executor, scene: Scene) -> None:
        self.executor, self.scene = executor, scene
        self.handed: dict[str, Future[Outcome]] = {}
        self.binds: dict[str, Bind] = {}  # those handed out, by task

    def __call__(self, workload: str, binds: list[Bind]) -> None:
        if any(b.claims for b in binds) or any(is_share(b) for b in binds):
            return
        self.binds.update((b.task, b) for b in binds)
        gang = partial(self.executor._gang, scene=self.scene, plan=True)
        self.handed[workload] = self.executor.pool.submit(gang, (workload, binds))

    def wait(self) -> Outcome:
        """What became of every gang handed out (each bound, deferred or undone)."""
        out = Outcome()
        for future in self.handed.values():
            out.merge(future.result())
        return out


class Retry(Exception):
    """Gave up after the retries; the work stays for the next cycle."""


def split(task: str) -> tuple[str, str]:
    ns, _, name = task.partition("/")
    return ns, name


class Executor:
    def __init__(
        self,
        api: Api,
        attempts: int = 4,
        backoff: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
        workers: int = 32,
    ) -> None:
        self.api = api
        self.attempts = attempts
        self.backoff = backoff
        self.sleep = sleep
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="bind")
        self.shares: Shares | None = None  # GPU shares through reservation pods (phalanx.k8s.act.shares)
        # a scheduling shard's last look at a node before binding to it: why not ("" : go on)
        self.node_check: Callable[[str], str] | None = None

    def share_gpus(self, cfg: AdapterConfig, clock: Callable[[], float]) -> None:
        """GPU shares on the stock device plugin (`--gpu-shares reservation`): their reservation pods
        are written with this executor's retries."""
        self.shares = Shares(self.api, cfg, self._retry, clock)

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def retry(self, fn: Callable[[], T]) -> T:
        """An API call with this executor's retries (for the other writers of a cycle's decisions)."""
        return self._retry(fn)

    def _retry(self, fn: Callable[[], T], conflicts: bool = False) -> T:
        """Call with backoff on 5xx, 429, timeouts and dropped connections (and on 409 if `conflicts`)."""
        delay = self.backoff
        for k in range(self.attempts):
            try:
                return fn()
            except NotFound:
                raise
            except Conflict as e:
                if not conflicts:
                    raise
                if k == self.attempts - 1:
                    raise Retry(str(e)) from e
            except ApiError as e:
                if not e.retryable:
                    raise
                if k == self.attempts - 1:
                    raise Retry(str(e)) from e
            except Exception as e:  # timeouts, dropped connections
                if k == self.attempts - 1:
                    raise Retry(str(e)) from e
                log.info("API call failed (%s), retrying in %.2f s", type(e).__name__, delay)
            self.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ evictions
    def evict(self, task: str, reason: str, out: Outcome) -> None:
        ns, name = split(task)
        try:
            self._retry(lambda: self.api.evict(ns, name, reason))
            out.evicted.append(task)
        except NotFound:
            out.evicted.append(task)  # already gone
        except (ApiError, Retry) as e:  # 429 from a PodDisruptionBudget ends up here after the retries
            log.warning("could not evict %s: %s", task, e)
            out.not_evicted.append(task)
            cause = e if isinstance(e, ApiError) else e.__cause__
            out.refusals[task] = cause.message if isinstance(cause, ApiError) else str(e)

    def tidy_shares(self, world: World, gone: Container[str], out: Outcome) -> None:
        """Reservation pods whose GPU has no share left go; shares whose reservation pod went are
        evicted (`gone`: pods already evicted, not shown so by the watch yet)."""
        shares = self.shares
        if shares is None:
            return
        shares.refresh(world.reservations)
        for slot in world.idle_reservations:
            if not shares.recent(slot, ttl=5.0):
                shares.delete(slot, world.reservations.get(slot))
        for task, slot in sorted(world.orphan_shares.items()):
            if task not in gone and shares.gone(slot):
                why = f"the reservation pod that held {slot_text(slot)} for it is gone"
                log.warning("evicting share %s: %s", task, why)
                self.evict(task, why, out)

    # ------------------------------------------------------------------ binds
    def stream(self, scene: Scene) -> Streamed:
        """Where the core hands out gangs while it decides (`run_cycle`'s `stream`)."""
        return Streamed(self, scene)

    def apply(self, result: CycleResult, scene: Scene, streamed: Streamed | None = None) -> Outcome:
        """The cycle's evictions, then its gangs' binds (those onto a node an eviction frees wait).
        Gangs already handed out while the cycle was decided (`streamed`) are not bound again:
        their outcomes are waited for and joined to the rest."""
        out = Outcome()
        handed = streamed.handed if streamed is not None else {}
        evict = partial(self._evict_one, scene=scene)
        parts = list(self.pool.map(evict, [(ev.task, ev.reason) for ev in result.evictions]))
        for p in parts:
            out.merge(p)
        # an evicted pod frees its devices only once it is gone (a graceful deletion waits for its
        # kubelet), and a refused eviction (a PodDisruptionBudget) frees nothing: binds onto those
        # nodes wait for a later cycle, which sees the victims terminating or gone
        held = {ev.node for ev in result.evictions}
        gangs: dict[str, list[Bind]] = {}
        for b in result.binds:
            gangs.setdefault(b.workload, []).append(b)
        todo = []
        for workload, binds in gangs.items():
            if workload in handed:
                continue
            if any(b.node in held for b in binds):
                out.deferred += [b.task for b in binds]
            else:
                todo.append((workload, binds))
        self._bind_all(todo, scene, True, out)
        if streamed is not None:
            out.merge(streamed.wait())
        return out

    def _evict_one(self, item: tuple[str, str], scene: Scene) -> Outcome:
        """One eviction, then at once the victim's `Preempted` Event naming its preemptor: written
        with the explanations in the background, behind the binds, it came minutes late on a busy
        cluster or was lost with a leader killed (a full-cluster churn run: 5 % of evictions told)."""
        o = Outcome()
        task, reason = item
        self.evict(task, reason, o)
        obj = scene.pods.get(task)
        if o.evicted and obj is not None:
            try:
                self.api.event(obj, "Preempted", reason, True)
                o.told.append(task)
            except Exception as e:  # the explanations try again after the binds
                log.info("could not write the Preempted Event of %s: %s", task, e)
        return o

    def finish(self, binds: list[Bind], scene: Scene, out: Outcome) -> None:
        """Binds chosen by an earlier run (its plan is on the pods already)."""
        gangs: dict[str, list[Bind]] = {}
        for b in binds:
            gangs.setdefault(b.workload, []).append(b)
        self._bind_all(list(gangs.items()), scene, False, out)

    def _bind_all(self, gangs: list[tuple[str, list[Bind]]], scene: Scene, plan: bool, out: Outcome) -> None:
        fn = partial(self._gang, scene=scene, plan=plan)
        for part in self.pool.map(fn, gangs):
            out.merge(part)

    def _gang(self, item: tuple[str, list[Bind]], scene: Scene, plan: bool) -> Outcome:
        out = Outcome()
        try:
            self.bind_gang(item[0], item[1], scene, out, write_intent=plan)
        except Exception as e:  # never lose the other gangs' outcomes to one surprise
            log.exception("binding gang %s failed", item[0])
            out.broken[item[0]] = f"unexpected error: {type(e).__name__}: {e}"
        return out

    def clear_intent(self, task: str) -> None:
        ns, name = split(task)
        notes: dict[str, str | None] = dict.fromkeys((*ALL, keys.GANG_PLAN))
        try:
            self._retry(lambda: self.api.patch_pod_annotations(ns, name, notes), conflicts=True)
        except (ApiError, Retry) as e:
            log.info("could not clear the chosen node of %s: %s", task, e)

    def bind_gang(
        self, workload: str, binds: list[Bind], scene: Scene, out: Outcome, write_intent: bool
    ) -> None:
        uids = scene.uids
        if self.node_check is not None:
            why = next(filter(None, map(self.node_check, sorted({b.node for b in binds}))), "")
            if why:  # nothing of the gang is written: it is placed again by the next cycle
                log.info("gang %s not bound: %s", workload, why)
                out.broken[workload] = why
                return
        shared = self.shares is not None and any(is_share(b) for b in binds)
        planned = len(binds) > 1 or shared  # a share may wait cycles for its GPU: keep the decision
        plan = ""
        if write_intent and planned:
            ns, name = split(binds[0].task)
            plan = encode_plan(binds, uids)
            notes: dict[str, str | None] = {keys.GANG_PLAN: plan}
            try:
                self._retry(partial(self.api.patch_pod_annotations, ns, name, notes), conflicts=True)
            except (ApiError, Retry) as e:
                out.broken[workload] = f"could not record the gang's plan on {binds[0].task}: {e}"
                return
            failpoint.hit("plan-written")
        claimed = [b for b in binds if b.claims]
        if claimed:
            broke = self._write_claims(claimed, scene)
            if broke is not None:
                out.broken[workload] = broke.why
                if write_intent and planned:
                    self.clear_intent(binds[0].task)
                return
        if shared and self.shares is not None:
            match self.shares.prepare(binds, scene.pods, uids):
                case Step.READY:
                    pass
                case Step.LATER:  # a reservation pod waits for its GPU; the plan keeps the decision
                    out.deferred += [b.task for b in binds]
                    if plan:  # written now: assumed until the watch shows it; said once
                        holder = binds[0].task
                        before = ((scene.pods.get(holder) or {}).get("metadata") or {}).get("resourceVersion")
                        out.planned[holder] = (workload, plan, str(before or ""))
                        slots = {s for b in binds if is_share(b) for s in slots_of(b)}
                        where = ", ".join(slot_text(s) for s in sorted(slots))
                        log.info("gang %s planned: waits for the reservation pod of %s", workload, where)
                    return
                case Broke(why):
                    log.info("gang %s cannot go where it was placed: %s", workload, why)
                    out.broken[workload] = why
                    self.clear_intent(binds[0].task)
                    return
        done: list[Bind] = []
        for b in binds:
            match self._bind_one(b, uids.get(b.task, ""), scene.pods.get(b.task)):
                case Step.BOUND:
                    done.append(b)
                    out.bound.append(b.task)
                    failpoint.hit("bound")
                case Step.LATER:
                    out.deferred.append(b.task)
                case Broke(why):
                    self._undo(workload, done, binds, why, out, planned)
                    return

    # ------------------------------------------------------------------ DRA claims
    def _write_claims(self, binds: list[Bind], scene: Scene) -> Broke | None:
        """Allocate the gang's claims (status.allocation, reservedFor) before any of its pods is bound;
        None when all are, else why not.

        Each write carries the claim's resourceVersion: a claim someone else allocated meanwhile
        answers 409 and is never allocated twice. On failure what this gang wrote is undone.
        """
        written: list[tuple[str, bool, str]] = []  # (claim, fresh, pod uid)
        made: set[str] = set()  # claims made here for pods' extended resources: deleted on failure
        for b in binds:
            uid = scene.uids.get(b.task, "")
            for ca in b.claims:
                holder = scene.group_claims.get(ca.claim)  # a native PodGroup's claim: reserved for it
                try:
                    if extended.is_pending(ca.claim):
                        key = self._make_extended(ca, b, uid, scene)
                        made.add(key)
                        written.append((key, True, uid))
                        continue
                    fresh = self._claim_one(ca, b, uid, scene)
                except (ApiError, Retry, ValueError) as e:
                    self._unclaim(written, made)
                    what = (
                        "the ResourceClaim for its extended resources"
                        if extended.is_pending(ca.claim)
                        else (f"ResourceClaim {ca.claim}")
                    )
                    return Broke(f"could not allocate {what}: {e}")
                written.append((ca.claim, fresh, holder["uid"] if holder else uid))
        return None

    def _make_extended(self, ca: ClaimAllocation, b: Bind, uid: str, scene: Scene) -> str:
        """Make the claim for a pod's extended resources that DRA serves, as kube-scheduler makes it
        (or take the one an earlier failed bind left): allocated and reserved for the pod, then
        named in the pod's `status.extendedResourceClaimStatus` (the kubelet reads the claim from
        there), before the bind. Returns its key; on failure it is released again (`_release`)."""
        ask = scene.extended.get(ca.claim)
        if ask is None:
            raise ValueError("what the pod asks was not read with the decision")
        ns, pod = split(b.task)
        if ask.existing:
            key = f"{ns}/{ask.existing}"
        else:
            made = extended.claim_object(ask, ns, pod, uid)
            obj = self._retry(partial(self.api.create, RESOURCE_CLAIMS, made, ns))
            key = object_key(obj)
            with scene.claims_lock:
                scene.claims[key] = obj
        try:
            self._claim_one(replace(ca, claim=key), b, uid, scene)
            status = extended.pod_status(ask, split(key)[1])
            self._retry(partial(self.api.patch, PODS, pod, ns, {"status": status}, "status"))
        except (ApiError, Retry, ValueError):
            self._unclaim([(key, True, uid)], {key})
            raise
        return key

    def _release(self, key: str) -> None:
        """A claim made for extended resources whose bind failed: its delete-protection finalizer
        removed, so that the pod's garbage collection can delete it; the next try reuses it. (The
        scheduler deletes nothing: kube-scheduler deletes such a claim, Phalanx's RBAC has no delete.)"""
        ns, name = split(key)
        try:
            self._retry(
                partial(self.api.patch, RESOURCE_CLAIMS, name, ns, {"metadata": {"finalizers": None}})
            )
        except (ApiError, Retry) as e:
            log.warning("could not release ResourceClaim %s made for extended resources: %s", key, e)

    def _claim_one(self, ca: ClaimAllocation, b: Bind, uid: str, scene: Scene) -> bool:
        """Write one claim for pod `b`; True if this allocated it, False if it was allocated already."""
        ns, name = split(ca.claim)
        _, pod = split(b.task)
        for attempt in range(2):
            with scene.claims_lock:
                obj = scene.claims.get(ca.claim)
            if obj is None or attempt:
                obj = self._retry(partial(self.api.get, RESOURCE_CLAIMS, name, ns))
                if obj is None:
                    raise ValueError("it is gone")
            status = obj.get("status") or {}
            reserved = list(status.get("reservedFor") or [])
            me = scene.group_claims.get(ca.claim) or {"resource": "pods", "name": pod, "uid": uid}
            if any(r.get("uid") == me["uid"] for r in reserved):
                return False
            body: dict[str, Any] = {"reservedFor": [*reserved, me]}
            current = allocation_of(obj)
            fresh = current is None
            if current is None:
                body["allocation"] = status_of(ca, scene.dra_devices, b.node, obj, scene.device_classes)
            elif {r.id for r in current.results} != {r.id for r in ca.results}:
                raise ValueError("it was allocated other devices meanwhile")
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            write = partial(
                self.api.patch,
                RESOURCE_CLAIMS,
                name,
                ns,
                {"metadata": {"resourceVersion": rv}, "status": body},
                "status",
            )
            try:
                new = self._retry(write)
            except Conflict:
                continue  # changed under us: read it again and decide again
            with scene.claims_lock:
                scene.claims[ca.claim] = new
            return fresh
        raise ValueError("it kept changing under us")

    def _unclaim(self, written: list[tuple[str, bool, str]], made: Container[str] = ()) -> None:
        for claim, fresh, uid in reversed(written):
            if claim in made:
                self._release(claim)
            ns, name = split(claim)
            try:
                obj = self._retry(partial(self.api.get, RESOURCE_CLAIMS, name, ns))
                if obj is None:
                    continue
                status = obj.get("status") or {}
                reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") != uid]
                body: dict[str, Any] = {"reservedFor": reserved or None}
                if fresh and not reserved:
                    body["allocation"] = None
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                patch = {"metadata": {"resourceVersion": rv}, "status": body}
                self._retry(partial(self.api.patch, RESOURCE_CLAIMS, name, ns, patch, "status"))
            except (ApiError, Retry) as e:
                log.warning("could not undo the allocation of ResourceClaim %s: %s", claim, e)

    def _bind_one(self, b: Bind, uid: str, pod: dict[str, Any] | None) -> BindStep:
        """BOUND, LATER (API trouble: the plan stays, the next cycle retries), or Broke: why."""
        ns, name = split(b.task)
        try:
            current = ((pod or {}).get("metadata") or {}).get("annotations") or {}
            stale = stale_keys(current, b)
            if stale:  # a Binding can only add annotations: remove what an earlier try left
                self._retry(
                    partial(self.api.patch_pod_annotations, ns, name, dict.fromkeys(stale)), conflicts=True
                )
            self._retry(lambda: self.api.bind(ns, name, uid, b.node, binding_notes(b)))
            return Step.BOUND
        except Retry:
            return self._verify(b) or Step.LATER
        except NotFound:
            return Broke(f"pod {b.task} is gone")
        except Conflict:
            return self._verify(b) or Broke(f"pod {b.task} conflicts")
        except ApiError as e:
            return Broke(f"pod {b.task} could not be bound: {e}")

    def _verify(self, b: Bind) -> Literal[Step.BOUND] | Broke | None:
        """After a 409 or a timeout: is the pod bound, and where? None: it cannot be told now."""
        ns, name = split(b.task)
        try:
            pod: dict[str, Any] | None = self._retry(lambda: self.api.get_pod(ns, name))
        except (ApiError, Retry):
            return None
        if pod is None:
            return Broke(f"pod {b.task} is gone")
        node = (pod.get("spec") or {}).get("nodeName")
        if node == b.node:
            return Step.BOUND
        if node:
            return Broke(f"pod {b.task} was bound to {node} by someone else")
        return None

    def _undo(
        self, workload: str, done: list[Bind], binds: list[Bind], why: str, out: Outcome, planned: bool
    ) -> None:
        """The gang cannot complete: evict what we bound, forget what we chose."""
        log.warning("gang %s broke (%s): undoing %d bind(s)", workload, why, len(done))
        out.broken[workload] = why
        for b in done:
            self.evict(b.task, f"gang {workload} could not be completed: {why}", out)
            out.bound.remove(b.task)
        if planned and binds[0] not in done:
            self.clear_intent(binds[0].task)  # the plan: nobody must finish this gang
