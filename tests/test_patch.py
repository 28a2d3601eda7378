"""The world patched from the change feed equals one built from scratch, after random event sequences.

The cluster's objects go through a real watch cache `Store` (each change an event, as an informer
applies it); each cycle reads the store's change feed since the last read and patches the kept world
(`phalanx.k8s.read.patch`), or builds it anew where it cannot. Its snapshot, leftovers and blocked
groups must be those of a world built from scratch, and the core must decide the same on both.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest

from cluster_events import NOW, Cluster, decide_alike
from kube_objects import node, pod_group
from phalanx.core.cycle import run_cycle
from phalanx.core.snapshot_diff import differences
from phalanx.k8s.client.cache import Store, object_key
from phalanx.k8s.client.kinds import (
    DEVICE_CLASSES,
    OUR_POD_GROUPS,
    OUR_QUEUES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.loop.service import AttainedService
from phalanx.k8s.read.carry import Carry
from phalanx.k8s.read.gather import gather
from phalanx.k8s.read.patch import Feed
from phalanx.k8s.read.pods import timestamp
from phalanx.k8s.read.shard import ShardFilter
from phalanx.k8s.read.translations import Translations
from phalanx.k8s.read.world import World, build_world
from phalanx.profiles import load_profile
from phalanx.spec.shards import ShardOf, parse_shards


class Watched:
    """The cluster's objects as an informer keeps them in a store: every change an event."""

    def __init__(self, c: Cluster, gate: ShardFilter | None = None) -> None:
        self.c = c
        self.gate = gate  # a scheduling shard's cache: only what the shard keeps
        self.store = Store(gate=gate)
        self.last: dict[tuple[str, str], str] = {}
        if gate is not None:  # a joining node's pods are listed from the cluster as it is now
            gate.pods_on = lambda n: [copy.deepcopy(p) for p in c.pods if p["spec"].get("nodeName") == n]
            for kind, _ in self.kinds():  # the first lists: empty, the pods after the nodes
                self.store.replace(kind, [])

    def kinds(self) -> tuple[tuple[str, list[dict[str, Any]]], ...]:
        return (
            ("nodes", self.c.nodes),
            ("pods", self.c.pods),
            (OUR_POD_GROUPS.key, self.c.groups),
            (OUR_QUEUES.key, self.c.queues),
            (DEVICE_CLASSES.key, self.c.classes),
            (RESOURCE_SLICES.key, self.c.slices),
            (RESOURCE_CLAIMS.key, self.c.claims),
        )

    def sync(self) -> None:
        now: dict[tuple[str, str], dict[str, Any]] = {}
        for kind, objs in self.kinds():
            for o in objs:
                now[(kind, object_key(o))] = o
        for (kind, key), o in now.items():
            rv = str(o["metadata"]["resourceVersion"])
            if self.last.get((kind, key)) != rv:
                event = "ADDED" if (kind, key) not in self.last else "MODIFIED"
                self.store.apply(kind, event, copy.deepcopy(o))  # the store's copy, not the test's
                self.last[(kind, key)] = rv
        for kind, key in [k for k in self.last if k not in now]:
            ns, _, name = key.rpartition("/")
            self.store.apply(
                kind, "DELETED", {"metadata": {"namespace": ns, "name": name} if ns else {"name": name}}
            )
            del self.last[(kind, key)]


def _patched(w: Watched, cfg: AdapterConfig, memo: Translations, carry: Carry, now: float = NOW) -> World:
    store = w.store
    at = store.generation
    changes = store.changes(carry.at) if carry.at is not None else None
    feed = Feed(changes, lambda k: store.get("pods", k), lambda n: store.get("nodes", n), store.get)
    split = w.gate.split() if w.gate is not None else None
    world = gather(store.items, False, cfg, split=split).world(cfg, now, memo, carry, stamp=at, feed=feed)
    carry.at = at
    return world


def _same_world(scratch: World, patched: World, where: str) -> None:
    diff = differences(scratch.snapshot, patched.snapshot)
    assert not diff, where + "\n".join(diff)
    assert scratch.unfinished == patched.unfinished, where
    assert scratch.stale_intents == patched.stale_intents, where
    assert scratch.blocked == patched.blocked, where
    assert scratch.waiting_pods == patched.waiting_pods, where
    assert scratch.pods == patched.pods, where
    assert scratch.ended == patched.ended, where
    assert scratch.pod_problems == patched.pod_problems, where
    assert scratch.problems == patched.problems, where
    assert scratch.native_groups == patched.native_groups, where
    assert scratch.pod_groups == patched.pod_groups, where
    assert scratch.group_claims == patched.group_claims, where


def _scratch(c: Cluster, cfg: AdapterConfig, now: float = NOW, w: Watched | None = None) -> World:
    """The world built from scratch from a copy of the cluster's objects (a shard's: listed afresh
    through a new gate, as its scheduler does at start; its cache, kept by events, must agree)."""
    if w is not None and w.gate is not None:
        fresh = ShardFilter(w.gate.shard, w.gate.scheduler_name)
        store = Store(gate=fresh)
        for kind, objs in w.kinds():
            store.replace(kind, copy.deepcopy(objs))
        for kind in w.store.objects:
            assert {object_key(o) for o in store.items(kind)} == set(w.store.table(kind)), kind
        assert fresh.split() == w.gate.split()
        return gather(store.items, False, cfg, split=fresh.split()).world(cfg, now)
    objs = copy.deepcopy((c.nodes, c.pods, c.groups, c.queues))
    return build_world(*objs, cfg, now, Translations(), dra=copy.deepcopy(c.dra_objects()))


@pytest.mark.parametrize(
    ("seed", "profile_name", "dra", "sharded"),
    [(k, "", False, False) for k in range(8)]
    + [(k, "las-exact", False, False) for k in range(3)]
    + [(k, "", True, False) for k in range(3)]
    + [(k, "", False, True) for k in range(3)],
)
def test_the_patched_world_is_the_world_built_from_scratch(
    seed: int, profile_name: str, dra: bool, sharded: bool
) -> None:
    """DRA: NICs published on every node, claims allocated and deleted, pods of ours with claims.
    Sharded: nodes and pods name pools p0, p1 or none at random (nodes are relabelled), read by the
    shard that owns p0 and what names none, through its cache's gate."""
    rng = random.Random(1000 + seed)
    pools = ("p0", "p1") if sharded else ()
    c = Cluster(rng, nodes=rng.choice([3, 6, 10]), queues=seed % 2 == 1, dra=dra, pools=pools)
    shard = None
    if sharded:
        doc = {"shards": [{"name": "a", "pools": ["p0"], "default": True}, {"name": "b", "pools": ["p1"]}]}
        every = parse_shards(doc, "shards.yaml")
        shard = ShardOf(every, every.get("a"))
    w = Watched(c, ShardFilter(shard, "phalanx") if shard is not None else None)
    cfg = AdapterConfig(shard=shard)
    profile = load_profile(profile_name or cfg.profile)
    memo, carry = Translations(), Carry()
    history: list[str] = []
    memory_a: dict[str, Any] = {}
    memory_b: dict[str, Any] = {}
    # earlier runs' service, as the scheduler adds it: over a fresh snapshot every cycle (every
    # workload looked at) and over the patched one (only those whose run changed)
    service_a, service_b = AttainedService(), AttainedService()
    for step in range(80):
        now = NOW + 7.0 * step  # the clock moves: each run's service is read from it
        quiet = rng.random() < 0.2
        history += ["(none)"] if quiet else [c.event() for _ in range(rng.randint(1, 4))]
        w.sync()
        patched_before = carry.patched
        scratch = _scratch(c, cfg, now, w)
        patched = _patched(w, cfg, memo, carry, now)
        service_a.apply(scratch.snapshot, now)
        service_b.apply(patched.snapshot, now)
        how = "patched" if carry.patched > patched_before else "built"
        _same_world(scratch, patched, f"seed {seed} step {step} ({how}) after {history[-6:]}:\n")
        assert service_a.served == service_b.served and service_a.to_dict() == service_b.to_dict()
        scratch.snapshot.evicted_for, patched.snapshot.evicted_for = memory_a, memory_b
        b = decide_alike(scratch, patched, profile, step, carry, now)
        c.bind(patched, b.binds, fail=0.2)
    assert carry.patched > 20, f"patched only {carry.patched} of 80 cycles"


def test_a_gang_short_of_pods_is_looked_at_again_when_its_creation_grace_ends() -> None:
    """Nothing changes in the store, but the clock moves past the grace: the patch must see it."""
    c = Cluster(random.Random(0), nodes=2, queues=False)
    created = "2027-01-15T07:59:55Z"  # NOW - 5 s: within the 60 s grace
    assert abs(timestamp(created) - (NOW - 5)) < 1
    c.groups.append(c._stamp(pod_group("short", 2)))
    c.new_pod(gpus=1, labels={"phalanx.io/pod-group": "short"}, created=created)
    c.new_pod(gpus=1)
    w = Watched(c)
    w.sync()
    cfg = AdapterConfig()
    memo, carry = Translations(), Carry()
    for now in (NOW, NOW + 1, NOW + 120):
        scratch = build_world(*copy.deepcopy((c.nodes, c.pods, c.groups, c.queues)), cfg, now, Translations())
        patched = _patched(w, cfg, memo, carry, now)
        _same_world(scratch, patched, f"at NOW + {now - NOW:g} s:\n")
    assert carry.patched == 2
    assert patched.waiting_pods == {"default/short": False}


def test_pods_that_cannot_be_read_arrive_through_the_feed_and_are_named_as_a_full_read_names_them() -> None:
    c = Cluster(random.Random(0), nodes=2, queues=False)
    c.new_pod(gpus=1)
    w = Watched(c)
    w.sync()
    cfg = AdapterConfig()
    memo, carry = Translations(), Carry()
    _patched(w, cfg, memo, carry)
    bad = c.new_pod(gpus=1)
    bad["spec"] = ["not", "a", "mapping"]  # an outline no reader can take for granted
    unreadable = c.new_pod(gpus=1)
    unreadable["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    w.sync()
    before = carry.patched
    for _ in range(2):
        scratch = build_world(*copy.deepcopy((c.nodes, c.pods, c.groups, c.queues)), cfg, NOW, Translations())
        patched = _patched(w, cfg, memo, carry)
        _same_world(scratch, patched, "")
    assert carry.patched == before + 2
    assert f"Pod default/{bad['metadata']['name']}" in patched.problems
    assert f"default/{unreadable['metadata']['name']}" in patched.pod_problems


def test_the_feed_names_what_changed_and_says_when_a_reader_fell_behind() -> None:
    store = Store(feed=3)
    store.replace("pods", [{"metadata": {"namespace": "a", "name": "x"}}])
    start = store.generation
    assert store.changes(start) == {}
    store.apply("pods", "MODIFIED", {"metadata": {"namespace": "a", "name": "x"}})
    store.apply("nodes", "ADDED", {"metadata": {"name": "n1"}})
    assert store.changes(start) == {"pods": {"a/x"}, "nodes": {"n1"}}
    assert store.changes(start - 1) == {"pods": None, "nodes": {"n1"}}  # the relist: every pod
    store.apply("pods", "DELETED", {"metadata": {"namespace": "a", "name": "y"}})
    store.apply("pods", "ADDED", {"metadata": {"namespace": "a", "name": "z"}})
    assert store.changes(start) is None  # the feed holds 3 changes: this reader fell behind
    assert store.changes(store.generation - 2) == {"pods": {"a/y", "a/z"}}


def test_a_trace_replayed_through_the_api_objects_reads_and_decides_as_a_scratch_rebuild() -> None:
    """The embedded Tiresias trace (60 jobs; 8-GPU jobs as gangs of two 4-GPU pods) on 4 nodes x 4
    GPUs: jobs arrive at their submit time, start once bound, and their pods go when they have run
    their duration. Every 10 s of the replay the patched world equals one built from scratch, the
    service kept on both agrees, and the core decides the same on both."""
    from datetime import UTC, datetime
    from importlib.resources import files

    from phalanx.sim.traces.tiresias import load_jobs

    jobs = load_jobs(str(files("phalanx.data") / "tiresias-60job.csv"))
    c = Cluster(random.Random(7), nodes=0, queues=False)
    c.nodes = [c._stamp(node(f"n{k}", gpus=4, product="Tesla-V100-SXM2-32GB")) for k in range(4)]
    w = Watched(c)
    cfg = AdapterConfig()
    profile = load_profile(cfg.profile)
    memo, carry = Translations(), Carry()
    service_a, service_b = AttainedService(), AttainedService()
    memory_a: dict[str, Any] = {}
    memory_b: dict[str, Any] = {}
    started: dict[str, float] = {}  # job -> when its pods started
    pods_of: dict[str, list[dict[str, Any]]] = {}
    ended = 0
    for step in range(1500):
        now = NOW + 10.0 * step
        for j in jobs:
            if j.submit <= 10.0 * step and j.name not in pods_of:
                n = 2 if j.gpus > 4 else 1
                labels = {"phalanx.io/pod-group": j.name} if n > 1 else {}
                if n > 1:
                    c.groups.append(c._stamp(pod_group(j.name, n)))
                pods_of[j.name] = [c.new_pod(gpus=j.gpus // n, labels=dict(labels)) for _ in range(n)]
        for name, pods in pods_of.items():
            if name in started or not all(p["spec"].get("nodeName") for p in pods):
                continue
            started[name] = now
            when = datetime.fromtimestamp(now, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            for p in pods:
                p["status"] = {"phase": "Running", "startTime": when}
                c.changed(p)
        for j in jobs:
            if j.name in started and started[j.name] + j.duration <= now and pods_of[j.name][0] in c.pods:
                for p in pods_of[j.name]:
                    c.pods.remove(p)
                    c.rv += 1
                ended += 1
        w.sync()
        scratch = build_world(*copy.deepcopy((c.nodes, c.pods, c.groups, c.queues)), cfg, now, Translations())
        patched = _patched(w, cfg, memo, carry, now)
        service_a.apply(scratch.snapshot, now)
        service_b.apply(patched.snapshot, now)
        _same_world(scratch, patched, f"step {step} (t={10 * step} s):\n")
        assert service_a.to_dict() == service_b.to_dict(), f"step {step}"
        scratch.snapshot.evicted_for, patched.snapshot.evicted_for = memory_a, memory_b
        b = decide_alike(scratch, patched, profile, step, carry, now)
        c.bind(
            patched, [*patched.unfinished, *b.binds], fail=0.0
        )  # plans left are finished, as the executor does
        if ended == len(jobs):
            break
    assert ended == len(jobs), f"{ended} of {len(jobs)} jobs ran to their end by step {step}"
    assert carry.patched > 100, f"patched {carry.patched} cycles"


def test_the_drivers_memory_of_evictions_outlives_a_patch_that_stages_its_workload_again() -> None:
    """The scheduler lends its memory of evictions (`evicted_for`) to each cycle's snapshot; a patch
    that stages a workload again must not forget that workload's entry in it (the repeat window
    would let the same workload be evicted again at once)."""
    c = Cluster(random.Random(0), nodes=2, queues=False)
    victim = c.new_pod(gpus=1)
    w = Watched(c)
    w.sync()
    cfg = AdapterConfig()
    memo, carry = Translations(), Carry()
    first = _patched(w, cfg, memo, carry)
    c.bind(
        first,
        run_cycle(first.snapshot, load_profile(cfg.profile), NOW, np.random.default_rng(0), apply=True).binds,
        fail=0.0,
    )
    carry.applied = True
    w.sync()
    kept = _patched(w, cfg, memo, carry)
    memory: dict[str, Any] = {"default/p1": {("a preemptor's shape",): NOW}}
    kept.snapshot.evicted_for = memory  # lent for the cycle, as `decide` does
    victim["metadata"]["labels"]["touched"] = "1"  # the victim's pod changes: its workload is staged anew
    c.changed(victim)
    w.sync()
    before = carry.patched
    _patched(w, cfg, memo, carry)
    assert carry.patched == before + 1
    assert memory == {"default/p1": {("a preemptor's shape",): NOW}}


def test_podgroup_changes_are_patched_and_read_as_a_full_read_reads_them() -> None:
    """A PodGroup's minimum changed, made unreadable, then the object deleted: each patched (no full
    read), each the world a full read gives."""
    c = Cluster(random.Random(0), nodes=2, queues=False)
    pg = c._stamp(pod_group("pair", 2))
    c.groups.append(pg)
    for _ in range(2):
        c.new_pod(gpus=1, labels={"phalanx.io/pod-group": "pair"})
    w = Watched(c)
    w.sync()
    cfg = AdapterConfig()
    memo, carry = Translations(), Carry()
    _patched(w, cfg, memo, carry)
    for change in (3, "many", 2, None):  # 2 then gone: the same minimum, no longer said as minMember
        if change is None:
            c.groups.remove(pg)
            c.rv += 1
        else:
            pg["spec"]["minMember"] = change
            c.changed(pg)
        w.sync()
        before = carry.patched
        patched = _patched(w, cfg, memo, carry)
        assert carry.patched == before + 1, change
        _same_world(_scratch(c, cfg), patched, f"minMember {change}:\n")
    assert "default/pair" not in patched.pod_groups and "default/pair" not in patched.blocked
