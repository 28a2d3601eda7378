"""A pod remade under the same name is a new pod to tell (in-process fake API server).

Jobs and training operators remake an evicted pod under its old name; what had been said of the
old one (kept by name) kept the new one's FailedScheduling Event from being written when the
message was the same: a full-cluster churn run found gang members waiting minutes with no Event.
"""

from __future__ import annotations

from fakeapi import FakeApi
from kube_objects import node, pod
from test_k8s_adapter import events, fake, scheduler, step

__all__ = ["fake"]  # the fixture


def test_a_pod_remade_under_its_name_gets_its_own_failed_scheduling_event(fake: FakeApi) -> None:
    fake.put(node("n0", gpus=1))
    fake.put(pod("big", gpus=2))  # never fits: the same reason every time
    s = scheduler(fake)
    step(s, fake)
    assert [r for r, _ in events(fake, "big")] == ["FailedScheduling"]
    step(s, fake)
    assert [r for r, _ in events(fake, "big")] == ["FailedScheduling"]  # said once, not every cycle
    fake.delete("v1", "pods", "big", "default")
    again = pod("big", gpus=2)
    again["metadata"]["uid"] = "uid-default-big-2"
    fake.put(again)
    step(s, fake)
    told = [e for e in fake.all("v1", "events") if e["involvedObject"]["name"] == "big"]
    assert [e["involvedObject"]["uid"] for e in told] == ["uid-default-big", "uid-default-big-2"]
    s.stop()
