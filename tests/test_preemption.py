"""Preemption inside a queue and reclaim across queues: gang-aware, simulated before commit, protected."""

from builders import Scenario, make_node, make_workload
from phalanx.core.model import Workload
from phalanx.core.queues import INF, Queue, QueueTree, ResourceQuota
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import compile_profile


def profile(min_runtime=0.0, **reclaim):
    return compile_profile(
        {
            "name": "p",
            "tie_break": "name",
            "actions": [
                {"name": "allocate"},
                {"name": "reclaim", "args": {"min_runtime": min_runtime, **reclaim}},
                {"name": "preempt", "args": {"min_runtime": min_runtime}},
            ],
            "order": [{"name": "priority"}],
            "admission": [{"name": "quota"}],
            "queue_order": {"name": "fairshare"},
        }
    )


def gpu(deserved, limit=INF):
    return {"gpu": ResourceQuota(deserved * 1000, limit * 1000)}


def scenario(tree, gpus=4, min_runtime=0.0, **reclaim):
    sc = Scenario(
        [make_node("n").cpu(128).memory("1Ti").gpus(gpus).build()],
        [],
        profile=profile(min_runtime, **reclaim),
    )
    sc.snapshot = Snapshot(sc.nodes, queues=tree)
    return sc


def test_higher_priority_preempts_the_cheapest_lower_priority_victims():
    sc = scenario(QueueTree([Queue("q", quotas=gpu(4))]))
    for k in range(4):
        sc.add(make_workload(f"low{k}").podset("p", gpu=1).queue("q").created(k).build())
        sc.cycle()  # started one cycle apart: low3 has done the least work
    sc.add(make_workload("high").podset("p", gpu=2).queue("q").priority(5).created(10).build())
    result = sc.cycle()
    assert sc.bound("high") == 1
    assert sorted(e.workload for e in result.evictions) == ["low2", "low3"]
    assert all("preempted by high" in e.reason for e in result.evictions)


def test_no_eviction_unless_the_preemptor_then_fits():
    sc = scenario(QueueTree([Queue("q", quotas=gpu(4))]))
    for k in range(4):
        sc.add(make_workload(f"low{k}").podset("p", gpu=1).queue("q").build())
    sc.run()
    sc.add(make_workload("huge").podset("p", 2, gpu=4).queue("q").priority(9).build())
    result = sc.run()
    assert not result.evictions and sc.bound("huge") == 0
    assert all(sc.bound(f"low{k}") == 1 for k in range(4))


def test_minimum_runtime_protects_fresh_workloads():
    sc = scenario(QueueTree([Queue("q", quotas=gpu(4))]), min_runtime=10)
    for k in range(4):
        sc.add(make_workload(f"low{k}").podset("p", gpu=1).queue("q").build())
    sc.cycle()
    sc.add(make_workload("high").podset("p", gpu=1).queue("q").priority(5).build())
    assert not sc.cycle().evictions
    for _ in range(12):
        r = sc.cycle()
        if r.evictions:
            break
    assert sc.bound("high") == 1 and len(r.evictions) == 1


def test_preempt_by_order_still_lets_waiting_higher_priority_workloads_evict():
    """Alike workloads that waited a cycle are not all retried by allocate; priority must still reach them."""
    sc = scenario(QueueTree([Queue("q", quotas=gpu(4))]))
    sc.prof = compile_profile(
        {
            "name": "p",
            "tie_break": "name",
            "actions": [
                {"name": "allocate"},
                {"name": "preempt", "args": {"by": "order", "min_runtime": 10}},
            ],
            "order": [{"name": "priority"}, {"name": "las"}],
        }
    )
    for k in range(4):
        sc.add(make_workload(f"low{k}").podset("p", gpu=1).queue("q").build())
    sc.cycle()
    for k in range(2):
        sc.add(make_workload(f"high{k}").podset("p", gpu=2).queue("q").priority(5).created(k).build())
    assert not sc.cycle().evictions  # the victims are inside their minimum runtime
    evicted = []
    for _ in range(12):
        evicted += sc.cycle().evictions
    assert sc.bound("high0") == 1 and sc.bound("high1") == 1 and len(evicted) == 4


def test_reclaim_takes_back_borrowed_gpus_but_not_below_deserved():
    tree = QueueTree([Queue("a", quotas=gpu(2)), Queue("b", quotas=gpu(2))])
    sc = scenario(tree)
    for k in range(4):
        sc.add(make_workload(f"a{k}").podset("p", gpu=1).queue("a").created(k).build())
    sc.run()
    assert sum(sc.bound(f"a{k}") for k in range(4)) == 4  # a borrows b's idle quota
    sc.add(make_workload("b0").podset("p", gpu=2).queue("b").created(10).build())
    result = sc.cycle()
    assert sc.bound("b0") == 1
    assert len(result.evictions) == 2 and all(e.workload.startswith("a") for e in result.evictions)
    assert sc.snapshot.usage_of("a")[0] == 2000  # back to its deserved quota, not below
    sc.add(make_workload("b1").podset("p", gpu=1).queue("b").created(11).build())
    assert not sc.run().evictions and sc.bound("b1") == 0


def test_preempt_after_reclaim_in_one_cycle_skips_workloads_reclaim_evicted():
    """Reclaim and preempt with different minimum runtimes: preempt lists victims after reclaim took some."""
    tree = QueueTree([Queue("a", quotas=gpu(2)), Queue("b", quotas=gpu(2))])
    sc = scenario(tree)
    sc.prof = compile_profile(
        {
            "name": "p",
            "tie_break": "name",
            "actions": [
                {"name": "allocate"},
                {"name": "reclaim", "args": {"min_runtime": 2}},
                {"name": "preempt", "args": {"min_runtime": 1}},
            ],
            "order": [{"name": "priority"}],
            "admission": [{"name": "quota"}],
            "queue_order": {"name": "fairshare"},
        }
    )
    for k in range(4):
        sc.add(make_workload(f"a{k}").podset("p", gpu=1).queue("a").created(k).build())
    sc.run()
    for _ in range(3):
        sc.cycle()
    sc.add(make_workload("b0").podset("p", gpu=2).queue("b").created(10).build())
    sc.add(make_workload("urgent").podset("p", gpu=1).queue("a").priority(5).created(11).build())
    result = sc.cycle()
    assert sc.bound("b0") == 1 and sc.bound("urgent") == 1
    assert len(result.evictions) == 3  # two reclaimed by b, one preempted by urgent
    assert sum(sc.bound(f"a{k}") for k in range(4)) == 1


def test_reclaim_that_would_cut_into_deserved_quota_does_nothing():
    tree = QueueTree([Queue("a", quotas=gpu(3)), Queue("b", quotas=gpu(1))])
    sc = scenario(tree)
    for k in range(4):
        sc.add(make_workload(f"a{k}").podset("p", gpu=1).queue("a").created(k).build())
    sc.run()
    sc.add(make_workload("b0").podset("p", gpu=2).queue("b").build())
    result = sc.run()
    assert not result.evictions and sc.bound("b0") == 0


def test_elastic_workloads_shrink_first_and_keep_running():
    tree = QueueTree([Queue("a", quotas=gpu(1)), Queue("b", quotas=gpu(3))])
    sc = scenario(tree)
    sc.add(make_workload("rigid").podset("p", gpu=1).queue("a").created(0).build())
    sc.add(make_workload("elastic").podset("p", 3, gpu=1).min_available(1).queue("a").created(1).build())
    sc.run()
    assert sc.bound("elastic") == 3 and sc.bound("rigid") == 1
    sc.add(make_workload("b0").podset("p", gpu=2).queue("b").created(5).build())
    result = sc.cycle()
    assert sc.bound("b0") == 1
    assert {e.workload for e in result.evictions} == {"elastic"} and sc.bound("elastic") == 1
    assert sc.bound("rigid") == 1


def test_non_preemptible_workloads_are_never_victims():
    tree = QueueTree([Queue("q", quotas=gpu(4))])
    sc = scenario(tree)
    base = make_workload("keep").podset("p", gpu=4).queue("q").build()
    sc.add(Workload(base.name, base.podsets, queue="q", preemptible=False))
    sc.run()
    sc.add(make_workload("high").podset("p", gpu=1).queue("q").priority(9).build())
    assert not sc.run().evictions and sc.bound("high") == 0


def owed_profile(owed):
    return compile_profile(
        {
            "name": "p",
            "tie_break": "name",
            "actions": [{"name": "allocate"}, {"name": "reclaim", "args": {"owed": owed}}],
            "order": [{"name": "priority"}],
            "admission": [{"name": "quota"}],
            "queue_order": {"name": "fairshare"},
        }
    )


def test_reclaim_owes_the_deserved_quota_by_default_and_the_fair_share_on_request():
    outcomes = {}
    for owed in ("deserved", "fair"):
        tree = QueueTree([Queue("a", quotas=gpu(1)), Queue("b", quotas=gpu(1))])
        sc = scenario(tree)
        sc.prof = owed_profile(owed)
        for k in range(3):
            sc.add(make_workload(f"b{k}").podset("p", gpu=1).queue("b").created(k).build())
        sc.run()
        for k in range(2):
            sc.add(make_workload(f"a{k}").podset("p", gpu=1).queue("a").created(10 + k).build())
        sc.run()
        outcomes[owed] = (sc.bound("a0") + sc.bound("a1"), sc.snapshot.usage_of("b")[0])
    # a holds its deserved 1 GPU: nothing is owed to it; its fair share of the 4 GPUs is 2
    assert outcomes["deserved"] == (1, 3000)
    assert outcomes["fair"] == (2, 2000)


def test_transfer_reclaim_may_end_above_deserved_but_never_richer_than_its_victims():
    """a (1 of its 4 GPUs) wants 4 more; b holds 8 of 4 deserved on a 10-GPU node."""

    def run(transfer, want):
        tree = QueueTree([Queue("a", quotas=gpu(4)), Queue("b", quotas=gpu(4))])
        sc = scenario(tree, gpus=10, transfer=transfer)
        sc.add(make_workload("a0").podset("p", gpu=1).queue("a").created(0).build())
        for k in range(8):
            sc.add(make_workload(f"b{k}").podset("p", gpu=1).queue("b").created(1 + k).build())
        sc.run()
        sc.add(make_workload("big").podset("p", want, gpu=1).queue("a").created(20).build())
        evicted = len(sc.cycle().evictions)
        return sc, evicted

    sc, evicted = run(False, 4)  # 1 + 4 > 4 deserved: the default never lets a end above it
    assert evicted == 0 and sc.bound("big") == 0
    sc, evicted = run(True, 4)  # a ends at 5/4, b at 5/4: the gap closes
    assert evicted == 3 and sc.bound("big") == 4
    assert sc.snapshot.usage_of("a")[0] == 5000 and sc.snapshot.usage_of("b")[0] == 5000
    sc, evicted = run(True, 5)  # a would end at 6/4 and b at 4/4: richer than its victim, refused
    assert evicted == 0 and sc.bound("big") == 0


def test_workloads_that_waited_reclaim_once_the_minimum_runtime_has_passed():
    """Reclaim looks at every pending workload, not only those free capacity could hold."""
    tree = QueueTree([Queue("a", quotas=gpu(2)), Queue("b", quotas=gpu(2))])
    sc = scenario(tree, min_runtime=5)
    for k in range(4):
        sc.add(make_workload(f"b{k}").podset("p", gpu=1).queue("b").created(k).build())
    sc.cycle()
    for k in range(2):  # two alike: free capacity holds neither, so allocate tries neither again
        sc.add(make_workload(f"a{k}").podset("p", gpu=1).queue("a").created(10 + k).build())
    waited = 0
    while not sc.cycle().evictions and waited < 10:
        waited += 1
    assert 3 <= waited < 10 and sc.bound("a0") == 1
    sc.run()
    assert sc.bound("a1") == 1 and sc.snapshot.usage_of("b")[0] == 2000


def test_higher_priority_workloads_that_waited_preempt_once_the_minimum_runtime_has_passed():
    sc = scenario(QueueTree([Queue("q", quotas=gpu(4))]), min_runtime=5)
    for k in range(4):
        sc.add(make_workload(f"low{k}").podset("p", gpu=1).queue("q").created(k).build())
    sc.cycle()
    for k in range(2):
        sc.add(make_workload(f"high{k}").podset("p", gpu=1).queue("q").priority(5).created(10 + k).build())
    for _ in range(12):
        sc.cycle()
    assert sc.bound("high0") == 1 and sc.bound("high1") == 1
