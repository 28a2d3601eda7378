"""The churn run, short (benchmarks/bench_churn.py; the 60-minute run is in docs/benchmarks.md):
45 s of mixed jobs on 60 nodes with two replicas, a kill -9 of the leader, kube-apiserver
restarted twice and etcd once, every watch dropped, 5 % of binds answered 500. Nothing bound
twice, no GPU given twice, no gang left partial but across a fault, no pod waiting without a word."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from e2e_kube import ROOT
from phalanx.k8s.lab.localcluster import Unavailable, find_assets

pytestmark = pytest.mark.e2e
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_a_short_churn_with_faults_loses_nothing(tmp_path: Path) -> None:
    try:
        find_assets()
    except Unavailable as e:
        pytest.skip(f"no Kubernetes control plane: {e}")
    import bench_churn

    r = bench_churn.run(0.75, 60, tmp_path, rate=1.0, kill_every=30, drop_every=20, bind_500=0.05)
    assert r["pods_bound"] >= 20 and r["proxy"]["binds_500"] >= 1, r
    assert any("kill -9 leader" in f for f in r["faults"]), r["faults"]
    assert r["double_binds"] == [] and r["gpu_given_twice"] == [], r
    assert r["gangs_partial_over_2s_not_near_a_fault"] == 0, r["gangs_partial_detail"]
    assert r["waited_no_event_count"] == 0, r["waited_over_60s_with_no_event"]
    assert r["evictions"] == 0  # nothing preempts here: an eviction would be a lost pod
