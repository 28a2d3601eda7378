"""Explanations written back: Events on pods, phase and conditions on our PodGroups, status on our Queues.

Each is written only when its text changes, so a pod waiting for hours gets one Event, not
one per cycle. Objects left out as bad (nodes, queues of any dialect) get a Warning Event
too. A gang whose pods are still being created is told so in a Normal Event (`WaitingForPods`).
A waiting workload's reason names the guards that hold back the evictions it needs
(`Pending.holds`), with the UTC time each ends. Our PodGroups get the gang's phase and member
counts (`phalanx.k8s.read.lifecycle`) every cycle they change, and two conditions: `Scheduled` (why
the gang is placed or waits) and `Running` (how many members run, ended and wait).
The writes go through a background `Writer`, as client-go's event broadcaster does:
a cycle decides what to say and moves on; binds never wait for explanations.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from phalanx.core.decisions import (
    DISRUPTION_BUDGET,
    NOT_PREEMPTIBLE,
    RECLAIM_COST,
    Bind,
    CycleResult,
    Hold,
    Pending,
    holds_text,
)
from phalanx.core.feasibility import GPU_MEMORY_UNKNOWN
from phalanx.core.model import MIG_BACKEND
from phalanx.core.queues import CPU, GPU, MEM
from phalanx.k8s import keys
from phalanx.k8s.act.native_status import NativeStatus
from phalanx.k8s.client.api import Api, ApiError
from phalanx.k8s.decide.insight import wall
from phalanx.k8s.read.lifecycle import gang_status
from phalanx.k8s.read.world import World

log = logging.getLogger("phalanx.k8s")
OUR_PODGROUPS = f"{keys.GROUP}/{keys.VERSION}/podgroups"
OUR_QUEUES = f"{keys.GROUP}/{keys.VERSION}/queues"
# A pod told again with the same reason, only its text changed (free GPUs, a forecast, pods still
# to come), is told at once RETELL_BURST times, then at most once every RETELL_S: every bind moves the
# numbers of every waiting pod, and each Event is an object in etcd (kube's own event recorder lets
# an object a burst, then one every 5 minutes). A new reason is told at once and refills the burst;
# the latest text is told when a turn comes.
RETELL_S = 30.0
RETELL_BURST = 5


# what a core reason means on Kubernetes, where the core cannot know the keys
HINTS = {
    GPU_MEMORY_UNKNOWN: f"no label {keys.GFD_MEMORY} (GPU Feature Discovery) and no {keys.DEVICE_TOPOLOGY} "
    "annotation gives the node's GPU memory; requests by GPU memory cannot be placed there",
}


def describe(p: Pending) -> str:
    """The pending reason as the operator reads it: summary, each plugin's verdict, then what holds
    back the evictions it needs, each guard with the time it ends."""
    parts = [p.summary]
    for r in p.reasons:
        where = f" on {r.nodes} node(s)" if r.nodes else ""
        hint = HINTS.get(r.message)
        parts.append(f"{r.plugin}: {r.message}{where}" + (f" ({hint})" if hint else ""))
    parts += holds_text(p.holds, wall)
    if any(h.guard == NOT_PREEMPTIBLE for h in p.holds):
        parts.append(f'(not preemptible: {keys.PREEMPTIBLE}: "false" or PodGroup spec.preemptible: false)')
    return "; ".join(x for x in parts if x)


def served_by(b: Bind) -> str:
    """What serves a fractional request, as the Scheduled Event says it (`core.backends`)."""
    if b.backend == MIG_BACKEND and b.mig is not None:
        return f", GPU share served by MIG instance {b.mig.profile}@{b.mig.start}"
    if b.backend:
        return f", GPU share served by {b.backend}"
    return ""


class _Write:
    """One queued write: its object, its kind (an Event's reason), what it is (for the log), the call."""

    __slots__ = ("fn", "key", "kind", "what")

    def __init__(self, key: str, kind: str, what: str, fn: Callable[[], None]) -> None:
        self.key, self.kind, self.what, self.fn = key, kind, what, fn


class Writer(threading.Thread):
    """Writes explanations in the background: one queued write per object and kind, first words first.

    Each write is filed under its object (`key`: a pod, a PodGroup's or a Queue's status) and its
    kind (an Event's reason). A newer write of the same kind about an object takes the place of the
    one still queued for it, so that the queue holds one write per object that changed, however
    often its text changes; one of another kind (Preempting, then FailedScheduling; Scheduled, then
    Preempted) is queued behind it, so that every step is still said, in order. Writes about
    objects never written before (`first`) go before the rest. Found by a churn run (bench_churn
    --full): the reasons of 80 waiting gangs name the free GPUs, which move with every bind, so
    every cycle queued a new Event for each of their pods; the writer fell minutes behind, and the
    gangs made after the faults waited over a minute with no Event and no PodGroup status, their
    first word queued behind thousands of rewrites.

    While binds are under way (`pause()` ... `resume()`) it holds back, so that a burst of
    thousands of binds does not share the API server with thousands of Events. Past `capacity`
    queued writes, new ones are dropped (and counted); the caller says them again later.
    """

    def __init__(self, capacity: int = 10000, max_pause_s: float = 30.0) -> None:
        super().__init__(name="explain-writer", daemon=True)
        self.capacity = capacity
        self.cond = threading.Condition()
        self.tail: dict[str, _Write] = {}  # object -> its last queued write
        self.fresh: deque[_Write] = deque()  # about objects never written before
        self.again: deque[_Write] = deque()  # the rest
        self.busy = False  # a write is under way (flush waits for it)
        self.closed = False
        self.dropped = 0
        self.replaced = 0  # writes that took a queued one's place (each saves an API call)
        self.failed = 0
        self.go = threading.Event()
        self.go.set()
        self.max_pause_s = max_pause_s
        self.start()

    def submit(
        self, what: str, fn: Callable[[], None], key: str | None = None, kind: str = "", first: bool = False
    ) -> bool:
        """Queue `fn` (`what` names it in the log) under its object `key` (default: `what`) and
        `kind`; False if dropped. `first`: nothing was written about this object before."""
        k = what if key is None else key
        with self.cond:
            if self.closed:
                self.dropped += 1
                return False
            last = self.tail.get(k)
            if last is not None and last.kind == kind:
                last.what, last.fn = what, fn
                self.replaced += 1
                return True
            if self.pending() >= self.capacity:
                self.dropped += 1
                return False
            w = _Write(k, kind, what, fn)
            self.tail[k] = w
            (self.fresh if first and last is None else self.again).append(w)
            self.cond.notify_all()
            return True

    def pending(self) -> int:
        """Writes queued (one per object and kind that changed)."""
        return len(self.fresh) + len(self.again)

    def pause(self) -> None:
        self.go.clear()

    def resume(self) -> None:
        self.go.set()

    def _next(self) -> _Write | None:
        """The next write (first words first), or None once closed; the caller marks it done."""
        while True:
            with self.cond:
                while not self.pending() and not self.closed:
                    self.cond.wait()
                if self.closed:
                    return None
            self.go.wait(self.max_pause_s)  # not holding the lock: a newer text may take its place
            with self.cond:
                q = self.fresh or self.again
                if q:
                    w = q.popleft()
                    if self.tail.get(w.key) is w:
                        del self.tail[w.key]
                    self.busy = True
                    return w

    def run(self) -> None:
        while True:
            w = self._next()
            if w is None:
                return
            try:
                w.fn()
            except Exception as e:  # explanations must never stop scheduling
                self.failed += 1
                if self.failed <= 3 or self.failed % 100 == 0:
                    log.info("could not write %s: %s (%d failed so far)", w.what, e, self.failed)
            finally:
                with self.cond:
                    self.busy = False
                    self.cond.notify_all()

    def flush(self) -> None:
        """Wait until everything submitted so far is written (tests, shutdown)."""
        self.go.set()
        with self.cond:
            while self.pending() or self.busy:
                self.cond.wait()

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued for up to `timeout` seconds, drop the rest, stop."""
        self.go.set()
        deadline = time.monotonic() + timeout
        with self.cond:
            while (self.pending() or self.busy) and time.monotonic() < deadline:
                self.cond.wait(max(0.0, deadline - time.monotonic()))
            self.fresh.clear()
            self.again.clear()
            self.tail.clear()
            self.closed = True
            self.cond.notify_all()
        self.join(timeout=timeout)


class Explainer:
    def __init__(self, api: Api, max_events: int = 5000, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.max_events = max_events  # per cycle; the rest are said in a later cycle
        self.clock = clock
        # (key, uid) -> (the reason last told, re-tells left, when they were counted)
        self.told_at: dict[tuple[str, str], tuple[str, float, float]] = {}
        # (object key, uid) -> the last Event said of it: by uid too, for a pod remade under the same
        # name (a Job's or a training operator's, after an eviction) is a new pod to tell
        self.said: dict[tuple[str, str], str] = {}
        self.status: dict[str, Any] = {}
        self.scheduled: dict[str, tuple[str, str, str]] = {}  # PodGroup -> its last Scheduled condition
        self.transitions: dict[tuple[str, str], tuple[str, str]] = {}  # (PodGroup, type) -> (status, since)
        self.legacy_phases = False  # the PodGroup CRD knows only Pending and Running
        self.writer = Writer()
        self.native = NativeStatus(api, self.writer.submit)  # Kubernetes-native PodGroups

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def _event(
        self, key: str, obj: dict[str, Any], reason: str, message: str, warning: bool, budget: list[int]
    ) -> None:
        said = (key, _uid(obj))
        before = self.said.get(said)
        if before == reason + message or budget[0] <= 0:
            return
        now = self.clock()
        last = self.told_at.get(said)
        left = float(RETELL_BURST)
        if before is not None and last is not None and last[0] == reason:
            left = min(float(RETELL_BURST), last[1] + (now - last[2]) / RETELL_S)
            if left < 1.0:
                return  # the same reason again, too often: told when a turn comes
            left -= 1.0
        if self.writer.submit(
            f"an event on {key}",
            lambda: self.api.event(obj, reason, message, warning),
            key=f"event {key} {said[1]}",
            kind=reason,
            first=before is None,  # a pod's first word is not queued behind rewrites of others'
        ):
            self.said[said] = reason + message
            self.told_at[said] = (reason, left, now)
            budget[0] -= 1

    def _forget_gone(self, pod_objects: dict[str, dict[str, Any]]) -> None:
        """What was said of pods that are gone: forgotten once it outgrows the pods there are."""
        if len(self.said) <= 2 * len(pod_objects) + 256:
            return
        here = {(k, _uid(o)) for k, o in pod_objects.items()}
        self.said = {s: m for s, m in self.said.items() if s in here or "/" not in s[0]}
        self.told_at = {s: t for s, t in self.told_at.items() if s in self.said}

    def write(
        self,
        world: World,
        result: CycleResult | None,
        pod_objects: dict[str, dict[str, Any]],
        our_queues: set[str] = frozenset(),  # type: ignore[assignment]
        left_out: dict[str, dict[str, Any]] | None = None,
        insight: dict[str, str] | None = None,
        held: dict[str, tuple[Hold, ...]] | None = None,
        bound: Collection[str] | None = None,
        broken: dict[str, str] | None = None,
        told: Collection[str] = (),
    ) -> None:
        """`left_out`: the objects of `world.problems` that are not pods (nodes, queues), by label;
        `insight`: per waiting workload, its start forecast and what would start it now;
        `held`: preemptors whose binds wait for their victims (terminating, or refused by a
        PodDisruptionBudget), with why; `bound`: the pods really bound this cycle (default: every bind);
        `broken`: gangs placed but undone by the act side (a claim or bind the API refused), with why:
        without an Event their pods would wait with no word; `told`: evicted pods whose Preempted
        Event the eviction wrote already."""
        budget = [self.max_events]
        self._forget_gone(pod_objects)
        for key, msg in world.pod_problems.items():
            if key in pod_objects:
                self._event(key, pod_objects[key], "InvalidRequest", msg, True, budget)
        for lab, bad in (left_out or {}).items():
            text = world.problems.get(lab)
            if text is not None:
                self._event(lab, bad, "LeftOut", f"left out by Phalanx: {text}", True, budget)
        scheduled: dict[str, tuple[str, str, str]] = {}  # workload -> its Scheduled condition now
        for name, why in world.blocked.items():
            g = world.groups[name]
            text = "; ".join(why)
            short = name in world.waiting_pods  # only pods missing (being created, within the grace)
            if short and not world.waiting_pods[name]:
                text += " (still short after the creation grace: check minMember and the pods' group key)"
            for p in g.pods:
                if not p.node:
                    self._event(
                        p.key,
                        pod_objects.get(p.key, {"metadata": p.meta}),
                        "WaitingForPods" if short else "Unschedulable",
                        text,
                        not (short and world.waiting_pods[name]),
                        budget,
                    )
            scheduled[name] = ("False", "WaitingForPods" if short else "Invalid", text)
        for name, undone in (broken or {}).items():
            group = world.groups.get(name)
            for p in group.pods if group is not None else ():
                if not p.node and p.key in pod_objects:
                    self._event(
                        p.key,
                        pod_objects[p.key],
                        "BindFailed",
                        f"placed, then undone: {undone}",
                        True,
                        budget,
                    )
        if result is not None:
            for b in result.binds:
                gpus = f" GPUs {','.join(map(str, b.gpus))}" if b.gpus else ""
                obj = pod_objects.get(b.task)
                if obj is not None and (bound is None or b.task in bound):
                    said = f"Bound to {b.node}{gpus}{served_by(b)}"
                    self._event(b.task, obj, "Scheduled", said, False, budget)
                elif obj is not None and b.backend:  # a share waits for its GPU's reservation first
                    said = f"Assigned to {b.node}{gpus}{served_by(b)}; bound once that GPU is reserved"
                    self._event(b.task, obj, "GPUBackendChosen", said, False, budget)
            for ev in result.evictions:
                obj = pod_objects.get(ev.task)
                if obj is not None and ev.task not in told:
                    self._event(ev.task, obj, "Preempted", ev.reason, True, budget)
            for pend in result.pending:
                group = world.groups.get(pend.workload)
                if group is None:
                    continue
                text = describe(pend)
                if insight and pend.workload in insight:
                    text = f"{text}. {insight[pend.workload]}"
                for pod in group.pods:
                    if not pod.node and pod.key in pod_objects:
                        self._event(pod.key, pod_objects[pod.key], "FailedScheduling", text, True, budget)
                scheduled[pend.workload] = ("False", "Unschedulable", text)
        for name, holds in (held or {}).items():
            group = world.groups.get(name)
            if group is None or not holds:
                continue
            refused = any(h.guard in (DISRUPTION_BUDGET, RECLAIM_COST) for h in holds)
            text = "preempting: " + "; ".join(holds_text(holds, wall))
            for pod in group.pods:
                if not pod.node and pod.key in pod_objects:
                    reason = "FailedScheduling" if refused else "Preempting"
                    self._event(pod.key, pod_objects[pod.key], reason, text, refused, budget)
            scheduled[name] = ("False", "Preempting", text)
        done = bound if bound is not None else {b.task for b in (result.binds if result else [])}
        self._gangs(world, scheduled, done)
        self.native.write(world, scheduled, done, result)
        self._queues(world, our_queues)

    def _gangs(
        self, world: World, scheduled: dict[str, tuple[str, str, str]], bound: Collection[str]
    ) -> None:
        """Phase, member counts and conditions of each of our PodGroups, written when they change."""
        for name, pg in world.pod_groups.items():
            if not keys.is_ours(pg):
                continue  # other schedulers' PodGroups belong to their controllers
            st = gang_status(world, name, bound)
            if st is None:
                continue
            key = f"pg/{name}"
            cond = scheduled.get(name)
            if st.placed:
                extra = f"; {cond[2]}" if cond is not None and name not in world.blocked else ""
                cond = ("True", "Scheduled", f"gang placed: {st.text}{extra}")
            elif cond is None and name not in world.groups:  # the PodGroup has no pods (yet, or left)
                cond = ("False", "WaitingForPods", f"PodGroup {name}: waiting for {st.missing} more pod(s)")
            elif cond is None:  # not looked at this cycle: it keeps what it was told
                cond = self.scheduled.get(key, ("False", "Pending", "waiting for its turn"))
            self.scheduled[key] = cond
            running = ("True" if st.phase == "Running" else "False", st.phase, st.text)
            self._podgroup(pg, st.phase, st.counts(), [("Scheduled", *cond), ("Running", *running)])

    def _podgroup(
        self, pg: dict[str, Any], phase: str, counts: dict[str, int], conds: list[tuple[str, str, str, str]]
    ) -> None:
        meta = pg.get("metadata") or {}
        name, ns = str(meta.get("name")), str(meta.get("namespace"))
        key = f"pg/{ns}/{name}/{meta.get('uid', '')}"  # a PodGroup made again under the same name is new
        same = (phase, tuple(sorted(counts.items())), tuple(conds))
        if self.status.get(key) == same:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = []
        for kind, status, reason, message in conds:
            since = self.transitions.get((key, kind))
            if (
                since is None or since[0] != status
            ):  # the time the status last changed, as Kubernetes keeps it
                since = self.transitions[(key, kind)] = (status, now)
            conditions.append(_condition(kind, status, reason, message, since[1]))
        body: dict[str, Any] = {"phase": phase, **counts, "conditions": conditions}
        if self.writer.submit(
            f"the status of {key}", lambda: self._patch_podgroup(name, ns, body), first=key not in self.status
        ):
            self.status[key] = same

    def _patch_podgroup(self, name: str, ns: str, body: dict[str, Any]) -> None:
        """Patch a PodGroup's status; a CRD from before the phases Scheduled, Succeeded and Failed (it
        knows only Pending and Running) answers 422: then the phase is said in its two words."""
        if not self.legacy_phases:
            try:
                self.api.patch_status(OUR_PODGROUPS, name, ns, body)
                return
            except ApiError as e:
                if e.code != 422 or body["phase"] in ("Pending", "Running"):
                    raise
                self.legacy_phases = True
                log.warning(
                    "the PodGroup CRD installed knows only the phases Pending and Running (%s); "
                    "apply this version's CRD to see Scheduled, Succeeded and Failed",
                    e.message,
                )
        legacy = dict(body, phase="Pending" if body["phase"] == "Pending" else "Running")
        self.api.patch_status(OUR_PODGROUPS, name, ns, legacy)

    def _queues(self, world: World, ours: set[str]) -> None:
        s = world.snapshot
        if world.tree is None or not ours:
            return
        fair = _fair(world)
        for name, why in world.queue_problems.items():
            if name in ours:
                self._queue_status(name, {"conditions": [_condition("Valid", "False", "Invalid", why)]})
        for name in world.tree.queues:
            if name not in ours:
                continue
            use = s.usage_of(name)
            pend = np.maximum(s.queue_pending.get(name, np.zeros(3)), 0)
            share = fair.get(name, np.zeros(3))
            body = {
                "allocated": _res(use),
                "requested": _res(use + pend),
                "fairShare": _res(share),
                "conditions": [_condition("Valid", "True", "Valid", "in the queue tree")],
            }
            self._queue_status(name, body)

    def _queue_status(self, name: str, body: dict[str, Any]) -> None:
        key = f"q/{name}"
        same = (
            {k: v for k, v in body.items() if k != "conditions"},
            [(c["status"], c["message"]) for c in body.get("conditions", [])],
        )
        if self.status.get(key) == same:
            return
        if self.writer.submit(
            f"the status of queue {name}",
            lambda: self.api.patch_status(OUR_QUEUES, name, None, body),
            first=key not in self.status,
        ):
            self.status[key] = same


def _condition(kind: str, status: str, reason: str, message: str, since: str = "") -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": since or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _res(v: np.ndarray) -> dict[str, str]:
    return {"gpu": f"{v[GPU] / 1000:g}", "cpu": f"{v[CPU] / 1000:g}", "memory": f"{int(v[MEM])}Mi"}


def _fair(world: World) -> dict[str, np.ndarray]:
    s = world.snapshot
    assert world.tree is not None
    return s.fair_shares(world.tree)


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")
