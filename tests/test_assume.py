"""The scheduler's assumed evictions end when the API server will say they end."""

from phalanx.k8s import keys
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


PLAN = '{"default/s": ["uid-s", {"phalanx.io/node-intent": "n0"}]}'


def _pending(name: str, rv: str) -> dict[str, object]:
    return {"metadata": {"namespace": "default", "name": name, "resourceVersion": rv}, "spec": {}}


def _plan_of(p: dict[str, object]) -> str | None:
    meta = p["metadata"]
    assert isinstance(meta, dict)
    return (meta.get("annotations") or {}).get(keys.GANG_PLAN)


def test_a_plan_written_for_a_waiting_gang_is_seen_until_the_watch_shows_a_newer_pod() -> None:
    a = Assumptions(ttl=60)
    a.planned("default/s", "default/s", PLAN, "7", NOW)
    assert a.stamp()[2] == ("default/s",)
    (out,) = a.apply([_pending("s", "7")], NOW + 0.5)  # the watch has not shown the write yet
    assert _plan_of(out) == PLAN and a.overlay["default/s"] is out
    (out,) = a.apply([_pending("s", "7")], NOW + 1)  # nor a cycle later: still assumed
    assert _plan_of(out) == PLAN
    shown = _pending("s", "8")  # the write, or one after it: the store says what the pod holds
    (out,) = a.apply([shown], NOW + 2)
    assert out is shown and _plan_of(out) is None and not a.plans and not a


def test_a_plan_ends_with_its_pod_its_undoing_or_its_ttl() -> None:
    a = Assumptions(ttl=10)
    a.planned("default/s", "default/s", PLAN, "7", NOW)
    a.planned("default/t", "default/t", PLAN, "3", NOW)
    assert a.apply([_pending("t", "3")], NOW + 1)  # s is gone from the store
    assert set(a.plans) == {"default/t"}
    a.unplanned({"default/t"})  # its gang was undone and its plan cleared
    (out,) = a.apply([_pending("t", "3")], NOW + 2)
    assert _plan_of(out) is None and not a
    a.planned("default/t", "default/t", PLAN, "3", NOW)
    (out,) = a.apply([_pending("t", "3")], NOW + 10)
    assert _plan_of(out) is None and not a.plans  # the watch never caught up: not assumed for ever
