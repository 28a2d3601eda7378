"""Placement by class decides exactly what the full pass decides, and is really taken.

Each scenario runs twice on fresh snapshots: with the class caches (the default) and with every
placement forced down the full pass. Binds (node, devices) and pending reasons must be equal.
The scenarios mix alike tasks (replicas, gangs, fractions, CPU-only), a cluster full enough for
the whole-GPU guard to turn on, a reservation, gangs that roll back, several cycles on one
snapshot (the FGD scorer's memo lives across cycles), and a random tie-break (never cached).
"""

from __future__ import annotations

import numpy as np
import pytest

from builders import make_node, make_workload
from phalanx.core.classes import PlacementClasses
from phalanx.core.cluster import ClusterState
from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import CycleResult
from phalanx.core.model import Workload
from phalanx.core.session import Session
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile


def cluster(seed: int, n: int = 24) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        b = make_node(f"n{i:03d}").cpu(int(rng.choice([32, 64, 96]))).rack(f"r{i % 4}")
        b.gpus(int(rng.choice([4, 8])), per_pcie_switch=2)
        out.append(b.build())
    return out


def workloads(seed: int, count: int = 160) -> list[Workload]:
    rng = np.random.default_rng(seed + 1000)
    out = []
    for k in range(count):
        w = make_workload(f"w{k:04d}").created(float(k)).runtime(float(rng.integers(10, 500)))
        r = rng.random()
        if r < 0.45:
            w.podset("p", cpu=float(rng.choice([1, 2, 4])), fraction=float(rng.choice([0.25, 0.5, 0.75])))
        elif r < 0.75:
            w.podset("p", cpu=4, gpu=int(rng.choice([1, 2])))
        elif r < 0.85:
            w.podset("p", cpu=2)
        elif r < 0.95:
            w.podset("w", int(rng.choice([2, 3])), cpu=8, gpu=4)
        else:
            w.podset("w", 2, cpu=8, gpu=4).topology("rack", required=True)
        out.append(w.priority(int(rng.integers(0, 3))).build())
    return out


def decisions(result: CycleResult) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    binds = [(b.task, b.node, b.gpus, b.gpu_milli, b.gpu_memory_mib, b.nics) for b in result.binds]
    pending = sorted((p.workload, p.summary, p.reasons) for p in result.pending)
    return binds, pending


def replay(seed: int, profile: str, cycles: int, full_pass: bool, mp: pytest.MonkeyPatch) -> list[object]:
    """Cycles over one snapshot: all work pending at first, then half of what runs ends each cycle.

    Odd seeds rank nodes as the FGD protocol does (a permutation), with ties, instead of by name.
    """
    with mp.context() as m:
        if full_pass:
            m.setattr(PlacementClasses, "lookup", lambda self, task, req: None)
        snap = Snapshot(cluster(seed), workloads(seed), topology_levels=("rack",))
        if seed % 2:
            snap.node_rank = np.random.default_rng(seed).permutation(len(snap.cluster)) // 2
        prof = load_profile(profile)
        rng = np.random.default_rng(seed)
        out: list[object] = []
        for t in range(cycles):
            result = run_cycle(snap, prof, float(t), rng, apply=True)
            out.append(decisions(result))
            done = sorted(snap.running)[::2]
            for name in done:
                snap.remove_workload(name)
        return out


@pytest.mark.parametrize("profile", ["phalanx", "fgd", "phalanx-queues", "binpack", "random"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_classes_decide_as_the_full_pass(profile: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = replay(seed, profile, 3, full_pass=False, mp=monkeypatch)
    full = replay(seed, profile, 3, full_pass=True, mp=monkeypatch)
    assert fast == full
    assert sum(len(binds) for binds, _ in fast) > 100  # the scenario places work, so equality means something


def test_the_class_path_is_taken_and_the_guard_turns_on() -> None:
    """A full cluster: alike tasks share classes, and the whole-GPU guard's verdict is part of the key."""
    snap = Snapshot(cluster(5, n=8), workloads(5, count=200), topology_levels=("rack",))
    session = Session(snap, load_profile("phalanx"), 0.0, np.random.default_rng(0))
    for action in session.profile.actions:
        action.execute(session)
    classes = session._classes
    assert classes is not None and classes.enabled
    assert len(classes.classes) >= 3
    guard_keys = {key[1] for key in classes.classes}  # the first filter is whole-gpu-guard
    assert guard_keys == {False, True}
    snap.cluster.check_invariants()
    session.close()


def test_a_random_tie_break_is_never_cached() -> None:
    snap = Snapshot(cluster(1), workloads(1), topology_levels=("rack",))
    session = Session(snap, load_profile("random"), 0.0, np.random.default_rng(0))
    assert not PlacementClasses(session).enabled


def test_changed_since_reads_the_log_and_scans_after_a_reset() -> None:
    c = ClusterState(cluster(1, n=6))
    mark = c.mark()
    assert c.changed_since(mark) == []
    c.set_ready(4, False)
    c.set_ready(1, False)
    c.set_ready(4, True)
    assert c.changed_since(mark) == [1, 4]
    later = c.mark()
    for _ in range(c._log_cap + 1):  # the log resets: readers behind it scan the versions
        c.set_ready(2, True)
    assert c.log_epoch == mark[1] + 1
    assert c.changed_since(mark) == [1, 2, 4]
    assert c.changed_since(later) == [2]


def test_short_lived_classes_are_given_up_with_the_same_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many shapes, few pods of each (as openb): the cycle stops building classes, decisions unchanged."""
    rng = np.random.default_rng(9)
    shapes = [
        (float(c), float(f)) for c in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10) for f in (0.1, 0.2, 0.3, 0.4, 0.6)
    ]
    pods = [shapes[int(k)] for k in rng.integers(0, len(shapes), 1000)]
    wls = [
        make_workload(f"w{k:04d}").created(float(k)).podset("p", cpu=c, fraction=f).build()
        for k, (c, f) in enumerate(pods)
    ]

    def once(full_pass: bool) -> tuple[object, PlacementClasses | None]:
        with monkeypatch.context() as m:
            if full_pass:
                m.setattr(PlacementClasses, "lookup", lambda self, task, req: None)
            snap = Snapshot(cluster(9, n=64), wls, topology_levels=("rack",))
            session = Session(snap, load_profile("phalanx"), 0.0, np.random.default_rng(0))
            for action in session.profile.actions:
                action.execute(session)
            out = decisions(session.result())
            classes = session._classes
            session.close()
            return out, classes

    fast, classes = once(False)
    full, _ = once(True)
    assert fast == full
    assert len(fast[0]) > 300
    assert classes is not None and not classes.enabled and classes.builds > 0
