"""Staging requests on Nodes: written where a waiting gang is about to start, cleared when no longer
wanted, and requests another leader left found and cleared too, without reading every Node each
cycle (issue 34)."""

from __future__ import annotations

import json
from typing import Any

from builders import Scenario, make_node, make_workload
from phalanx.k8s import keys
from phalanx.k8s.act.staging import StageRequests
from phalanx.k8s.decide.insight import Insight


class Nodes:
    """Node objects as the watch cache holds them; patches land at once; reads counted."""

    def __init__(self, names: list[str]) -> None:
        self.objs = {n: {"metadata": {"name": n, "annotations": {}}} for n in names}
        self.patches: list[tuple[str, Any]] = []
        self.listed = 0

    def patch(self, kind: object, name: str, ns: object, body: dict[str, Any]) -> None:
        self.patches.append((name, body["metadata"]["annotations"][keys.STAGE_DATASETS]))
        notes = self.objs[name]["metadata"]["annotations"]
        text = body["metadata"]["annotations"][keys.STAGE_DATASETS]
        if text is None:
            notes.pop(keys.STAGE_DATASETS, None)
        else:
            notes[keys.STAGE_DATASETS] = text

    def all(self) -> list[dict[str, Any]]:
        self.listed += 1
        return list(self.objs.values())


def test_requests_follow_the_forecast_and_another_leaders_are_cleared() -> None:
    sc = Scenario([make_node(f"n{k}").gpus(8).build() for k in range(3)])
    sc.add(make_workload("default/next").podset("p", gpu=8, dataset="default/imagenet").build())
    nodes = Nodes(["n0", "n1", "n2"])
    nodes.objs["n2"]["metadata"]["annotations"][keys.STAGE_DATASETS] = (
        '{"default/old":"x"}'  # a leader before
    )
    st = StageRequests(nodes, ttl=60.0)  # type: ignore[arg-type]
    ahead = Insight(starts={"default/next": 110.0}, nodes={"default/next": [1]})
    st.update(sc.snapshot, ahead, nodes.all, nodes.objs.get, 100.0)
    assert sorted(nodes.patches) == [
        ("n1", json.dumps({"default/imagenet": "default/next"}).replace(" ", "")),
        ("n2", None),
    ]
    nodes.patches.clear()
    st.update(sc.snapshot, ahead, nodes.all, nodes.objs.get, 101.0)  # nothing changed: nothing written
    assert nodes.patches == [] and nodes.listed == 1  # and not every Node read again
    st.update(sc.snapshot, Insight(), nodes.all, nodes.objs.get, 200.0)  # no longer wanted, ttl over
    assert nodes.patches == [("n1", None)]
    nodes.objs["n0"]["metadata"]["annotations"][keys.STAGE_DATASETS] = '{"default/b":"y"}'  # another leader's
    nodes.patches.clear()
    st.update(sc.snapshot, Insight(), nodes.all, nodes.objs.get, 270.0)  # a ttl after the last look
    assert nodes.patches == [("n0", None)] and nodes.listed == 3


def test_a_start_beyond_the_horizon_says_when_it_comes_within() -> None:
    """The scheduler's loop sleeps while work waits: staging says when to look again (issue 34)."""
    sc = Scenario([make_node(f"n{k}").gpus(8).build() for k in range(2)])
    sc.add(make_workload("default/later").podset("p", gpu=8, dataset="default/imagenet").build())
    sc.add(make_workload("default/nodata").podset("p", gpu=8).build())
    nodes = Nodes(["n0", "n1"])
    st = StageRequests(nodes, ttl=60.0)  # type: ignore[arg-type]
    ahead = Insight(
        starts={"default/later": 500.0, "default/nodata": 300.0},
        nodes={"default/later": [1], "default/nodata": [0]},
    )
    st.update(sc.snapshot, ahead, nodes.all, nodes.objs.get, 100.0)
    assert nodes.patches == [] and st.due == 440.0  # 60 s ahead of its start; no data, no wake
    st.update(sc.snapshot, ahead, nodes.all, nodes.objs.get, 440.0)
    assert [n for n, _ in nodes.patches] == ["n1"] and st.due == float("inf")
