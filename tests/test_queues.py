"""Queues: the tree, fair shares, quota admission and fair-share ordering."""

import numpy as np
import pytest

from builders import Scenario, make_node, make_workload
from phalanx.core.errors import SpecError
from phalanx.core.queues import INF, Queue, QueueTree, ResourceQuota, fair_shares
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import compile_profile
from phalanx.spec.cluster import parse_cluster


def gpu(deserved=0.0, limit=INF, weight=1.0, borrow=INF, lend=INF):
    return {"gpu": ResourceQuota(deserved * 1000, limit * 1000, weight, borrow * 1000, lend * 1000)}


def vec(g):
    return np.array([g * 1000.0, 0.0, 0.0])


def test_fair_share_gives_deserved_first_then_surplus_by_weight():
    tree = QueueTree(
        [Queue("a", quotas=gpu(2, weight=1)), Queue("b", quotas=gpu(2, weight=3)), Queue("c", quotas=gpu(0))]
    )
    fs = fair_shares(tree, vec(12), {"a": vec(100), "b": vec(100), "c": vec(100)})
    # deserved 2 + 2, surplus 8 split 1:3:1 over a, b, c
    assert fs["a"][0] == pytest.approx(2000 + 1600)
    assert fs["b"][0] == pytest.approx(2000 + 4800)
    assert fs["c"][0] == pytest.approx(1600)


def test_fair_share_respects_demand_limits_and_priority_tiers():
    tree = QueueTree(
        [
            Queue("hi", quotas=gpu(0, limit=3), priority=1),
            Queue("lo", quotas=gpu(0)),
            Queue("idle", quotas=gpu(4)),
        ]
    )
    fs = fair_shares(tree, vec(10), {"hi": vec(100), "lo": vec(100), "idle": vec(1)})
    assert fs["idle"][0] == pytest.approx(1000)  # deserved 4, wants 1
    assert fs["hi"][0] == pytest.approx(3000)  # higher tier first, capped by its limit
    assert fs["lo"][0] == pytest.approx(6000)  # the rest


def test_hierarchy_splits_the_parent_share():
    tree = QueueTree(
        [
            Queue("org", quotas=gpu(8)),
            Queue("x", "org", gpu(6)),
            Queue("y", "org", gpu(2)),
            Queue("other", quotas=gpu(8)),
        ]
    )
    fs = fair_shares(tree, vec(16), {"x": vec(100), "y": vec(100), "other": vec(2)})
    assert fs["other"][0] == pytest.approx(2000)
    assert fs["org"][0] == pytest.approx(14000)
    assert fs["x"][0] + fs["y"][0] == pytest.approx(14000)
    assert fs["x"][0] > fs["y"][0]


def test_tree_validation():
    with pytest.raises(SpecError, match="unknown parent queue 'nope'"):
        QueueTree([Queue("a", "nope")])
    with pytest.raises(SpecError, match="loops back"):
        QueueTree([Queue("a", "b"), Queue("b", "a")])
    with pytest.raises(SpecError, match="below the deserved quota"):
        ResourceQuota(deserved=5, limit=3)
    tree = QueueTree([Queue("org"), Queue("team", "org")])
    snap = Snapshot([make_node("n").gpus(1).build()], queues=tree)
    with pytest.raises(SpecError, match="'org' is not a leaf queue"):
        snap.add_workload(make_workload("w").podset("p", gpu=1).queue("org").build())
    with pytest.raises(SpecError, match="'ghost' is not a known queue"):
        snap.add_workload(make_workload("w").podset("p", gpu=1).queue("ghost").build())


def queued_profile(**extra):
    data = {
        "name": "q",
        "actions": [{"name": "allocate"}],
        "order": [{"name": "priority"}],
        "admission": [{"name": "quota"}],
        "queue_order": {"name": "fairshare"},
        "tie_break": "name",
    }
    data.update(extra)
    return compile_profile(data)


def scenario(tree, workloads, gpus=8):
    sc = Scenario([make_node("n").cpu(128).memory("1Ti").gpus(gpus).build()], [], profile=queued_profile())
    sc.snapshot = Snapshot(sc.nodes, workloads, queues=tree)
    return sc


def test_limit_caps_a_queue_and_names_the_reason():
    tree = QueueTree([Queue("a", quotas=gpu(2, limit=3)), Queue("b", quotas=gpu(2))])
    wl = [make_workload(f"a{k}").podset("p", gpu=1).queue("a").created(k).build() for k in range(5)]
    sc = scenario(tree, wl)
    last = sc.run()
    assert sum(sc.bound(f"a{k}") for k in range(5)) == 3
    msg = next(p.message for p in last.pending if p.workload.startswith("a"))
    assert "queue a would exceed its gpu ceiling of 3 GPU (using 3 GPU, asking 1 GPU)" in msg


def test_borrowing_limit_and_non_preemptible_in_quota():
    tree = QueueTree([Queue("a", quotas=gpu(2, borrow=1)), Queue("b", quotas=gpu(2))])
    wl = [make_workload(f"a{k}").podset("p", gpu=1).queue("a").created(k).build() for k in range(5)]
    sc = scenario(tree, wl)
    sc.run()
    assert sum(sc.bound(f"a{k}") for k in range(5)) == 3  # deserved 2 + borrowing 1
    from phalanx.core.model import Workload

    np_wl = make_workload("np").podset("p", gpu=1).queue("b").build()
    np_wl = Workload(np_wl.name, np_wl.podsets, queue="b", preemptible=False)
    np2 = Workload("np2", np_wl.podsets, queue="b", preemptible=False, creation_time=1)
    np3 = Workload("np3", np_wl.podsets, queue="b", preemptible=False, creation_time=2)
    for w in (np_wl, np2, np3):
        sc.add(w)
    last = sc.run()
    assert sc.bound("np") + sc.bound("np2") + sc.bound("np3") == 2
    assert (
        "non-preemptible workloads run only within the deserved quota of queue b"
        in last.pending_for("np3").message
    )


def test_lending_limit_keeps_part_of_an_idle_queue_free():
    tree = QueueTree([Queue("a", quotas=gpu(2)), Queue("b", quotas=gpu(6, lend=2))])
    wl = [make_workload(f"a{k}").podset("p", gpu=1).queue("a").created(k).build() for k in range(8)]
    sc = scenario(tree, wl)
    last = sc.run()
    assert sum(sc.bound(f"a{k}") for k in range(8)) == 4  # 2 deserved + 2 lent by b; b keeps 4
    assert "lending limits" in next(p.message for p in last.pending)


def test_fair_share_order_serves_the_starved_queue_first():
    tree = QueueTree([Queue("a", quotas=gpu(4)), Queue("b", quotas=gpu(4))])
    wl = [make_workload(f"a{k}").podset("p", gpu=1).queue("a").created(k).build() for k in range(8)]
    wl += [make_workload(f"b{k}").podset("p", gpu=1).queue("b").created(10 + k).build() for k in range(8)]
    sc = scenario(tree, wl)
    sc.run()
    a = sum(sc.bound(f"a{k}") for k in range(8))
    b = sum(sc.bound(f"b{k}") for k in range(8))
    assert (a, b) == (4, 4)


def test_queues_from_cluster_yaml():
    cd = parse_cluster(
        {
            "nodes": [
                {
                    "name": "n",
                    "cpu": 16,
                    "memory": "64Gi",
                    "gpus": {"count": 4, "model": "H100", "memory": "80Gi"},
                }
            ],
            "gpu_weights": {"H100": 3.0},
            "queues": [
                {"name": "org", "quotas": {"gpu": {"deserved": 4, "limit": 8}}},
                {
                    "name": "t1",
                    "parent": "org",
                    "priority": 2,
                    "quotas": {
                        "gpu": {"deserved": 2, "over_quota_weight": 2, "lending_limit": 1},
                        "cpu": {"deserved": 8},
                        "memory": {"deserved": "32Gi"},
                    },
                },
            ],
        },
        "c.yaml",
    )
    tree = cd.queues
    assert tree is not None and tree.is_leaf("t1") and not tree.is_leaf("org")
    assert tree.deserved["t1"].tolist() == [2000.0, 8000.0, 32768.0]
    assert tree.reserve("t1")[0] == 1000.0
    snap = cd.snapshot()
    assert snap.capacity_vector()[0] == 4 * 1000 * 3.0
    with pytest.raises(
        SpecError, match=r"c\.yaml: queues\[0\]\.quotas\.gpu\.deserved: GPU amounts are numbers"
    ):
        parse_cluster(
            {
                "nodes": [{"name": "n", "cpu": 1, "memory": 1}],
                "queues": [{"name": "a", "quotas": {"gpu": {"deserved": "lots"}}}],
            },
            "c.yaml",
        )
