"""The Kubernetes driver's reading of the distributed cache: which nodes run the mount (their label),
where a Dataset's chunks are (status.distributed.servers mapped to nodes by IP), which Datasets
failed, and what is wrong with a malformed status (named, never raised)."""

from __future__ import annotations

from typing import Any

from kube_objects import node, pod
from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.datasets import read_distributed
from phalanx.k8s.read.nodes import parse_node
from phalanx.k8s.read.pods import parse_pod
from phalanx.k8s.read.world import build_world

CFG = AdapterConfig()


def ds(name: str, status: dict[str, Any], cache: str = "distributed") -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.phalanx.io/v1alpha1",
        "kind": "Dataset",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"source": "s3://b/p", "cache": cache},
        "status": {"distributed": status},
    }


def with_ip(obj: dict[str, Any], ip: str) -> dict[str, Any]:
    obj["status"]["addresses"] = [{"type": "InternalIP", "address": ip}]
    return obj


def test_servers_map_to_nodes_by_node_address_then_pod_ip() -> None:
    nodes = [with_ip(node("a"), "10.0.0.1"), with_ip(node("b"), "10.0.0.2")]
    vol = pod("vol", node="b") | {"status": {"phase": "Running", "podIP": "10.244.1.7"}}
    d = read_distributed(
        [
            ds(
                "laion",
                {"state": "ready", "servers": {"10.0.0.1:8080": 5, "10.244.1.7:8080": 7, "10.9.9.9:1": 3}},
            )
        ],
        nodes,
        [vol],
    )
    assert d.by_node == {"a": {"team-a/laion": 5}, "b": {"team-a/laion": 7}}  # the unknown server left out
    assert not d.failed and not d.problems


def test_failed_and_per_node_datasets() -> None:
    d = read_distributed(
        [
            ds("gone", {"state": "failed", "reason": "source s3://b/p not found"}),
            ds("copies", {"state": "failed", "reason": "x"}, cache="node"),  # per-node: not ours here
        ],
        [],
        [],
    )
    assert d.failed == {"team-a/gone": "source s3://b/p not found"}


def test_malformed_status_is_named() -> None:
    d = read_distributed(
        [
            ds("bad", {"servers": ["10.0.0.1:8080"]}),
            ds("worse", {"servers": {"10.0.0.1:8080": "lots"}}),
            ds("fine", {"servers": {"10.0.0.1:8080": 1}}),
        ],
        [with_ip(node("a"), "10.0.0.1")],
        [],
    )
    assert d.problems == {
        "Dataset team-a/bad": "Dataset team-a/bad: status.distributed.servers: expected a mapping of server "
        "to bytes, got ['10.0.0.1:8080']",
        "Dataset team-a/worse": "Dataset team-a/worse: status.distributed.servers.10.0.0.1:8080: expected a "
        "number of bytes >= 0, got 'lots'",
    }
    assert d.by_node == {"a": {"team-a/fine": 1}}


def test_node_label_and_pod_volume() -> None:
    assert parse_node(node("a", labels={keys.DISTCACHE_NODE: "true"}), CFG).distcache_mount
    assert not parse_node(node("b"), CFG).distcache_mount
    p = pod("r", annotations={keys.DATASET: "laion"})
    p["spec"]["volumes"] = [{"name": keys.DISTCACHE_VOLUME, "hostPath": {"path": "/x", "type": "Directory"}}]
    info = parse_pod(p, CFG)
    assert info.request.dataset == "default/laion" and info.request.dataset_distributed
    # not the per-node cache agent's selector: the mount is what the pod needs
    assert keys.CACHE_AGENT not in info.request.node_selector
    plain = parse_pod(pod("q", annotations={keys.DATASET: "laion"}), CFG)
    assert not plain.request.dataset_distributed


def test_world_carries_bytes_and_holds_a_failed_datasets_pods() -> None:
    nodes = [with_ip(node("a", labels={keys.DISTCACHE_NODE: "true"}), "10.0.0.1")]
    p = pod("r", ns="team-a", gpus=1, annotations={keys.DATASET: "laion"})
    p["spec"]["volumes"] = [{"name": keys.DISTCACHE_VOLUME, "hostPath": {"path": "/x", "type": "Directory"}}]
    w = build_world(
        nodes,
        [p],
        [],
        [],
        CFG,
        0.0,
        datasets=[
            ds(
                "laion",
                {"state": "failed", "reason": "no objects under s3://b/p", "servers": {"10.0.0.1:1": 9}},
            )
        ],
    )
    (n,) = w.snapshot.nodes
    assert n.distcache_mount and n.distcache_bytes == {"team-a/laion": 9}
    (why,) = w.blocked.values()
    assert why == [
        "dataset team-a/laion is cached distributed and caching it failed: no objects under s3://b/p"
    ]
    bad = build_world(nodes, [], [], [], CFG, 0.0, datasets=[ds("x", {"servers": {"10.0.0.1:1": -1}})])
    assert "Dataset team-a/x" in bad.problems
