"""Status written on Kubernetes-native PodGroups (scheduling.k8s.io) that hold our pods, and on
the CompositePodGroups (1.37) above them.

Two conditions, in the API's own words. The scheduled one is `PodGroupScheduled` on a v1alpha2
PodGroup (1.36: True while the gang is placed; False with reason `Unschedulable` while it waits
for room or for its pods, and the start forecast when there is one, or `SchedulerError` when its
spec cannot be honoured), `PodGroupInitiallyScheduled` on a v1beta1 one and
`CompositePodGroupInitiallyScheduled` on a CompositePodGroup (1.37: the same, except that once
True it stays True: a preemption is said by the other condition). `DisruptionTarget` (True,
reason `PreemptionByScheduler`, when all its placed pods are preempted; False again once it is
placed anew). Conditions of other types on the object are kept. Written only when they change,
through the explainer's background writer. Groups without our pods belong to another scheduler.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from phalanx.core.decisions import CycleResult
from phalanx.k8s.client.api import Api
from phalanx.k8s.read.lifecycle import gang_status
from phalanx.k8s.read.world import World, native_objects

SCHEDULED = "PodGroupScheduled"  # v1alpha2 (1.36)
INITIALLY = "PodGroupInitiallyScheduled"  # v1beta1 (1.37)
COMPOSITE = "CompositePodGroupInitiallyScheduled"
DISRUPTION = "DisruptionTarget"
OURS = (SCHEDULED, INITIALLY, COMPOSITE, DISRUPTION)


def scheduled_type(obj: dict[str, Any]) -> str:
    """The object's scheduled condition, by kind and version; its value sticks at True unless 1.36's."""
    if obj.get("kind") == "CompositePodGroup":
        return COMPOSITE
    return SCHEDULED if str(obj.get("apiVersion", "")).endswith("/v1alpha2") else INITIALLY


class NativeStatus:
    def __init__(self, api: Api, submit: Any) -> None:
        self.api = api
        self.submit = submit  # Writer.submit: (what, fn, first=...) -> bool
        self.said: dict[str, tuple[tuple[str, str, str], ...]] = {}  # PodGroup uid -> conditions written
        self.last: dict[str, tuple[str, str, str]] = {}  # workload -> its last PodGroupScheduled
        self.disrupted: dict[str, str] = {}  # PodGroup uid -> why it was preempted
        self.since: dict[tuple[str, str], tuple[str, str]] = {}  # (uid, type) -> (status, when)

    def write(
        self,
        world: World,
        scheduled: dict[str, tuple[str, str, str]],
        bound: Collection[str],
        result: CycleResult | None,
    ) -> None:
        """`scheduled`: the explainer's (status, reason, message) per workload this cycle."""
        evictions = result.evictions if result is not None else []
        # which group each pod is in: needed only when something was evicted
        owner = {p.key: name for name, g in world.groups.items() for p in g.pods} if evictions else {}
        preempted: dict[str, str] = {}
        evicted: dict[str, set[str]] = {}
        for ev in evictions:
            if ev.task in owner:
                preempted.setdefault(owner[ev.task], ev.reason)
                evicted.setdefault(owner[ev.task], set()).add(ev.task)
        for name in list(preempted):  # the group goes (DisruptionTarget) only if all its placed pods go
            placed = {p.key for p in world.groups[name].pods if p.node}
            if not placed <= evicted[name]:
                del preempted[name]
        for name in sorted(world.native_groups):
            objs = native_objects(world.groups[name])
            if not objs:
                continue
            st = gang_status(world, name, bound)
            cond = scheduled.get(name)
            if name in preempted:
                cond = ("False", "Unschedulable", f"preempted: {preempted[name]}")
            elif st is not None and st.placed:
                cond = ("True", "Scheduled", f"gang placed: {st.text}")
            elif cond is not None:
                reason = "SchedulerError" if cond[1] == "Invalid" else "Unschedulable"
                cond = ("False", reason, cond[2])
            else:
                cond = self.last.get(name, ("False", "Unschedulable", "waiting for its turn"))
            self.last[name] = cond
            for obj in objs:
                uid = str((obj.get("metadata") or {}).get("uid", ""))
                if name in preempted:
                    self.disrupted[uid] = preempted[name]
                kind = scheduled_type(obj)
                mine = cond
                if kind != SCHEDULED and cond[0] != "True" and self._was_scheduled(obj, uid, kind):
                    mine = ("True", "Scheduled", "placed once: a preemption is said by DisruptionTarget")
                conds = [(kind, *mine)]
                if uid in self.disrupted:
                    if cond[0] == "True":
                        conds.append((DISRUPTION, "False", "Scheduled", "placed again after its preemption"))
                        del self.disrupted[uid]
                    else:
                        conds.append((DISRUPTION, "True", "PreemptionByScheduler", self.disrupted[uid]))
                self._patch(obj, uid, tuple(conds))

    def _was_scheduled(self, obj: dict[str, Any], uid: str, kind: str) -> bool:
        """An InitiallyScheduled condition already True, by us or on the object: it stays True."""
        if self.since.get((uid, kind), ("",))[0] == "True":
            return True
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c.get("type") == kind and c.get("status") == "True" for c in conds)

    def _patch(self, obj: dict[str, Any], uid: str, conds: tuple[tuple[str, str, str, str], ...]) -> None:
        key = tuple((t, s, m) for t, s, _, m in conds)
        if self.said.get(uid) == key:
            return
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        kept = [c for c in status.get("conditions") or [] if c.get("type") not in OURS]
        old = {c.get("type"): c for c in status.get("conditions") or []}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        out = []
        for kind, st, reason, message in conds:
            since = self.since.get((uid, kind))
            if since is None and old.get(kind, {}).get("status") == st:
                since = (st, str(old[kind].get("lastTransitionTime") or now))
            if since is None or since[0] != st:
                since = (st, now)
            self.since[(uid, kind)] = since
            c = {"type": kind, "status": st, "reason": reason, "message": message[:1024]}
            c["lastTransitionTime"] = since[1]
            if meta.get("generation") is not None:
                c["observedGeneration"] = meta["generation"]
            out.append(c)
        body = {"conditions": kept + out}
        plural = "compositepodgroups" if obj.get("kind") == "CompositePodGroup" else "podgroups"
        kind_key = f"{obj.get('apiVersion')}/{plural}"
        name, ns = str(meta.get("name")), str(meta.get("namespace"))
        if self.submit(
            f"the status of {obj.get('kind') or 'PodGroup'} {ns}/{name}",
            lambda: self.api.patch_status(kind_key, name, ns, body),
            first=uid not in self.said,
        ):
            self.said[uid] = key
