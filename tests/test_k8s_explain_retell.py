"""A waiting pod told again with the same reason is told at once RETELL_BURST times, then at most
every RETELL_S: every bind moves the numbers in every waiting pod's reason, and each Event is an
object in etcd (a full-cluster churn run wrote up to 70 a minute for one pod). A new reason, or a
pod remade, is told at once."""

from __future__ import annotations

from typing import Any

from phalanx.k8s.act.explain import RETELL_BURST, RETELL_S, Explainer


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def event(self, obj: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        self.events.append((obj["metadata"]["uid"], reason, message))


def _pod(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "uid": uid}}


def test_a_burst_of_new_texts_then_one_every_pause_a_new_reason_at_once() -> None:
    api, now = Recorder(), [100.0]
    ex = Explainer(api, clock=lambda: now[0])  # type: ignore[arg-type]

    def tell(reason: str, message: str, uid: str = "u1") -> list[tuple[str, str, str]]:
        ex._event("default/p", _pod(uid), reason, message, True, [100])
        ex.flush()
        return api.events

    try:
        tell("FailedScheduling", "0 of 8 GPUs free")
        for k in range(RETELL_BURST):  # pods still to come, GPUs moving: each told at once
            now[0] += 1
            assert tell("FailedScheduling", f"{k + 1} of 8 GPUs free")[-1][2] == f"{k + 1} of 8 GPUs free"
        told = len(api.events)
        now[0] += 1
        assert len(tell("FailedScheduling", "7 of 8 GPUs free")) == told  # too often: not yet
        assert tell("Preempting", "evicting q/a")[-1] == ("u1", "Preempting", "evicting q/a")  # at once
        assert tell("FailedScheduling", "1 of 8 GPUs free", uid="u2")[-1][0] == "u2"  # remade: at once
        told = len(api.events)
        for k in range(RETELL_BURST):
            now[0] += 1
            tell("Preempting", f"evicting q/a and {k} more")
        assert len(api.events) == told + RETELL_BURST
        assert len(tell("Preempting", "evicting q/a, q/b")) == told + RETELL_BURST  # burst spent
        now[0] += RETELL_S  # one turn back
        assert tell("Preempting", "evicting q/a, q/b")[-1] == ("u1", "Preempting", "evicting q/a, q/b")
        assert len(tell("Preempting", "evicting q/a, q/b, q/c")) == told + RETELL_BURST + 1
    finally:
        ex.close()
