"""Builders of Kubernetes API objects (plain dicts) for the adapter tests."""

from __future__ import annotations

import base64
import json
from typing import Any


def node(
    name: str,
    gpus: int = 8,
    product: str = "NVIDIA-H100-80GB-HBM3",
    memory: int = 81559,
    cpu: str = "112",
    mem: str = "2Ti",
    labels: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    ready: bool = True,
) -> dict[str, Any]:
    alloc: dict[str, Any] = {"cpu": cpu, "memory": mem, "pods": "110"}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    alloc.update(extra or {})
    lab = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": str(memory)}
    lab.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lab, "annotations": annotations or {}},
        "spec": {},
        "status": {
            "allocatable": alloc,
            "capacity": alloc,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str,
    ns: str = "default",
    gpus: int = 0,
    cpu: str = "1",
    mem: str = "1Gi",
    scheduler: str = "phalanx",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    resources: dict[str, Any] | None = None,
    node: str = "",
    owner: tuple[str, str] | None = None,
    priority: int = 0,
    created: str = "2026-11-29T10:00:00Z",
) -> dict[str, Any]:
    req: dict[str, Any] = {"cpu": cpu, "memory": mem}
    limits: dict[str, Any] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    limits.update(resources or {})
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{ns}-{name}",
        "labels": labels or {},
        "annotations": annotations or {},
        "creationTimestamp": created,
    }
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": owner[0], "name": owner[1], "uid": "x", "controller": True}
        ]
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "priority": priority,
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"requests": req, "limits": limits}}
        ],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def pod_group(
    name: str,
    min_member: int,
    ns: str = "default",
    queue: str = "",
    api: str = "scheduling.phalanx.io/v1alpha1",
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"minMember": min_member, **spec}
    if queue:
        body["queue"] = queue
    return {"apiVersion": api, "kind": "PodGroup", "metadata": {"name": name, "namespace": ns}, "spec": body}


def queue(
    name: str,
    gpu_quota: float | None = None,
    parent: str = "",
    api: str = "scheduling.phalanx.io/v1alpha1",
    **extra: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = dict(extra)
    if parent:
        spec["parent"] = parent
    if gpu_quota is not None:
        spec["resources"] = {"gpu": {"quota": gpu_quota}}
    return {"apiVersion": api, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def topology(gpus: list[dict[str, Any]], nics: list[dict[str, Any]] | None = None) -> str:
    return json.dumps({"gpus": gpus, "nics": nics or []})


def s3_secret(ns: str, key: str, secret: str, name: str = "s3-creds") -> dict[str, Any]:
    """The Secret a Dataset's `secretRef` names: the object store's keys, as the cache agents read them."""
    data = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": ns},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
