"""Datasets on the distributed cache -> what placement needs: bytes per node, and those that failed.

`phalanx distcache` writes `status.distributed.servers`: bytes of the Dataset's chunks per volume
server, keyed by the server's address as the SeaweedFS master knows it (`<ip>:<port>`; the chart
starts each volume server with its pod's IP). A server is mapped to its node by that IP: a Node's
own addresses (a volume server on the host network), else the node of the pod with that IP (the
volume server's pod). A server on no known node is left out of the score.

Which nodes may run a pod reading such a Dataset is not read here: it is the node label
`phalanx.io/distcache=true` (`phalanx.k8s.read.nodes`), the label the chart's volume servers select on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phalanx.k8s.read.contain import mapping, mappings


@dataclass
class Distributed:
    by_node: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> "ns/name" -> bytes
    failed: dict[str, str] = field(default_factory=dict)  # "ns/name" -> the Dataset's reason
    problems: dict[str, str] = field(default_factory=dict)  # "Dataset ns/name" -> what is wrong


def read_distributed(
    datasets: list[dict[str, Any]], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> Distributed:
    """The distributed Datasets' bytes per node and failures; a malformed status is named, never raised."""
    out = Distributed()
    dist = [d for d in datasets if mapping(d.get("spec")).get("cache") == "distributed"]
    if not dist:
        return out
    where_ip = _ips(nodes, pods)
    for obj in dist:
        meta = mapping(obj.get("metadata"))
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        status = mapping(mapping(obj.get("status")).get("distributed"))
        if status.get("state") == "failed":
            out.failed[key] = str(status.get("reason") or "no reason given")
        servers = status.get("servers") or {}
        label = f"Dataset {key}"
        if not isinstance(servers, dict):
            out.problems[label] = (
                f"{label}: status.distributed.servers: expected a mapping of server to bytes, got {servers!r}"
            )
            continue
        held: dict[str, int] = {}
        for server, nbytes in servers.items():
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                out.problems[label] = (
                    f"{label}: status.distributed.servers.{server}: "
                    f"expected a number of bytes >= 0, got {nbytes!r}"
                )
                held = {}
                break
            node = where_ip.get(str(server).rsplit(":", 1)[0])
            if node:
                held[node] = held.get(node, 0) + nbytes
        for node, nbytes in held.items():
            out.by_node.setdefault(node, {})[key] = nbytes
    return out


def _ips(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, str]:
    """IP -> node name: the nodes' own addresses first, then running pods' IPs."""
    out: dict[str, str] = {}
    for p in pods:
        ip = mapping(p.get("status")).get("podIP")
        node = mapping(p.get("spec")).get("nodeName")
        if ip and node and mapping(p.get("status")).get("phase") == "Running":
            out[str(ip)] = str(node)
    for n in nodes:
        name = str(mapping(n.get("metadata")).get("name", ""))
        for a in mappings(mapping(n.get("status")).get("addresses")):
            if a.get("address"):
                out[str(a["address"])] = name
    return out


def failed_reason(dataset: str, reason: str) -> str:
    """What a pod whose distributed Dataset failed is told."""
    return f"dataset {dataset} is cached distributed and caching it failed: {reason}"
