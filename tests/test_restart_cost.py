"""Restart cost in victim choice (issue 40): an eviction costs the victim's lost work and its restart.

A workload that just checkpointed loses little work, but restarting its GPUs (rendezvous, image,
data loader, NCCL init) is paid by all of them: with the action's `restart_s`, a preemptor of one
GPU takes the 1-GPU job that lost 20 s of work, not the 4-GPU job that checkpointed a moment ago.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from builders import Scenario, make_node, make_workload
from kube_objects import pod
from phalanx.core.errors import SpecError
from phalanx.core.model import Workload
from phalanx.profiles import compile_profile


def _profile(restart_s: float | None) -> object:
    args = {} if restart_s is None else {"restart_s": restart_s}
    return compile_profile(
        {
            "name": "p",
            "tie_break": "name",
            "actions": [{"name": "allocate"}, {"name": "preempt", "args": args}],
            "order": [{"name": "priority"}],
        }
    )


def _victim(restart_s: float | None, big: Workload | None = None) -> list[str]:
    """Who is evicted for a 1-GPU preemptor: `big` (4 GPUs, checkpoints every 10 s, one just
    taken) or `small` (1 GPU, no checkpoint, 21 s of work)."""
    sc = Scenario([make_node("n").cpu(64).memory("512Gi").gpus(5).build()], [], profile=_profile(restart_s))
    sc.add(big or make_workload("big").podset("p", gpu=4).checkpoints(10).build())
    sc.add(make_workload("small").podset("p", gpu=1).build())
    sc.cycle()  # both bound at t=1
    while sc.clock < 21:
        sc.cycle()
    sc.add(make_workload("high").podset("p", gpu=1).priority(5).build())
    result = sc.cycle()  # t=22: big lost 1 s x 4 GPUs since its checkpoint at 21, small 21 s x 1
    return sorted(e.workload for e in result.evictions)


def test_lost_work_alone_evicts_the_big_job_that_just_checkpointed() -> None:
    assert _victim(None) == ["big"]
    assert _victim(0) == ["big"]


def test_with_the_restart_the_small_job_goes_instead() -> None:
    assert _victim(60) == ["small"]  # big: 4 + 240 GPU-s, small: 21 + 60


def test_a_workloads_own_restart_time_wins_over_the_actions() -> None:
    cheap = replace(make_workload("big").podset("p", gpu=4).checkpoints(10).build(), restart_s=0.0)
    assert _victim(60, cheap) == ["big"]


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_a_bad_restart_time_is_one_clear_error(bad: float) -> None:
    with pytest.raises(SpecError, match="restart_s"):
        replace(make_workload("w").podset("p", gpu=1).build(), restart_s=bad)
    with pytest.raises(SpecError, match="restart_s must be >= 0 s"):
        _profile(bad)


def test_kubernetes_reads_a_pods_restart_seconds() -> None:
    from phalanx.k8s import keys
    from phalanx.k8s.config import AdapterConfig
    from phalanx.k8s.read.groups import group_pods, workload_of
    from phalanx.k8s.read.pods import parse_pod

    def workload(value: str) -> Workload:
        p = parse_pod(pod("a", gpus=1, annotations={keys.RESTART_SECONDS: value}), AdapterConfig())
        (g,) = group_pods([p], [])
        return workload_of(g, "default")

    assert workload("300").restart_s == 300.0 and workload("0s").restart_s == 0.0
    with pytest.raises(SpecError, match=r"phalanx\.io/restart-seconds.*must be >= 0 seconds"):
        workload("-5")
