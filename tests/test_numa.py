"""NUMA alignment as the kubelet's Topology Manager enforces it (core.numa): a node whose policy
is single-numa-node (or restricted, for what fits one NUMA node) gets a task only on one NUMA node,
GPUs, NICs and exclusive CPUs alike; best-effort prefers one; none does not look."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from builders import Scenario, make_node, make_workload
from phalanx.core.errors import SpecError
from phalanx.core.model import Node, Workload


def node(policy: str, cpus: tuple[int, ...] = ()) -> Node:
    """8 GPUs, 0-3 on NUMA node 0 and 4-7 on NUMA node 1; 112 cores."""
    n = make_node("n").cpu(112).memory("1Ti").gpus(8).build()
    return replace(n, numa_policy=policy, numa_cpu_milli=cpus)


def job(name: str, gpus: int, cpu: float = 1, exclusive: bool = False) -> Workload:
    w = make_workload(name).podset("p", gpu=gpus, cpu=cpu).build()
    ps = w.podsets[0]
    return replace(w, podsets=(replace(ps, request=replace(ps.request, exclusive_cpu=exclusive)),))


def numa_of(sc: Scenario, workload: str) -> set[int]:
    gpus = sc.bind_of(f"{workload}/p-0").gpus
    return {g // 4 for g in gpus}  # the builder's GPU index k is on NUMA node k // 4


def three_three_two(policy: str) -> Scenario:
    sc = Scenario([node(policy)])
    for name, gpus in (("a", 3), ("b", 3)):
        sc.add(job(name, gpus))
        sc.cycle()
    sc.add(job("c", 2))  # 2 GPUs free, one on each NUMA node
    sc.cycle()
    return sc


@pytest.mark.parametrize("policy", ["single-numa-node", "restricted"])
def test_a_task_is_refused_gpus_split_over_numa_nodes(policy: str) -> None:
    sc = three_three_two(policy)
    assert numa_of(sc, "a") == {0} and numa_of(sc, "b") == {1}
    assert sc.bound("c") == 0
    p = sc.pending("c")
    assert p is not None and "no NUMA node can take its GPUs and NICs" in p.message, p.message


@pytest.mark.parametrize("policy", ["best-effort", "none"])
def test_without_a_strict_policy_the_split_is_taken(policy: str) -> None:
    sc = three_three_two(policy)
    assert sc.bound("c") == 1
    if policy == "best-effort":  # one NUMA node each while there was one, then across them
        assert numa_of(sc, "a") == {0} and numa_of(sc, "b") == {1} and numa_of(sc, "c") == {0, 1}


def test_restricted_takes_what_no_numa_node_could_hold_single_numa_node_never() -> None:
    for policy, placed in (("restricted", 1), ("single-numa-node", 0)):
        sc = Scenario([node(policy)])
        sc.add(job("big", 6))
        sc.cycle()
        assert sc.bound("big") == placed, policy


def test_exclusive_cpus_are_charged_to_their_numa_node() -> None:
    sc = Scenario([node("single-numa-node", cpus=(56_000, 56_000))])
    for name in ("a", "b", "c"):
        sc.add(job(name, 1, cpu=30, exclusive=True))
        sc.cycle()
    # 30 cores each: a on NUMA node 0, b on 1 (26 left on 0), c nowhere though 52 cores are free
    assert numa_of(sc, "a") == {0} and numa_of(sc, "b") == {1} and sc.bound("c") == 0
    c = sc.snapshot.cluster
    assert c.numa_cpu_free[0].tolist() == [26_000, 26_000] and int(c.cpu_free[0]) == 52_000
    p = sc.pending("c")
    assert p is not None and "its GPUs, NICs and exclusive CPUs" in p.message, p.message
    sc.complete("a")
    assert c.numa_cpu_free[0].tolist() == [56_000, 26_000]
    sc.cycle()
    assert sc.bound("c") == 1 and numa_of(sc, "c") == {0}


def test_shared_cpus_come_from_the_shared_pool() -> None:
    sc = Scenario([node("single-numa-node", cpus=(56_000, 56_000))])
    for name in ("a", "b", "c"):
        sc.add(job(name, 1, cpu=30))
        sc.cycle()
    assert sc.bound("c") == 1 and sc.snapshot.cluster.numa_cpu_free[0].tolist() == [56_000, 56_000]


def test_a_policy_the_kubelet_does_not_have_is_refused_by_name() -> None:
    with pytest.raises(SpecError, match="numa_policy: unknown topology manager policy 'strict'"):
        node("strict")


# On Kubernetes: the node says its policy and cores per NUMA node in phalanx.io/device-topology;
# a Guaranteed pod asking whole cores has exclusive CPUs


def k8s_node(topology: dict) -> dict:
    from kube_objects import node as kube_node

    return kube_node("n", gpus=8, annotations={"phalanx.io/device-topology": json.dumps(topology)})


GPUS = [{"index": k, "numa": k // 4, "pcieSwitch": k // 2} for k in range(8)]


def guaranteed(name: str, cores: str, gpus: int) -> dict:
    from kube_objects import pod as kube_pod

    p = kube_pod(name, gpus=gpus)
    res = p["spec"]["containers"][0]["resources"]
    res["limits"].update({"cpu": cores, "memory": "8Gi"})
    res["requests"] = {"cpu": cores, "memory": "8Gi"}
    return p


def test_the_node_annotation_and_a_guaranteed_pod_are_read() -> None:
    from phalanx.k8s.config import AdapterConfig
    from phalanx.k8s.read.world import build_world

    topo = {"gpus": GPUS, "numaPolicy": "single-numa-node", "numaCpus": [56, 56]}
    pods = [guaranteed("a", "30", 1), guaranteed("b", "30", 1), guaranteed("c", "30", 1)]
    pods[2]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "29500m"  # Burstable: shared CPUs
    w = build_world([k8s_node(topo)], pods, [], [], AdapterConfig(), 0.0)
    n = w.snapshot.nodes[0]
    assert n.numa_policy == "single-numa-node" and n.numa_cpu_milli == (56_000, 56_000)
    req = {k: e.workload.podsets[0].request for k, e in w.snapshot.workloads.items()}
    assert req["default/a"].exclusive_cpu and not req["default/c"].exclusive_cpu
    bad = build_world([k8s_node({"gpus": GPUS, "numaPolicy": "strict"})], [], [], [], AdapterConfig(), 0.0)
    assert "numaPolicy" in bad.node_problems["n"], bad.node_problems


def test_the_twin_reads_a_nodes_policy_from_its_cluster_file() -> None:
    from phalanx.spec.cluster import parse_cluster

    spec = {
        "nodes": [
            {
                "name": "dgx",
                "cpu": 112,
                "memory": "1Ti",
                "gpus": {"count": 8, "model": "H100", "memory": "80Gi", "numa_nodes": 2},
                "numa_policy": "single-numa-node",
                "numa_cpus": [56, "56"],
            }
        ]
    }
    (n,) = parse_cluster(spec).snapshot().nodes
    assert n.numa_policy == "single-numa-node" and n.numa_cpu_milli == (56_000, 56_000)
    assert [g.numa for g in n.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    spec["nodes"][0]["numa_policy"] = "strict"
    with pytest.raises(SpecError, match="numa_policy"):
        parse_cluster(spec)
