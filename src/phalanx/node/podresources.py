"""Kubelet's PodResources API (v1, `<kubelet root>/pod-resources/kubelet.sock`): which pod got which devices.

A device plugin is not told which pod an Allocate is for; kubelet's own record is the truth. The
MIG plugin reads it to correct what a guess got wrong (`phalanx.node.migplugin`). Only the fields
read are described (k8s.io/kubelet pkg/apis/podresources/v1); the others are skipped on the wire.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from phalanx.node.dpapi import build

PACKAGE = "v1"
SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
M = build(
    "phalanx_podresources_v1.proto",
    PACKAGE,
    {
        "ListPodResourcesRequest": [],
        "ContainerDevices": [("resource_name", 1, "string", False), ("device_ids", 2, "string", True)],
        "ContainerResources": [("name", 1, "string", False), ("devices", 2, "ContainerDevices", True)],
        "PodResources": [
            ("name", 1, "string", False),
            ("namespace", 2, "string", False),
            ("containers", 3, "ContainerResources", True),
        ],
        "ListPodResourcesResponse": [("pod_resources", 1, "PodResources", True)],
    },
    {"PodResourcesLister": {"List": ("ListPodResourcesRequest", "ListPodResourcesResponse", False)}},
)


def devices(socket: Path, prefix: str, timeout: float = 5.0) -> dict[str, list[str]]:
    """Device IDs of the resources named `prefix...` per pod (`namespace/name`), as kubelet allocated them."""
    with grpc.insecure_channel(f"unix://{socket}") as ch:
        call = ch.unary_unary(
            f"/{PACKAGE}.PodResourcesLister/List",
            request_serializer=M["ListPodResourcesRequest"].SerializeToString,
            response_deserializer=M["ListPodResourcesResponse"].FromString,
        )
        resp = call(M["ListPodResourcesRequest"](), timeout=timeout)
    out: dict[str, list[str]] = {}
    for p in resp.pod_resources:
        ids = [
            i
            for c in p.containers
            for d in c.devices
            if d.resource_name.startswith(prefix)
            for i in d.device_ids
        ]
        if ids:
            out[f"{p.namespace}/{p.name}"] = ids
    return out
