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


def test_the_repeat_guards_memory_is_saved_and_read_back_by_shape():
    """A new leader knows who was evicted for which preemptor shape (issue 26): the memory is saved as
    digests and read back into demand keys once a workload of that shape is in the snapshot."""
    import json

    from phalanx.k8s.loop.repeat_memory import KEEP_S, from_saved, restore, to_saved

    sc = Scenario([make_node("n").gpus(4).build()])
    sc.add(make_workload("victim").podset("p", gpu=2).build())
    sc.add(make_workload("preemptor").podset("p", gpu=4, models="H100").build())
    shape = sc.snapshot.workloads["preemptor"].demand_key
    memory = {"victim": {shape: 1000.0}}
    saved = json.loads(json.dumps(to_saved(memory, {}, now=1000.0)))  # as the ConfigMap holds it
    svc = AttainedService()
    svc.load({"evictions": saved})
    pending = dict(svc.evictions)
    back: dict = {}
    restore(back, pending, sc.snapshot)
    assert back == {"victim": {shape: 1000.0}} and pending == {}
    # a shape no workload has now waits, and is forgotten after KEEP_S
    other = {"gone": {"0" * 32: 1000.0}}
    restore(back, other, sc.snapshot)
    assert other == {"gone": {"0" * 32: 1000.0}}
    assert to_saved({}, other, now=1000.0 + KEEP_S / 2) == other
    assert to_saved({}, other, now=1000.0 + KEEP_S) == {}
    assert from_saved({"w": {"s": "x", "t": float("nan")}, "v": 3}) == {}  # what does not read is skipped


def test_a_shapes_digest_is_the_same_in_every_process():
    """Sets and hash seeds do not change a digest: a leader in another process reads it back."""
    import subprocess
    import sys

    from phalanx.k8s.loop.repeat_memory import digest

    code = (
        "from phalanx.k8s.loop.repeat_memory import digest;"
        "print(digest((frozenset({'H100', 'A100', 'L40S'}), 2, ('rack', True), {'b': 1, 'a': 2})))"
    )
    here = digest((frozenset({"L40S", "H100", "A100"}), 2, ("rack", True), {"a": 2, "b": 1}))
    for seed in ("1", "2", "3"):
        env = {"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == here


def test_the_repeat_guards_memory_is_forgotten_by_age_not_by_absence():
    """A gang evicted a moment ago may have no pods while its controller remakes them: its memory
    stays until it is older than any repeat window."""
    from phalanx.k8s.loop.repeat_memory import KEEP_S, forget_old

    memory = {"gone-for-now": {("shape",): 1000.0}, "old": {("shape",): 1000.0 - KEEP_S}}
    forget_old(memory, now=1000.0 + 5)
    assert memory == {"gone-for-now": {("shape",): 1000.0}}
    forget_old(memory, now=1000.0 + KEEP_S)
    assert memory == {}


def test_a_kept_snapshot_gets_earlier_runs_service_once_a_cycle_not_once_more_each_cycle():
    """The kept snapshot resets only the workloads whose standing changed (`reset_cycle_state`): a
    workload given earlier runs' service must have it reset too, or it would add up cycle after cycle."""
    from phalanx.k8s.read.carry import reset_cycle_state
    from phalanx.k8s.read.world import serve

    svc = AttainedService()
    s = world(running=True, attained=7200.0)
    svc.apply(s)
    entry = s.workloads["w"]
    for alloc in list(entry.bound.values()):  # preempted: waiting again in the same, kept snapshot
        s.release(alloc.task.name)
    for _ in range(3):
        reset_cycle_state(s)
        serve(s, 0.0)
        svc.apply(s)
        assert entry.attained == 7200.0 and s.workloads["other"].attained == 0.0


def test_a_run_is_read_from_the_snapshot_clock_and_kept_when_its_gpus_change():
    """The adapter moves one clock a cycle instead of writing every running workload's service: a
    run reads GPUs x time since its start, and an eviction (or a bind) counts it as of then."""
    sc = Scenario([make_node("n").gpus(4).build()])
    sc.add(make_workload("w").podset("p", gpu=2).build())
    sc.cycle()
    s = sc.snapshot
    entry = s.workloads["w"]
    entry.run_since, entry.run_clock = 100.0, s.run_clock
    s.run_clock.now = 50.0  # a clock behind the run's start: nothing run yet
    assert (entry.attained, entry.executed) == (0.0, 0.0)
    s.run_clock.now = 400.0
    assert (entry.attained, entry.executed) == (600.0, 300.0)  # 2 GPUs x 300 s
    s.release(next(iter(entry.bound)))  # one pod evicted: the run is counted as of now
    s.run_clock.now = 1000.0
    assert (entry.attained, entry.executed) == (600.0, 300.0) and entry.run_since is None
    entry.attained = 50.0  # set outright (as a driver that keeps its own count does)
    assert entry.attained == 50.0 and entry.executed == 300.0
