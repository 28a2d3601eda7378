"""Start forecasts and "fits now if" on a real API server: in the pending Event and in `phalanx status`."""

from __future__ import annotations

import pytest

from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod
from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.view.status import collect

pytestmark = pytest.mark.e2e


def test_waiting_pod_is_told_when_it_should_start_and_what_would_start_it_now(kube: Kube) -> None:
    kube.api.create("nodes", node("n0", gpus=8))
    kube.create(pod("first", gpus=8, annotations={keys.ESTIMATED_RUNTIME: "1800"}))
    with running(kube):
        wait_for("first bound", lambda: kube.node_of("first") == "n0", timeout=20)
        kube.run_pod("first", started_s_ago=600)  # a third of its estimated 30 minutes is done
        kube.create(pod("second", gpus=8))

        def said() -> str:
            return " ".join(m for r, m in kube.events("second") if r == "FailedScheduling")

        text = wait_for(
            "second told when", lambda: "expected to start around" in said() and said(), timeout=30
        )
        assert "(forecast)" in text
        assert "fits now if workload default/first (priority 0) is preempted" in text
    st = collect(kube.api, AdapterConfig(profile="phalanx"))
    (row,) = [r for r in st.pending if r["workload"] == "default/second"]
    assert str(row["forecast"]).startswith("expected to start around")
