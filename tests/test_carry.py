"""The carried snapshot equals one built from scratch, after random event sequences (issue 25).

Each step changes the cluster the way a live one changes (pods arrive, are bound by our cycle or
fail to be, start, end, are deleted; other schedulers' pods come and go; nodes flip readiness or
change labels; a queue's quota changes), then builds the world twice: from scratch, and with the
scheduler's `Carry`. Their snapshots must hold the same state and the core must decide the same.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest

from kube_objects import node, pod, pod_group, queue
from phalanx.core.cycle import run_cycle
from phalanx.core.snapshot_diff import differences
from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.carry import Carry
from phalanx.k8s.read.claims import DraObjects
from phalanx.k8s.read.devices import binding_notes, encode_plan
from phalanx.k8s.read.translations import Translations
from phalanx.k8s.read.world import World, build_world
from phalanx.profiles import load_profile

NOW = 1.8e9


class Cluster:
    """API objects as a watch cache would hold them, each change a new resourceVersion."""

    def __init__(self, rng: random.Random, nodes: int, queues: bool) -> None:
        self.rng = rng
        self.rv = 0
        self.nodes = [self._stamp(node(f"n{i}", gpus=rng.choice([0, 4, 8]))) for i in range(nodes)]
        self.pods: list[dict[str, Any]] = []
        self.groups: list[dict[str, Any]] = []
        self.queues = [self._stamp(queue("team-a", 16)), self._stamp(queue("team-b", 8))] if queues else []
        self.serial = 0

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
        self.pods.append(p)
        return p

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
        return "nothing"

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


def _worlds(c: Cluster, cfg: AdapterConfig, memo: Translations, carry: Carry) -> tuple[World, World]:
    args = (c.nodes, c.pods, c.groups, c.queues, cfg, NOW)
    scratch = build_world(*copy.deepcopy(args[:4]), cfg, NOW, Translations())
    carried = build_world(*args, memo=memo, carry=carry, stamp=c.rv)  # rv: the objects' version
    return scratch, carried


@pytest.mark.parametrize(
    ("seed", "profile_name"), [(k, "") for k in range(6)] + [(k, "las-exact") for k in range(3)]
)
def test_the_carried_snapshot_is_the_snapshot_built_from_scratch(seed: int, profile_name: str) -> None:
    """`las-exact` orders by LAS `within: queue`, which keeps each workload's place in its entry."""
    rng = random.Random(seed)
    c = Cluster(rng, nodes=rng.choice([3, 6, 10]), queues=seed % 2 == 1)
    cfg = AdapterConfig()
    profile = load_profile(profile_name or cfg.profile)
    memo, carry = Translations(), Carry()
    history: list[str] = []
    kept = 0
    memory_a: dict[str, Any] = {}
    memory_b: dict[str, Any] = {}  # the repeat guard's memory, which the scheduler keeps across cycles
    for step in range(60):
        quiet = rng.random() < 0.25  # a cycle with nothing new: last cycle's world may stand
        history += ["(none)"] if quiet else [c.event() for _ in range(rng.randint(1, 4))]
        scratch, carried = _worlds(c, cfg, memo, carry)
        kept += carry.snap is carried.snapshot and carry.rebuilt < step + 1
        diff = differences(scratch.snapshot, carried.snapshot)
        assert not diff, f"seed {seed} step {step} after {history[-6:]}:\n" + "\n".join(diff)
        assert scratch.unfinished == carried.unfinished
        assert scratch.stale_intents == carried.stale_intents
        assert scratch.blocked == carried.blocked
        scratch.snapshot.evicted_for, carried.snapshot.evicted_for = memory_a, memory_b
        a = run_cycle(scratch.snapshot, profile, NOW, np.random.default_rng(step), apply=True)
        b = run_cycle(carried.snapshot, profile, NOW, np.random.default_rng(step), apply=True)
        if b.binds or b.evictions:
            carry.applied = True  # as the scheduler does
        assert [(x.task, x.node, x.gpus) for x in a.binds] == [(x.task, x.node, x.gpus) for x in b.binds]
        # the same victims; the order they are evicted in may differ (each entry lists its tasks in the
        # order they were recorded, by node from scratch, by bind when kept)
        assert sorted((x.task, x.by) for x in a.evictions) == sorted((x.task, x.by) for x in b.evictions)
        assert sorted(p.workload for p in a.pending) == sorted(p.workload for p in b.pending)
        c.bind(carried, b.binds, fail=0.2)
    assert carry.rebuilt < 60, "the snapshot was never kept"
    assert kept > 10


def _settled(seed: int, nodes: int, events: int) -> tuple[Cluster, AdapterConfig, Translations, Carry]:
    """A cluster after `events` random events, without queues, and a fresh carry to read it with."""
    c = Cluster(random.Random(seed), nodes=nodes, queues=False)
    for _ in range(events):
        c.event()
    return c, AdapterConfig(), Translations(), Carry()


def test_a_quiet_cycle_records_no_node() -> None:
    """Nothing changed since the last cycle: no node is recorded anew, the same snapshot is used."""
    c, cfg, memo, carry = _settled(seed=1, nodes=20, events=40)
    first = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, carry=carry)
    again = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, carry=carry)
    assert again.snapshot is first.snapshot
    assert carry.recorded == 0 and carry.rebuilt == 1
    c.new_pod(gpus=1, scheduler="default-scheduler", node="n3")
    build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, carry=carry)
    assert carry.recorded == 1 and carry.rebuilt == 1  # one node changed: one node recorded


def test_dra_objects_turn_the_carry_off_and_it_starts_afresh_after() -> None:
    """Claims hold devices across nodes: with any DRA object the snapshot is built each cycle, and
    the one kept from before is not used again once they are gone."""
    c, cfg, memo, carry = _settled(seed=2, nodes=4, events=20)
    first = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, carry=carry)
    dra = DraObjects(classes=[{"metadata": {"name": "gpu.example.com"}, "spec": {}}])
    with_dra = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, dra=dra, carry=carry)
    assert carry.snap is None and with_dra.snapshot is not first.snapshot
    after = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, carry=carry)
    assert after.snapshot is not first.snapshot and carry.snap is after.snapshot


def test_the_same_inputs_after_a_cycle_that_changed_nothing_give_the_same_world() -> None:
    """Nothing new since a cycle that bound and evicted nothing: last cycle's world stands (its clock
    parts brought up to date), unless the cycle applied decisions or the world read the clock."""
    rng = random.Random(4)
    c = Cluster(rng, nodes=5, queues=False)
    for _ in range(30):
        c.event()
    c.new_pod(gpus=1, scheduler="default-scheduler", node="n1")
    cfg, memo, carry = AdapterConfig(), Translations(), Carry()
    first = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, carry=carry, stamp=c.rv)
    again = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW + 60, memo, carry=carry, stamp=c.rv)
    assert again is first and carry.reused == 1
    scratch = build_world(
        *copy.deepcopy((c.nodes, c.pods, c.groups, c.queues)), cfg, NOW + 60, Translations()
    )
    assert differences(scratch.snapshot, again.snapshot) == []  # attained service counted to NOW + 60
    carry.applied = True  # the cycle bound or evicted something: read again
    third = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, carry=carry, stamp=c.rv)
    assert third is not first and carry.reused == 1
    victim = next(p for p in c.pods if p["spec"].get("nodeName"))
    victim["metadata"]["deletionTimestamp"] = "evicted"  # a value the read cannot parse: no known end
    c.changed(victim)
    bound = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, carry=carry, stamp=c.rv)
    assert bound.time_bound  # gone by "now" at the latest: the clock was read
    assert (
        build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, carry=carry, stamp=c.rv) is not bound
    )
