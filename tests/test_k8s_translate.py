"""API objects -> core model: nodes (GFD labels, MIG, topology annotation), pods, groups, queues."""

import pytest

from kube_objects import node, pod, pod_group, queue, topology
from phalanx.core.errors import SpecError
from phalanx.core.model import GpuKind
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.groups import group_pods, workload_of
from phalanx.k8s.read.nodes import parse_node
from phalanx.k8s.read.pods import parse_pod
from phalanx.k8s.read.queues import build_tree
from phalanx.k8s.read.world import build_world

CFG = AdapterConfig()


def test_node_from_gfd_labels_and_allocatable():
    n = parse_node(node("n1", labels={"topology.phalanx.io/rack": "r1"}, extra={"rdma/hca": "4"}), CFG)
    assert n.cpu_milli == 112_000 and n.memory_mib == 2 * 1024 * 1024
    assert [g.model for g in n.gpus] == ["H100"] * 8 and n.gpus[0].memory_mib == 81559
    assert [g.pcie_switch for g in n.gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [nic.pcie_switch for nic in n.nics] == [0, 1, 2, 3]  # one NIC beside each pair of GPUs
    assert n.topology == {"rack": "r1"}


def test_mig_node_lays_out_instances_from_its_counts():
    obj = node(
        "mig",
        gpus=0,
        product="NVIDIA-A100-SXM4-40GB",
        memory=40960,
        labels={"nvidia.com/gpu.count": "2", "nvidia.com/mig.config": "all-balanced"},
        extra={"nvidia.com/mig-3g.20gb": "2", "nvidia.com/mig-1g.5gb": "4"},
    )
    n = parse_node(obj, CFG)
    assert all(g.mig_enabled for g in n.gpus) and len(n.gpus) == 2
    placed = sorted((i, m.profile, m.start) for i, ms in n.mig_instances.items() for m in ms)
    # biggest first, first fit: both 3g on GPU 0, the four 1g on GPU 1
    assert placed == [(0, "3g.20gb", 0), (0, "3g.20gb", 4)] + [(1, "1g.5gb", s) for s in range(4)]


def test_device_topology_annotation_and_its_errors():
    topo = topology(
        [{"index": 0, "pcieSwitch": 0, "nvlinkGroup": 0}, {"index": 1, "pcieSwitch": 1, "nvlinkGroup": 0}],
        [{"index": 0, "pcieSwitch": 1, "bandwidthGbps": 400}],
    )
    n = parse_node(node("t", gpus=2, annotations={"phalanx.io/device-topology": topo}), CFG)
    assert [g.pcie_switch for g in n.gpus] == [0, 1] and n.nics[0].pcie_switch == 1
    bad = node("t", annotations={"phalanx.io/device-topology": '{"gpus": [{"index": -1}]}'})
    with pytest.raises(SpecError, match=r"node t: annotation phalanx.io/device-topology.gpus.0.index"):
        parse_node(bad, CFG)
    with pytest.raises(SpecError, match="not valid JSON"):
        parse_node(node("t", annotations={"phalanx.io/device-topology": "{oops"}), CFG)


def test_pod_requests_in_every_dialect():
    assert parse_pod(pod("a", gpus=2), CFG).request.gpu.devices == 2
    kai = parse_pod(pod("b", annotations={"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"}), CFG)
    assert (
        kai.request.gpu.kind is GpuKind.FRACTION
        and kai.request.gpu.milli == 250
        and kai.request.gpu.devices == 2
    )
    mem = parse_pod(pod("c", annotations={"gpu-memory": "8000"}), CFG).request.gpu
    assert mem.kind is GpuKind.MEMORY and mem.memory_mib == 8000
    hami = parse_pod(pod("d", gpus=1, resources={"nvidia.com/gpumem": "4096"}), CFG).request.gpu
    assert hami.kind is GpuKind.MEMORY and hami.memory_mib == 4096
    pct = parse_pod(pod("e", gpus=1, resources={"nvidia.com/gpumem-percentage": "50"}), CFG).request.gpu
    assert pct.kind is GpuKind.FRACTION and pct.milli == 500
    mig = parse_pod(pod("f", resources={"nvidia.com/mig-1g.10gb": "1"}), CFG).request.gpu
    assert mig.kind is GpuKind.MIG and mig.mig_profile == "1g.10gb"
    assert parse_pod(pod("g", cpu="500m", mem="512Mi"), CFG).request.cpu_milli == 500


@pytest.mark.parametrize(
    ("annotations", "resources", "message"),
    [
        ({"gpu-fraction": "1.5"}, {}, "a GPU fraction must be in (0, 1]"),
        ({"gpu-fraction": "half"}, {}, "expected a number"),
        ({"gpu-fraction": "0.5", "gpu-memory": "100"}, {}, "one way only"),
        ({}, {"nvidia.com/mig-9g.99gb": "1"}, "unknown MIG profile"),
        ({}, {"nvidia.com/gpu": "1.5"}, "whole number"),
    ],
)
def test_bad_pod_requests_name_the_pod_and_the_key(annotations, resources, message):
    with pytest.raises(SpecError) as e:
        parse_pod(pod("bad", ns="team", annotations=annotations, resources=resources), CFG)
    assert "pod team/bad" in str(e.value) and message in str(e.value)


def test_grouping_by_pod_group_by_owner_and_alone():
    pods = [
        parse_pod(pod(f"w{k}", gpus=8, annotations={"scheduling.k8s.io/group-name": "pg"}), CFG)
        for k in range(3)
    ]
    pods += [parse_pod(pod(f"j{k}", gpus=1, owner=("Job", "train")), CFG) for k in range(2)]
    pods += [parse_pod(pod("solo"), CFG)]
    groups = {
        g.name: g
        for g in group_pods(pods, [pod_group("pg", 2, api="scheduling.volcano.sh/v1beta1", queue="q")])
    }
    assert groups["default/pg"].min_available == 2 and groups["default/pg"].queue == "q"
    assert groups["default/Job/train"].min_available == 2 and len(groups["default/Job/train"].pods) == 2
    assert groups["default/solo"].min_available == 1
    short = group_pods(pods[:1], [pod_group("pg", 4)])[0]
    # short of pods is not a problem with the group: it waits for them (issue 27)
    assert not short.problems and short.missing == 3
    assert "waiting for 3 more pods" in short.waiting and "minMember 4 exceeds the 1 pod(s)" in short.waiting


def test_pod_group_preemption_and_runtime_fields_win_over_pod_annotations():
    notes = {
        "phalanx.io/pod-group": "pg",
        "phalanx.io/checkpoint-interval": "60",
        "phalanx.io/preemptible": "true",
    }
    pods = [parse_pod(pod(f"w{k}", gpus=1, annotations=notes), CFG) for k in range(2)]
    pg = pod_group("pg", 2, preemptible=False, checkpointIntervalSeconds=900, estimatedRuntimeSeconds=3600)
    (g,) = group_pods(pods, [pg])
    w = workload_of(g, "default")
    assert (w.preemptible, w.checkpoint_interval, w.estimated_runtime) == (False, 900.0, 3600.0)
    (plain,) = group_pods(pods, [pod_group("pg", 2)])
    assert (
        workload_of(plain, "default").checkpoint_interval == 60.0
    )  # the annotation, when the spec is silent
    (bad,) = group_pods(pods, [pod_group("pg", 2, preemptible="no", estimatedRuntimeSeconds=-5)])
    assert "spec.preemptible" in bad.problems[0] and "true or false" in bad.problems[0]


def test_the_latest_reported_checkpoint_among_the_pods_is_the_workloads(caplog):
    """`phalanx.io/last-checkpoint` (RFC 3339, written by the job): the latest among the gang's pods;
    one that is not a time with an offset is logged, naming the pod, and left out."""

    def group(*values):
        pods = []
        for k, v in enumerate(values):
            notes = {"phalanx.io/pod-group": "pg", "phalanx.io/checkpoint-interval": "600"}
            if v is not None:
                notes["phalanx.io/last-checkpoint"] = v
            pods.append(parse_pod(pod(f"w{k}", gpus=1, annotations=notes), CFG))
        (g,) = group_pods(pods, [pod_group("pg", len(values))])
        return workload_of(g, "default")

    assert group(None, None).last_checkpoint is None
    w = group("2026-12-01T10:00:00Z", "2026-12-01T10:30:00+00:00", None)
    assert w.last_checkpoint == 1_796_121_000.0  # 10:30 UTC, the later one
    assert w.checkpoint_interval == 600.0
    caplog.set_level("WARNING", logger="phalanx.k8s.read.groups")
    bad = group("yesterday", "2026-12-01T10:00:00", "2026-12-01T09:00:00-01:00")
    assert bad.last_checkpoint == 1_796_119_200.0  # 09:00 at -01:00 is 10:00 UTC
    logged = caplog.text
    assert "default/w0" in logged and "'yesterday'" in logged  # not a time
    assert "default/w1" in logged  # no offset: whose clock is unknown
    assert "default/w2" not in logged


def test_queue_dialects_and_bad_queues_are_left_out():
    objs = [
        queue("research", 8),
        queue("vision", 4, parent="research"),
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": "kai-team"},
            "spec": {
                "resources": {"gpu": {"quota": 2, "limit": -1, "overQuotaWeight": 2}, "cpu": {"quota": 4000}}
            },
        },
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": "vc"},
            "spec": {"weight": 3, "capability": {"nvidia.com/gpu": 6}, "deserved": {"nvidia.com/gpu": 2}},
        },
        queue("broken", "lots"),
        queue("orphan", 1, parent="broken"),
    ]
    tree, problems = build_tree(objs, "default")
    assert tree is not None
    assert tree.deserved["vision"][0] == 4000 and tree.deserved["kai-team"][1] == 4000
    assert tree.limit["vc"][0] == 6000 and tree.weight["vc"][0] == 3
    assert set(problems) == {"broken", "orphan"} and "left out" in problems["orphan"]
    assert tree.is_leaf("default")


def test_world_blocks_bad_groups_and_keeps_going():
    nodes = [node("n1", gpus=8)]
    pods = [
        pod("ok", gpus=1),
        pod("badq", gpus=1, labels={"kai.scheduler/queue": "nope"}),
        pod("frac", annotations={"gpu-fraction": "2"}),
        pod("other", gpus=2, scheduler="default-scheduler", node="n1"),
    ]
    w = build_world(nodes, pods, [], [queue("team", 4)], CFG, now=0.0)
    assert set(w.pods) == {"default/ok"}
    assert "queue 'nope' does not exist" in w.blocked["default/badq"][0]
    assert "default/frac" in w.pod_problems and "fraction" in w.pod_problems["default/frac"]
    assert int(w.snapshot.cluster.gpu_whole_free.sum()) == 6  # the other scheduler's pod holds 2


def test_world_rebuilds_bound_pods_from_their_annotations():
    notes = {"phalanx.io/node": "n1", "phalanx.io/gpu-devices": "3", "phalanx.io/gpu-fraction": "0.5"}
    pods = [pod("half", annotations={"gpu-fraction": "0.5", **notes}, node="n1")]
    w = build_world([node("n1", gpus=4)], pods, [], [], CFG, now=100.0)
    a = w.snapshot.allocations["default/half"]
    assert w.snapshot.nodes[a.node].gpus[a.devices.gpus[0]].index == 3 and a.devices.milli == 500
    pending = [pod("p", gpus=1, annotations={"phalanx.io/node": "n1", "phalanx.io/gpu-devices": "0"})]
    w2 = build_world([node("n1", gpus=4)], pending, [], [], CFG, now=0.0)
    assert [b.task for b in w2.unfinished] == ["default/p"]  # chosen before a restart: finish the bind
