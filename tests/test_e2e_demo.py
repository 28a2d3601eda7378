"""`phalanx demo`: the side-by-side run on a real API server says what each scheduler did."""

from __future__ import annotations

import pytest

from phalanx.k8s.lab import demo
from phalanx.k8s.lab.localcluster import Unavailable

pytestmark = pytest.mark.e2e


def test_the_demo_shows_stuck_gangs_and_double_promises_for_kube_scheduler_only(control_plane) -> None:
    try:
        ks, px = demo.run(quiet_s=2.0)
    except Unavailable as e:  # the session fixture already decided; kept for running this file alone
        pytest.skip(str(e))
    assert ks.stuck_gpus >= 2 and ks.overpromised >= 1  # 12 GPUs asked of 8, pod by pod; fractions ignored
    assert px.stuck_gpus == 0 and px.overpromised == 0
    rows = {r.name: r for r in px.rows}
    assert sorted(rows[g].bound for g in demo.GANGS) == [
        0,
        demo.GANG_SIZE,
    ]  # one gang whole, one waits whole
    assert rows[f"infer x{demo.INFER} ({demo.SHARE:g} GPU)"].bound == demo.INFER
