"""The shadow's dashboard in a real browser: its summary and verdicts read clean (no cluster needed)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from e2e_kube import wait_for
from kube_objects import node, pod
from page_text import text
from phalanx.k8s.view.server import serve
from test_shadow import _bound, _shadow

pytestmark = pytest.mark.browser


def test_the_dashboard_shows_the_shadow_summary_and_its_verdicts(chrome: Any) -> None:
    s = _shadow()
    s.store.replace("nodes", [node("n0", gpus=4), node("n1", gpus=4)])
    s.store.replace("pods", [_bound(pod("old", gpus=2, scheduler="default-scheduler"), "n0")])
    new = pod("new", gpus=1, scheduler="default-scheduler")
    s.store.apply("pods", "ADDED", new)
    s.step()
    s.store.apply("pods", "MODIFIED", _bound(new, "n1"))
    s.board.asked = time.time()  # someone looks: the board's state is built
    s.step()
    wait_for("the board's state", lambda: b'"nodes"' in s.board.state_json())
    server = serve(0, s.metrics, lambda: True, s.board, address="127.0.0.1")
    try:
        chrome.get(f"http://127.0.0.1:{server.server_port}/dashboard/")
        shown = wait_for("the shadow section", lambda: text(chrome, "#shadow"))
        assert "Shadow of default-scheduler" in shown and "1 placement(s) judged, 0 agreed" in shown
        assert "would have packed onto a fuller node" in shown
        recent = text(chrome, "#recent")
        assert "shadow disagree" in recent and "Phalanx: n0" in recent
        assert [e for e in chrome.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        server.shutdown()
