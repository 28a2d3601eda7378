"""A waiting pod is told again with the same reason at most every RETELL_S: every bind moves the
numbers in every waiting pod's reason, and each Event is an object in etcd (a full-cluster churn
run wrote up to 70 a minute for one pod). A new reason, or a pod remade, is told at once."""

from __future__ import annotations

from typing import Any

from phalanx.k8s.act.explain import RETELL_S, Explainer


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def event(self, obj: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        self.events.append((obj["metadata"]["uid"], reason, message))


def _pod(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "uid": uid}}


def test_the_same_reason_with_moved_numbers_waits_for_the_pause_a_new_reason_does_not() -> None:
    api, now = Recorder(), [100.0]
    ex = Explainer(api, clock=lambda: now[0])  # type: ignore[arg-type]

    def tell(reason: str, message: str, uid: str = "u1") -> list[tuple[str, str, str]]:
        ex._event("default/p", _pod(uid), reason, message, True, [100])
        ex.flush()
        return api.events

    try:
        first = [("u1", "FailedScheduling", "0 of 8 GPUs free")]
        assert tell("FailedScheduling", "0 of 8 GPUs free") == first
        now[0] += 1
        assert len(tell("FailedScheduling", "1 of 8 GPUs free")) == 1  # numbers moved: not yet
        now[0] += 1
        assert tell("Preempting", "evicting q/a")[-1] == ("u1", "Preempting", "evicting q/a")  # at once
        assert tell("FailedScheduling", "1 of 8 GPUs free", uid="u2")[-1][0] == "u2"  # remade: at once
        now[0] += RETELL_S
        assert tell("Preempting", "evicting q/a, q/b")[-1] == ("u1", "Preempting", "evicting q/a, q/b")
        assert len(tell("Preempting", "evicting q/a, q/b")) == 4  # said already
    finally:
        ex.close()
