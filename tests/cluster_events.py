"""A cluster's API objects changing the way a live one changes, for the kept and patched worlds' tests.

Pods arrive, are bound by our cycle or fail to be, start, end, are deleted; other schedulers' pods
come and go; nodes flip readiness or change labels; a queue's quota changes. Each change gives the
object a new resourceVersion, as the API server does.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from dra_kube import device_classes, nic_device, slice_
from kube_objects import node, pod, pod_group, queue
from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import CycleResult
from phalanx.core.profile import Profile
from phalanx.k8s import keys
from phalanx.k8s.read.carry import Carry
from phalanx.k8s.read.claims import DraObjects
from phalanx.k8s.read.devices import binding_notes, encode_plan
from phalanx.k8s.read.world import World

NOW = 1.8e9


class Cluster:
    """API objects as a watch cache would hold them, each change a new resourceVersion."""

    def __init__(
        self, rng: random.Random, nodes: int, queues: bool, dra: bool = False, pools: tuple[str, ...] = ()
    ) -> None:
        self.rng = rng
        self.rv = 0
        self.pools = pools  # scheduling shards: node pools nodes and pods name ("" : none), at random
        self.nodes = [self._stamp(node(f"n{i}", gpus=rng.choice([0, 4, 8]))) for i in range(nodes)]
        for nd in self.nodes:
            self._pool(nd)
        self.pods: list[dict[str, Any]] = []
        self.groups: list[dict[str, Any]] = []
        self.queues = [self._stamp(queue("team-a", 16)), self._stamp(queue("team-b", 8))] if queues else []
        self.serial = 0
        # DRA: DraNet's two RDMA NICs published on every node, and the claims allocated there
        self.dra = dra
        self.classes: list[dict[str, Any]] = []
        self.slices: list[dict[str, Any]] = []
        if dra:
            self.classes = [self._stamp(c) for c in device_classes() if c["metadata"]["name"] == "dranet"]
            for n in (nd["metadata"]["name"] for nd in self.nodes):
                nics = [nic_device(k, k) for k in range(2)]
                self.slices.append(self._stamp(slice_(f"{n}-nic", "dra.net", n, nics)))
        self.claims: list[dict[str, Any]] = []

    def dra_objects(self) -> DraObjects:
        return DraObjects(self.classes, self.slices, self.claims)

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{meta.get('namespace', '')}-{meta['name']}-{self.rv}")
        meta["resourceVersion"] = str(self.rv)
        return obj

    def changed(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def new_pod(self, **kw: Any) -> dict[str, Any]:
        self.serial += 1
        p = self._stamp(pod(f"p{self.serial}", **kw))
        self._pool(p)
        self.pods.append(p)
        return p

    def _pool(self, obj: dict[str, Any]) -> None:
        """With pools: the object names one of them, or none."""
        if self.pools:
            pool = self.rng.choice([*self.pools, ""])
            if pool:
                obj["metadata"].setdefault("labels", {})["phalanx.io/node-pool"] = pool

    def event(self) -> str:
        """One random change; returns what it was (for the failure message)."""
        r, rng = self.rng.random(), self.rng
        ours = [p for p in self.pods if p["spec"]["schedulerName"] == "phalanx"]
        bound = [p for p in self.pods if p["spec"].get("nodeName")]
        if r < 0.25:
            annotations = {"phalanx.io/queue": rng.choice(["team-a", "team-b"])} if self.queues else {}
            self.new_pod(
                gpus=rng.choice([0, 1, 1, 2, 4]), priority=rng.choice([0, 0, 10]), annotations=annotations
            )
            return "pod"
        if r < 0.29:
            self.new_pod(annotations={"gpu-fraction": rng.choice(["0.25", "0.5"])})
            return "share"
        if r < 0.34:
            name = f"g{self.serial}"
            self.groups.append(self._stamp(pod_group(name, 2)))
            for _ in range(2):
                self.new_pod(gpus=2, labels={"phalanx.io/pod-group": name})
            return "gang"
        if r < 0.40:
            n = rng.choice(self.nodes)["metadata"]["name"]
            self.new_pod(gpus=rng.choice([0, 1]), scheduler="default-scheduler", node=n)
            return "foreign pod"
        if r < 0.43:  # ours, but pinned to a node by its creator: no devices noted
            n = rng.choice(self.nodes)["metadata"]["name"]
            self.new_pod(gpus=1, node=n)
            return "pinned pod"
        if r < 0.52 and bound:
            p = rng.choice(bound)
            self.pods.remove(p)
            self.rv += 1  # the watch cache's generation moves on a deletion too
            return f"deleted {p['metadata']['name']}"
        if r < 0.58 and bound:
            p = rng.choice(bound)
            p["metadata"]["deletionTimestamp"] = "2026-11-29T10:05:00Z"
            self.changed(p)
            return f"deleting {p['metadata']['name']}"
        if r < 0.68 and bound:
            p = rng.choice(bound)
            p["status"] = {"phase": "Running", "startTime": "2026-11-29T10:01:00Z"}
            self.changed(p)
            return f"started {p['metadata']['name']}"
        if r < 0.74 and ours:
            p = rng.choice(ours)
            p["metadata"]["labels"]["touched"] = str(self.rv)  # a new version, nothing we read changed
            self.changed(p)
            return f"touched {p['metadata']['name']}"
        if r < 0.82:
            nd = rng.choice(self.nodes)
            cond = nd["status"]["conditions"][0]
            cond["status"] = "False" if cond["status"] == "True" else "True"
            self.changed(nd)
            return f"readiness {nd['metadata']['name']}"
        if r < 0.86:
            nd = rng.choice(self.nodes)
            nd["metadata"]["labels"]["rack"] = str(rng.randint(0, 3))
            if self.pools:  # into another pool, or out of any
                nd["metadata"]["labels"].pop("phalanx.io/node-pool", None)
                self._pool(nd)
            self.changed(nd)
            return f"relabelled {nd['metadata']['name']}"
        if r < 0.90:
            nd = rng.choice(self.nodes)
            nd["status"]["conditions"][0]["lastHeartbeatTime"] = str(self.rv)  # nothing we read
            self.changed(nd)
            return f"heartbeat {nd['metadata']['name']}"
        if r < 0.93 and self.queues:
            q = rng.choice(self.queues)
            q["spec"]["resources"]["gpu"]["quota"] = rng.choice([4, 8, 16])
            self.changed(q)
            return f"quota {q['metadata']['name']}"
        if r < 0.97 and self.groups:
            return self._group_event(rng.choice(self.groups))
        if r < 0.99 and self.dra:
            return self._claim_event()
        return "nothing"

    def _group_event(self, pg: dict[str, Any]) -> str:
        """A PodGroup changed: its minimum, its minimum made unreadable, or the object deleted."""
        name, r = pg["metadata"]["name"], self.rng.random()
        if r < 0.2:
            self.groups.remove(pg)
            self.rv += 1
            return f"deleted PodGroup {name}"
        pg["spec"]["minMember"] = "many" if r < 0.35 else self.rng.choice([1, 2, 3])
        self.changed(pg)
        return f"PodGroup {name} minMember {pg['spec']['minMember']}"

    def _claim_event(self) -> str:
        """DRA: a pod of ours whose claim is not made yet, or another scheduler's claim allocated on a
        node's NIC (or that claim deallocated)."""
        if self.rng.random() < 0.4:
            p = self.new_pod(gpus=1)
            p["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimTemplateName": "one-nic"}]
            return f"pod {p['metadata']['name']} with a claim"
        if self.claims and self.rng.random() < 0.4:
            gone = self.claims.pop(self.rng.randrange(len(self.claims)))
            self.rv += 1
            return f"deleted claim {gone['metadata']['name']}"
        n = self.rng.choice(self.nodes)["metadata"]["name"]
        self.serial += 1
        result = {"request": "nic", "driver": "dra.net", "pool": n, "device": f"nic-{self.rng.randrange(2)}"}
        on = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}
        alloc = {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [on]}}
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"c{self.serial}", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet"}}]}},
            "status": {"allocation": alloc, "reservedFor": [{"resource": "pods", "name": "x", "uid": "x"}]},
        }
        self.claims.append(self._stamp(claim))
        return f"claim on {n}"

    def bind(self, world: World, binds: list[Any], fail: float) -> None:
        """What our executor does with a cycle's binds; some fail (the pod keeps no node), and some
        gangs get only their plan written (a restart cut the binds short)."""
        by_key = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in self.pods}
        gangs: dict[str, list[Any]] = {}
        for b in binds:
            gangs.setdefault(b.workload, []).append(b)
        planned: set[str] = set()
        for members in gangs.values():
            if len(members) > 1 and self.rng.random() < 0.3:
                uids = {b.task: by_key[b.task]["metadata"]["uid"] for b in members}
                holder = by_key[members[0].task]
                holder["metadata"]["annotations"][keys.GANG_PLAN] = encode_plan(members, uids)
                self.changed(holder)
                planned |= {b.task for b in members}
        for b in binds:
            p = by_key.get(b.task)
            if p is None or b.task in planned or self.rng.random() < fail:
                continue
            p["spec"]["nodeName"] = b.node
            p["metadata"]["annotations"].update(binding_notes(b))
            self.changed(p)


def decide_alike(
    scratch: World, other: World, profile: Profile, step: int, carry: Carry, now: float = NOW
) -> CycleResult:
    """One cycle of the core on a world built from scratch and on a kept or patched one, applied to
    both: the same binds, victims and waiting workloads. Returns the second's decisions."""
    a = run_cycle(scratch.snapshot, profile, now, np.random.default_rng(step), apply=True)
    b = run_cycle(other.snapshot, profile, now, np.random.default_rng(step), apply=True)
    if b.binds or b.evictions:
        carry.applied = True  # as the scheduler does
    assert [(x.task, x.node, x.gpus) for x in a.binds] == [(x.task, x.node, x.gpus) for x in b.binds]
    # the same victims; the order they are evicted in may differ (each entry lists its tasks in the
    # order they were recorded, by node from scratch, by bind when kept)
    assert sorted((x.task, x.by) for x in a.evictions) == sorted((x.task, x.by) for x in b.evictions)
    assert sorted(p.workload for p in a.pending) == sorted(p.workload for p in b.pending)
    return b
