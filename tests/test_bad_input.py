"""Bad input gets a clear error that names the field, never a traceback."""

import pytest

from builders import make_node, make_workload
from phalanx.core.errors import SpecError
from phalanx.core.model import GpuRequest, PodSet, TaskRequest, Workload
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import compile_profile, load_profile
from phalanx.spec.cluster import parse_cluster
from phalanx.spec.workloads import parse_workloads


def wl_yaml(**podset):
    return {"workloads": [{"name": "w", "podsets": [{"name": "p", **podset}]}]}


def test_fraction_above_one():
    with pytest.raises(
        SpecError,
        match=r"workloads\[0\]\.podsets\[0\]\.gpu\.fraction: a GPU fraction must be in \(0, 1\); got 1\.5",
    ):
        parse_workloads(wl_yaml(gpu_fraction=1.5), "w.yaml")


def test_unknown_mig_profile():
    with pytest.raises(SpecError, match=r"podsets\[0\]\.gpu\.mig_profile: unknown MIG profile '2g\.99gb'"):
        parse_workloads(wl_yaml(mig="2g.99gb"), "w.yaml")


def test_negative_cpu():
    with pytest.raises(SpecError, match=r"podsets\[0\]\.cpu: CPU must be >= 0"):
        parse_workloads(wl_yaml(cpu=-2), "w.yaml")
    with pytest.raises(SpecError, match="cpu_milli: CPU request must be >= 0"):
        TaskRequest(cpu_milli=-1)


def test_unknown_gpu_model():
    snap = Snapshot([make_node("n").gpus(1, model="H100").build()])
    with pytest.raises(SpecError, match=r"gpu_models: unknown GPU model\(s\) B300"):
        snap.add_workload(make_workload("w").podset("p", gpu=1, models="B300").build())


def test_min_available_larger_than_tasks():
    with pytest.raises(SpecError, match="min_available 5 is larger than the 4 tasks"):
        make_workload("w").podset("p", 4, gpu=1).min_available(5).build()
    data = {"workloads": [{"name": "w", "min_available": 9, "podsets": [{"name": "p", "count": 2}]}]}
    with pytest.raises(SpecError, match=r"w\.yaml: workloads\[0\]\.min_available"):
        parse_workloads(data, "w.yaml")


def test_unknown_field_and_wrong_type_are_located():
    with pytest.raises(SpecError, match=r"workloads\[0\]\.podsets\[0\]\.gpus: unknown field"):
        parse_workloads(wl_yaml(gpus=1), "w.yaml")
    with pytest.raises(SpecError, match=r"podsets\[0\]\.count"):
        parse_workloads(wl_yaml(count="many"), "w.yaml")


def test_two_gpu_kinds_at_once():
    with pytest.raises(SpecError, match="give only one of gpu, gpu_fraction"):
        parse_workloads(wl_yaml(gpu=1, gpu_fraction=0.5), "w.yaml")


def test_bad_cluster_quantities_and_duplicates():
    with pytest.raises(
        SpecError, match=r"c\.yaml: nodes\[0\]\.memory: memory \(MiB\) must be a number or a quantity"
    ):
        parse_cluster({"nodes": [{"name": "a", "cpu": 8, "memory": "lots"}]}, "c.yaml")
    with pytest.raises(SpecError, match="duplicate node name"):
        nodes = parse_cluster({"nodes": [{"name": "a", "cpu": 8, "memory": 8}] * 2}, "c.yaml").nodes
        Snapshot(nodes)
    with pytest.raises(SpecError, match="has no known MIG geometry"):
        parse_cluster(
            {
                "nodes": [
                    {
                        "name": "a",
                        "cpu": 8,
                        "memory": 8,
                        "gpus": {"count": 1, "model": "T4", "memory": "16Gi", "mig": True},
                    }
                ]
            },
            "c.yaml",
        )


def test_invalid_pre_partitioned_mig_layout():
    data = {
        "nodes": [
            {
                "name": "a",
                "cpu": 8,
                "memory": 8,
                "gpus": [
                    {
                        "model": "H100",
                        "memory": "80Gi",
                        "mig": True,
                        "mig_instances": [
                            {"profile": "3g.40gb", "start": 0},
                            {"profile": "4g.40gb", "start": 0},
                        ],
                    }
                ],
            }
        ]
    }
    nodes = parse_cluster(data, "c.yaml").nodes
    with pytest.raises(SpecError, match="overlaps another instance"):
        Snapshot(nodes)


def test_unknown_topology_level():
    snap = Snapshot([make_node("n").gpus(1).build()], topology_levels=["rack"])
    with pytest.raises(SpecError, match="unknown topology level 'pod'"):
        snap.add_workload(make_workload("w").podset("p", gpu=1).topology("pod").build())


def test_duplicate_workload_and_empty_podsets():
    snap = Snapshot([make_node("n").build()])
    snap.add_workload(make_workload("w").podset("p").build())
    with pytest.raises(SpecError, match="already exists"):
        snap.add_workload(make_workload("w").podset("p").build())
    with pytest.raises(SpecError, match="at least one pod set"):
        Workload("x", ())
    with pytest.raises(SpecError, match="count must be >= 1"):
        PodSet("p", 0, TaskRequest())
    with pytest.raises(SpecError, match="GPU device count"):
        GpuRequest.fraction(0.5, devices=0)


def test_bad_profiles():
    with pytest.raises(SpecError, match="unknown profile 'nope'"):
        load_profile("nope")
    with pytest.raises(SpecError, match=r"scorers\[0\]: unknown plugin 'magic'"):
        compile_profile({"name": "x", "actions": [{"name": "allocate"}], "scorers": [{"name": "magic"}]})
    with pytest.raises(SpecError, match=r"actions\[0\]\.args: bad arguments for allocate"):
        compile_profile({"name": "x", "actions": [{"name": "allocate", "args": {"speed": 3}}]})
    bad_value = {"name": "preempt", "args": {"by": "order", "order_victims": "some"}}
    with pytest.raises(
        SpecError, match=r"actions\[1\]\.args: bad arguments for preempt: order_victims must be"
    ):
        compile_profile({"name": "x", "actions": [{"name": "allocate"}, bad_value]}, "p.yaml")
