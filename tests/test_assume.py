"""The scheduler's assumed evictions end when the API server will say they end."""

from phalanx.k8s.loop.assume import Assumptions
from phalanx.k8s.read.pods import timestamp

NOW = 1_790_000_000.4  # a cycle's clock, mid-second


def _pod(name: str, grace: int | None = None) -> dict[str, object]:
    spec: dict[str, object] = {"nodeName": "n0"}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"metadata": {"namespace": "default", "name": name}, "spec": spec}


def test_an_assumed_eviction_ends_after_the_pods_grace_period() -> None:
    a = Assumptions()
    a.evicted("default/slow", NOW)
    a.evicted("default/quick", NOW)
    a.evicted("default/now", NOW)
    seen = {
        p["metadata"]["name"]: p["metadata"]["deletionTimestamp"]
        for p in a.apply([_pod("slow"), _pod("quick", grace=5), _pod("now", grace=0)], NOW + 0.2)
    }
    # whole seconds, as the API server writes deletionTimestamp; 30 s when the pod says nothing
    assert {k: timestamp(v) for k, v in seen.items()} == {
        "slow": int(NOW) + 30,
        "quick": int(NOW) + 5,
        "now": int(NOW),
    }


def test_the_watchs_own_deletion_timestamp_wins() -> None:
    a = Assumptions()
    a.evicted("default/v", NOW)
    shown = _pod("v")
    shown["metadata"]["deletionTimestamp"] = "2026-12-01T20:36:00Z"  # type: ignore[index]
    (out,) = a.apply([shown], NOW + 1)
    assert out["metadata"]["deletionTimestamp"] == "2026-12-01T20:36:00Z"
