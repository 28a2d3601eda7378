"""The GPU-share admission mutation: give a share pod the ConfigMap its GPU environment comes from.

On the stock NVIDIA device plugin a pod that asks for a share (KAI's `gpu-fraction` or
`gpu-memory` annotations, or HAMi's `nvidia.com/gpumem` / `nvidia.com/gpumem-percentage`)
asks kubelet for no GPU, so it would get none. At admission, its GPU container gets an
`envFrom` reference to a ConfigMap named in `phalanx.io/gpu-configmap`; before the bind the
scheduler writes `NVIDIA_VISIBLE_DEVICES=<uuid>` there, the UUID of the GPU (or, for a share a MIG
instance serves, of the MIG device) a reservation pod holds (`phalanx.k8s.act.shares`). The
reference is not optional: a CUDA image sets `NVIDIA_VISIBLE_DEVICES=all`, so a container that
started without the ConfigMap would see every GPU of the node; kubelet instead waits for the
ConfigMap (it exists before the bind).

HAMi's resources do not exist where HAMi's device plugin does not run (kubelet would refuse
the pod), so they are moved to the equivalent KAI annotations, which ask for the same share.

A share that MPS may serve (`phalanx.io/gpu-backend: mps`, or any share when the scheduler's
profile may pick MPS) gets the node's MPS pipe directory mounted at the same path; the scheduler
names it in the share's CUDA_MPS_PIPE_DIRECTORY.

A pod that names a dataset (`phalanx.io/dataset`) gets the node's cached copy mounted read-only
(docs/datasets.md: why a hostPath of type Directory, and not a CSI volume). Where the distributed
cache runs (`Distributed`), a pod naming a distributed Dataset gets instead the Dataset's folder in
the node's FUSE mount of the engine, at the same path; with `spec.readiness: cached` (the default)
it is held by a scheduling gate that `phalanx distcache` lifts once every file is cached.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phalanx.core.errors import SpecError
from phalanx.core.model import MILLI, MPS_BACKEND, GpuKind
from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.pods import dataset_of, parse_pod
from phalanx.spec.datasets import dataset_key, parse_dataset

log = logging.getLogger(__name__)

HAMI_RESOURCES = (keys.HAMI_GPUMEM, keys.HAMI_GPUMEM_PERCENT, "nvidia.com/gpucores", keys.GPU_RESOURCE)
DATASET_VOLUME = keys.DATASET_VOLUME
DATASET_ENV = "PHALANX_DATASET_DIR"
MPS_VOLUME = "phalanx-mps-pipe"
# a distributed Dataset's folder in the node's FUSE mount: a name of its own, so that the scheduler
# does not ask for a node with a per-node cache agent (keys.DATASET_VOLUME)
DISTRIBUTED_VOLUME = "phalanx-distcache"
# the scheduling gate of a pod whose distributed Dataset is not cached yet (spec.readiness: cached)
DATASET_GATE = "phalanx.io/dataset-cached"
READY_STATES = ("ready", "degraded")  # every file readable from the cache (degraded: a copy short)


@dataclass(frozen=True)
class Distributed:
    """Where the distributed cache runs: the host folder its FUSE mounts are made in (`<root>/fs` is
    the filer's dataset tree) and a way to read a Dataset (namespace, name -> object or None)."""

    root: str
    dataset: Callable[[str, str], dict[str, Any] | None]


_MAX_BASE = 40  # ConfigMap names stay well under 63 characters (some tools mount them as volumes)


def configmap_name(pod: dict[str, Any]) -> str:
    """`<owner or pod name>-<random>-gpu`: unique, and readable in `kubectl get cm`."""
    meta = pod.get("metadata") or {}
    owners = meta.get("ownerReferences") or []
    base = str(owners[0].get("name", "") if owners else "") or str(
        meta.get("name") or meta.get("generateName") or "pod"
    )
    base = base.strip("-.").lower()[:_MAX_BASE].rstrip("-.") or "pod"
    return f"{base}-{secrets.token_hex(3)}-gpu"


def _share_containers(spec: dict[str, Any], notes: dict[str, str], where: str) -> list[int]:
    """The containers that use the share: the one KAI's annotation names, those asking HAMi's
    resources, else the first."""
    containers = spec.get("containers") or []
    named = notes.get(keys.KAI_FRACTION_CONTAINER)
    if named:
        for i, c in enumerate(containers):
            if c.get("name") == named:
                return [i]
        raise SpecError(f"{where}: annotation {keys.KAI_FRACTION_CONTAINER}", f"no container named {named!r}")
    hami = [i for i, c in enumerate(containers) if _hami(c)]
    return hami or ([0] if containers else [])


def _hami(container: dict[str, Any]) -> bool:
    res = container.get("resources") or {}
    asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return keys.HAMI_GPUMEM in asked or keys.HAMI_GPUMEM_PERCENT in asked


def mutate(
    pod: dict[str, Any], namespace: str, cfg: AdapterConfig, dist: Distributed | None = None
) -> dict[str, Any] | None:
    """The mutated pod, or None when it needs nothing. Raises SpecError for a request Phalanx
    cannot read (the webhook denies the pod with that message: the user sees it at once)."""
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") != cfg.scheduler_name:
        return None
    obj = json.loads(json.dumps(pod))
    meta = obj.setdefault("metadata", {})
    meta.setdefault("namespace", namespace)
    where = f"pod {namespace}/{meta.get('name') or meta.get('generateName', '')}"
    shared = _share(obj, namespace, cfg, where)
    mounted = _mount_dataset(obj, namespace, cfg, where, dist)
    return obj if shared or mounted else None


def _share(obj: dict[str, Any], namespace: str, cfg: AdapterConfig, where: str) -> bool:
    """A GPU share: the ConfigMap reference (and HAMi's request moved to KAI's annotations)."""
    meta = obj["metadata"]
    info = parse_pod(obj, cfg)
    gpu = info.request.gpu
    if gpu.kind not in (GpuKind.FRACTION, GpuKind.MEMORY):
        return False
    notes: dict[str, str] = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    targets = _share_containers(obj["spec"], notes, where)
    if any(_hami(c) for c in obj["spec"]["containers"]):
        for c in obj["spec"]["containers"]:
            res = c.get("resources") or {}
            for part in ("limits", "requests"):
                for r in HAMI_RESOURCES:
                    (res.get(part) or {}).pop(r, None)
        if gpu.kind is GpuKind.MEMORY:
            notes[keys.KAI_MEMORY] = str(gpu.memory_mib)
        else:
            notes[keys.KAI_FRACTION] = f"{gpu.milli / MILLI:g}"
        if gpu.devices > 1:
            notes[keys.KAI_FRACTION_DEVICES] = str(gpu.devices)
    name = notes.get(keys.GPU_CONFIGMAP) or configmap_name(obj)
    notes[keys.GPU_CONFIGMAP] = name
    meta["annotations"] = notes
    for i in targets:
        c = obj["spec"]["containers"][i]
        refs = c.setdefault("envFrom", [])
        if not any((r.get("configMapRef") or {}).get("name") == name for r in refs):
            refs.append({"configMapRef": {"name": name, "optional": False}})
    if parse_pod(obj, cfg).request.gpu != gpu:  # the moved HAMi request must ask for the same share
        raise SpecError(where, "could not carry the HAMi GPU request over to the stock device plugin")
    if gpu.backends == (MPS_BACKEND,) or (not gpu.backends and cfg.mps_shares):
        _mount_mps(obj["spec"], targets, cfg)
    return True


def _mount_mps(spec: dict[str, Any], targets: list[int], cfg: AdapterConfig) -> None:
    """The MPS pipe directory of the node, at the same path, in the share's containers: an MPS
    share's CUDA_MPS_PIPE_DIRECTORY (from its ConfigMap) names it. DirectoryOrCreate: a pod the
    scheduler serves by time-slice still starts on a node that runs no MPS daemon."""
    volumes = spec.setdefault("volumes", [])
    if not any(v.get("name") == MPS_VOLUME for v in volumes):
        volumes.append(
            {"name": MPS_VOLUME, "hostPath": {"path": cfg.mps_pipe_directory, "type": "DirectoryOrCreate"}}
        )
    for i in targets:
        mounts = spec["containers"][i].setdefault("volumeMounts", [])
        if not any(m.get("name") == MPS_VOLUME for m in mounts):
            mounts.append({"name": MPS_VOLUME, "mountPath": cfg.mps_pipe_directory})


def _mount_dataset(
    obj: dict[str, Any], namespace: str, cfg: AdapterConfig, where: str, dist: Distributed | None
) -> bool:
    """`phalanx.io/dataset`: the node's cached copy, read-only, at `<dataset_mount>/<name>` in every
    container. The hostPath is of type Directory: the copy appears there in one rename once it is
    complete and verified, and until then kubelet does not start the pod (FailedMount, retried).
    A distributed Dataset (where `dist` is given): its folder in the node's FUSE mount instead."""
    notes = {str(k): str(v) for k, v in (obj["metadata"].get("annotations") or {}).items()}
    key = dataset_of(notes, namespace)
    if not key:
        return False
    w = f"{where}: annotation {keys.DATASET}"
    ns, name = key.split("/", 1)
    dataset_key(ns, name, w)
    if ns != namespace:
        raise SpecError(w, f"dataset {key!r} is in another namespace; a pod may use the Datasets of its own")
    spec = obj["spec"]
    volumes = spec.setdefault("volumes", [])
    if any(v.get("name") in (DATASET_VOLUME, DISTRIBUTED_VOLUME) for v in volumes):
        return False  # already mutated (a reinvocation)
    volume = DATASET_VOLUME
    path = f"{cfg.dataset_root.rstrip('/')}/ready/{key}"
    ds = _distributed(dist, ns, name, w)
    if dist is not None and ds is not None:
        # the folder exists once `phalanx distcache` has mounted the source (kubelet waits till then)
        volume, path = DISTRIBUTED_VOLUME, f"{dist.root.rstrip('/')}/fs/{key}"
        state = str(((ds.get("status") or {}).get("distributed") or {}).get("state") or "")
        if (ds.get("spec") or {}).get("readiness") != "readThrough" and state not in READY_STATES:
            gates = spec.setdefault("schedulingGates", [])
            if not any(g.get("name") == DATASET_GATE for g in gates):
                gates.append({"name": DATASET_GATE})
    volumes.append({"name": volume, "hostPath": {"path": path, "type": "Directory"}})
    mount_path = f"{cfg.dataset_mount.rstrip('/')}/{name}"
    for part in ("initContainers", "containers"):
        for c in spec.get(part) or []:
            if any(m.get("mountPath") == mount_path for m in c.get("volumeMounts") or []):
                raise SpecError(
                    f"{where}: container {c.get('name')}", f"already mounts something at {mount_path}"
                )
            c.setdefault("volumeMounts", []).append(
                {"name": volume, "mountPath": mount_path, "readOnly": True}
            )
            env = c.setdefault("env", [])
            if not any(e.get("name") == DATASET_ENV for e in env):
                env.append({"name": DATASET_ENV, "value": mount_path})
    return True


def _distributed(dist: Distributed | None, ns: str, name: str, where: str) -> dict[str, Any] | None:
    """The Dataset when it is distributed and the distributed cache runs here, else None. A
    Dataset that cannot be read from the API leaves the pod on the per-node path (said in the log);
    one that is malformed refuses the pod with the Dataset's own error."""
    if dist is None:
        return None
    try:
        obj = dist.dataset(ns, name)
    except Exception as e:  # the API unreachable: the pod is not refused for it
        log.warning("%s: Dataset %s/%s not read (%s); mounting the per-node copy", where, ns, name, e)
        return None
    if obj is None or (obj.get("spec") or {}).get("cache") != "distributed":
        return None
    parse_dataset(obj)  # SpecError names the Dataset and its field
    return obj


def review(body: dict[str, Any], cfg: AdapterConfig, dist: Distributed | None = None) -> dict[str, Any]:
    """An AdmissionReview request -> its response (admission.k8s.io/v1)."""
    req = body.get("request") or {}
    uid = req.get("uid", "")
    resp: dict[str, Any] = {"uid": uid, "allowed": True}
    out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}
    kind = (req.get("kind") or {}).get("kind")
    pod = req.get("object")
    if kind != "Pod" or req.get("operation") != "CREATE" or not isinstance(pod, dict):
        return out
    try:
        new = mutate(pod, str(req.get("namespace") or "default"), cfg, dist)
    except SpecError as e:
        resp.update(allowed=False, status={"code": 400, "reason": "BadRequest", "message": str(e)})
        return out
    if new is None:
        return out
    patch = [
        {"op": "add", "path": "/metadata/annotations", "value": new["metadata"].get("annotations") or {}},
        {"op": "replace", "path": "/spec/containers", "value": new["spec"]["containers"]},
    ]
    for part in ("initContainers", "volumes", "schedulingGates"):
        if new["spec"].get(part):
            patch.append({"op": "add", "path": f"/spec/{part}", "value": new["spec"][part]})
    resp["patchType"] = "JSONPatch"
    resp["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return out
