"""Attained service survives the per-cycle rebuild of the world: LAS does not forget a preempted workload."""

from builders import Scenario, make_node, make_workload
from phalanx.k8s.loop.service import AttainedService


def world(running: bool, attained: float = 0.0, present: bool = True):
    """A freshly built snapshot, as the adapter makes one each cycle: attained counts the current run only."""
    sc = Scenario([make_node("n").gpus(4).build()])
    if present:
        sc.add(make_workload("w").podset("p", gpu=2).build())
        if running:
            sc.cycle()
            sc.snapshot.workloads["w"].attained = attained
    sc.add(make_workload("other").podset("p", gpu=8).build())  # never fits: always pending
    return sc.snapshot


def test_a_preempted_workload_keeps_the_service_of_its_earlier_runs():
    svc = AttainedService()
    s1 = world(running=True, attained=7200.0)
    svc.apply(s1)
    assert s1.workloads["w"].attained == 7200.0
    s2 = world(running=False)  # preempted: waiting again, its pods gone
    svc.apply(s2)
    assert s2.workloads["w"].attained == 7200.0 and s2.workloads["other"].attained == 0.0
    s3 = world(running=True, attained=600.0)  # runs again: earlier runs plus this one
    svc.apply(s3)
    assert s3.workloads["w"].attained == 7800.0
    s4 = world(running=False)
    svc.apply(s4)
    assert s4.workloads["w"].attained == 7800.0
    svc.apply(world(running=False, present=False))  # deleted: forgotten
    assert "w" not in svc.served
