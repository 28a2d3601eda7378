"""When the store shows no reservation pod for a GPU that shares run on: whether it is really gone.

The store lags behind a reservation pod made a moment ago, so for a slot touched lately the API
server is asked; a killed reservation pod's shares must be evicted at once, not a minute later
(seen on real kubelets, tests/test_nodes_side.py)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.k8s.act.shares import Shares, reservation_name
from phalanx.k8s.config import AdapterConfig


class Api:
    """Answers GET of one pod name with `obj`, and counts the calls."""

    def __init__(self, obj: dict[str, Any] | None) -> None:
        self.obj = obj
        self.calls: list[str] = []

    def get(self, kind: Any, name: str, ns: str) -> dict[str, Any] | None:
        self.calls.append(f"{ns}/{name}")
        return self.obj


def shares(obj: dict[str, Any] | None, now: list[float]) -> tuple[Shares, Api]:
    api = Api(obj)
    s = Shares(api, AdapterConfig(), retry=lambda f: f(), clock=lambda: now[0])  # type: ignore[arg-type]
    return s, api


POD = {"metadata": {"name": reservation_name("n1", 2)}, "status": {"phase": "Running"}}


@pytest.mark.parametrize(
    ("obj", "gone"),
    [
        (None, True),  # 404: killed
        ({**POD, "metadata": {**POD["metadata"], "deletionTimestamp": "2026-12-01T00:00:00Z"}}, True),
        ({**POD, "status": {"phase": "Failed"}}, True),
        (POD, False),  # the store lags: it is there
    ],
)
def test_a_slot_touched_lately_asks_the_api_server(obj: dict[str, Any] | None, gone: bool) -> None:
    now = [1000.0]
    s, api = shares(obj, now)
    s._touch(("n1", 2), POD)
    now[0] += 3
    assert s.gone(("n1", 2)) is gone
    assert api.calls == [f"{AdapterConfig().reservation_namespace}/{reservation_name('n1', 2)}"]
    # once confirmed gone, the slot is forgotten: no second question
    assert s.recent(("n1", 2)) is not gone


def test_a_slot_not_touched_lately_trusts_the_store() -> None:
    now = [1000.0]
    s, api = shares(POD, now)
    assert s.gone(("n1", 2)) is True
    s._touch(("n1", 2), POD)
    now[0] += 120
    assert s.gone(("n1", 2)) is True and api.calls == []
