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

import pytest

from cluster_events import NOW, Cluster, decide_alike
from phalanx.core.snapshot_diff import differences
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.carry import Carry
from phalanx.k8s.read.claims import DraObjects
from phalanx.k8s.read.translations import Translations
from phalanx.k8s.read.world import World, build_world
from phalanx.profiles import load_profile


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
        b = decide_alike(scratch, carried, profile, step, carry)
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


def test_dra_objects_make_every_full_read_start_afresh() -> None:
    """Claims hold devices across nodes: with any DRA object each full read builds its snapshot anew
    (kept only for the change feed's patches), and none built with them is kept once they are gone."""
    c, cfg, memo, carry = _settled(seed=2, nodes=4, events=20)
    first = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, carry=carry)
    dra = DraObjects(classes=[{"metadata": {"name": "gpu.example.com"}, "spec": {}}])
    with_dra = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW, memo, dra=dra, carry=carry)
    assert with_dra.snapshot is not first.snapshot and carry.snap is with_dra.snapshot
    again = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW + 1, memo, dra=dra, carry=carry)
    assert again.snapshot is not with_dra.snapshot
    after = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW + 2, memo, carry=carry)
    assert after.snapshot is not again.snapshot and carry.snap is after.snapshot
    kept = build_world(c.nodes, c.pods, c.groups, c.queues, cfg, NOW + 3, memo, carry=carry)
    assert kept.snapshot is after.snapshot


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
