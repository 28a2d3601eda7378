"""The counterfactual ETA: play the cluster forward with the profile's own cycle, then leave it as it was."""

from __future__ import annotations

import numpy as np

from phalanx.core.cycle import run_cycle
from phalanx.core.forecast import eta_text, forecast
from phalanx.core.model import Gpu, GpuRequest, Node, PodSet, TaskRequest, Workload
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile


def _nodes() -> list[Node]:
    return [
        Node(f"n{i}", 64_000, 256 * 1024, tuple(Gpu(j, "H100", 81920) for j in range(4))) for i in range(2)
    ]


def _job(name: str, tasks: int, runtime: float | None, created: float, priority: int = 0) -> Workload:
    req = TaskRequest(1000, 1024, GpuRequest.whole(1))
    return Workload(
        name, (PodSet("w", tasks, req),), creation_time=created, estimated_runtime=runtime, priority=priority
    )


def _state(s: Snapshot) -> tuple[object, ...]:
    return (
        sorted((a.task.name, a.node, a.devices.gpus, a.since) for a in s.allocations.values()),
        sorted(e.name for e in s.pending_workloads()),
        sorted(s.running),
        s.cluster.gpu_free_total.tolist(),
    )


def test_forecast_follows_the_profile_and_leaves_the_snapshot_as_it_was() -> None:
    prof = load_profile("phalanx")
    s = Snapshot(_nodes())
    s.add_workload(_job("a", 8, 100.0, 0.0))
    run_cycle(s, prof, 0.0, np.random.default_rng(0), apply=True)
    s.add_workload(_job("b", 4, 50.0, 5.0))
    s.add_workload(_job("c", 8, 30.0, 6.0))
    s.add_workload(_job("d", 2, None, 7.0))
    run_cycle(s, prof, 10.0, np.random.default_rng(0), apply=True)
    before = _state(s)
    f = forecast(s, prof, 10.0)
    assert _state(s) == before
    # a ends at 100: b (4 GPUs) and d (2) start; c (8) waits for b (ends 150) and for d, which has
    # no run-time estimate: so c has no time, and says on what it waits
    assert f.starts == {"b": 100.0, "d": 100.0}
    assert "d" in f.unknown["c"] and "without a run-time estimate" in f.unknown["c"]
    assert f.complete
    # the snapshot still schedules as before: the forecast left no trace
    r = run_cycle(s, prof, 100.0, np.random.default_rng(0), apply=False)
    assert r.binds == []


def test_forecast_chains_starts_and_respects_the_budget() -> None:
    prof = load_profile("phalanx")
    s = Snapshot(_nodes())
    s.add_workload(_job("a", 8, 100.0, 0.0))
    run_cycle(s, prof, 0.0, np.random.default_rng(0), apply=True)
    for k in range(5):
        s.add_workload(_job(f"w{k}", 8, 10.0, 1.0 + k))
    f = forecast(s, prof, 1.0)
    assert [f.starts[f"w{k}"] for k in range(5)] == [100.0, 110.0, 120.0, 130.0, 140.0]
    cut = forecast(s, prof, 1.0, max_steps=2)
    assert not cut.complete and "budget" in cut.unknown["w4"]


def test_eta_text() -> None:
    assert eta_text(100.0, 100.0) == "now"
    assert eta_text(160.0, 100.0) == "in about 1 min"
    assert eta_text(None, 0.0, "waits on x") == "unknown: waits on x"


def test_fits_now_if_names_only_changes_that_were_seen_to_work() -> None:
    from phalanx.actions.whatif import fits_now_if

    prof = load_profile("phalanx")
    s = Snapshot(_nodes())
    s.add_workload(_job("low", 4, 100.0, 0.0, priority=0))
    s.add_workload(_job("mid", 2, 100.0, 1.0, priority=5))
    run_cycle(s, prof, 0.0, np.random.default_rng(0), apply=True)
    s.add_workload(_job("big", 4, 10.0, 2.0))  # 2 GPUs free: 4 do not fit
    run_cycle(s, prof, 2.0, np.random.default_rng(0), apply=True)
    before = _state(s)
    got = fits_now_if(s, prof, 2.0, "big")
    assert _state(s) == before
    assert got == [
        "fits now with 2 fewer GPUs (2 of 4 tasks)",
        "fits now if workload low (priority 0) is preempted",
    ]
