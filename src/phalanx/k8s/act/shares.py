"""GPU shares on the stock NVIDIA device plugin: reservation pods and the shares' ConfigMaps.

KAI's mechanism, for Phalanx's assignments. Before a share on GPU `i` of a node is bound, a
reservation pod `phalanx-gpu-<node>-<i>` in our namespace asks kubelet for one whole GPU
(`nvidia.com/gpu: 1`, bound to the node by `nodeName`), and `phalanx node reserve`, running in
it, writes that GPU's UUID on the pod (`phalanx.io/reserved-gpu`). Then the share's ConfigMap
(named at admission, `phalanx.k8s.admission.mutation`) gets `NVIDIA_VISIBLE_DEVICES=<uuid>`, and the
pod is bound. With the stock plugin the scheduler cannot pick which physical GPU kubelet
hands the reservation pod: index `i` names the group of shares that go together, and the UUID
says where the group lives.

A fraction the core serves by a MIG instance (`Bind.mig`, backend `mig`) is reserved the same way,
one reservation pod per instance, `phalanx-gpu-<node>-<i>-<profile>-<start>`: it asks
`nvidia.com/mig-<profile>: 1` and carries the chosen `phalanx.io/mig-slice` and
`phalanx.io/gpu-devices`, so that Phalanx's MIG device plugin (`phalanx node device-plugin
--mig-strategy mixed`) hands it that instance; `phalanx node reserve --mig` in it reports the MIG
device's UUID, which the share's ConfigMap names.

Every step can be repeated and is checked before it is taken, so a restart finishes it: the
gang plan (written first) keeps the decision, the reservation pod's name is fixed by the
decision, the ConfigMap write is an upsert. A reservation pod whose GPU has no share left,
planned or bound, is deleted; a share whose reservation pod is gone is evicted (the GPU it
used is not held any more), as KAI does.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from phalanx.core.decisions import Bind
from phalanx.core.errors import SpecError
from phalanx.core.model import MIG_BACKEND, MILLI, MPS_BACKEND
from phalanx.k8s import keys
from phalanx.k8s.act import failpoint
from phalanx.k8s.act.step import Broke, ShareStep, Step
from phalanx.k8s.client.api import Api, Conflict, NotFound
from phalanx.k8s.client.kinds import CONFIG_MAPS, PODS
from phalanx.k8s.config import AdapterConfig, ReservationPodExtras
from phalanx.k8s.read.pods import timestamp
from phalanx.k8s.read.reservations import Slot, slot_mig, slot_of, slot_text
from phalanx.spec.common import validate

log = logging.getLogger("phalanx.k8s")
T = TypeVar("T")


class Broken(Exception):
    """The reservation cannot be had (its pod failed, or never got a GPU): choose again."""


def is_mig_share(b: Bind) -> bool:
    """A fraction the core serves by a MIG instance (a pod asking the slice itself is no share)."""
    return len(b.gpus) == 1 and b.mig is not None and b.backend == MIG_BACKEND


def is_share(b: Bind) -> bool:
    return bool(b.gpus) and ((b.mig is None and 0 < b.gpu_milli < MILLI) or is_mig_share(b))


def slots_of(b: Bind) -> list[Slot]:
    """What a share's reservation pods hold: its GPUs, or its MIG instance."""
    if is_mig_share(b):
        assert b.mig is not None
        return [(b.node, b.gpus[0], f"{b.mig.profile}@{b.mig.start}")]
    return [(b.node, g) for g in b.gpus]


def reservation_name(node: str, index: int, mig: str = "") -> str:
    """`phalanx-gpu-<node>-<i>`, and `-<profile>-<start>` for a MIG instance (in a pod name's
    characters: `1g.10gb+me@3` is `1g.10gb-me-3`)."""
    tail = f"{index}-{re.sub(r'[^a-z0-9.]+', '-', mig.lower())}" if mig else str(index)
    name = f"phalanx-gpu-{node}-{tail}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"phalanx-gpu-{node[:200]}-{digest}-{tail}"


def slot_name(slot: Slot) -> str:
    return reservation_name(slot[0], slot[1], slot_mig(slot))


_OWN_ENV = ("POD_NAME", "POD_NAMESPACE")  # `phalanx node reserve` finds its pod through them
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class _Loose(BaseModel):
    """A Kubernetes object the API server checks in full; we check what we rely on."""

    model_config = ConfigDict(extra="allow")


class _EnvVar(_Loose):
    name: str = Field(min_length=1)
    value: str | None = None
    valueFrom: dict[str, Any] | None = None


class _Volume(_Loose):
    name: str = Field(min_length=1)


class _VolumeMount(_Loose):
    name: str = Field(min_length=1)
    mountPath: str = Field(min_length=1)
    readOnly: bool = False


class _ReservationPodFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runtimeClassName: str = ""
    env: list[_EnvVar] = Field(default_factory=list)
    volumes: list[_Volume] = Field(default_factory=list)
    volumeMounts: list[_VolumeMount] = Field(default_factory=list)


def parse_reservation_extras(data: object, where: str) -> ReservationPodExtras:
    """`--reservation-pod`'s YAML: {runtimeClassName, env, volumes, volumeMounts}, all optional."""
    if data is not None and not isinstance(data, dict):
        raise SpecError(where, "must be a mapping (runtimeClassName, env, volumes, volumeMounts)")
    f = validate(_ReservationPodFile, data or {}, where)
    if f.runtimeClassName and not _DNS_SUBDOMAIN.match(f.runtimeClassName):
        raise SpecError(f"{where}: runtimeClassName", f"{f.runtimeClassName!r} is not a DNS subdomain name")
    for k, e in enumerate(f.env):
        w = f"{where}: env[{k}]"
        if not _ENV_NAME.match(e.name):
            raise SpecError(w, f"{e.name!r} is not a valid variable name")
        if e.name in _OWN_ENV:
            raise SpecError(w, f"{e.name} is set by Phalanx (the reservation pod finds itself through it)")
        if e.value is not None and e.valueFrom is not None:
            raise SpecError(w, "give value or valueFrom, not both")
    names: set[str] = set()
    for k, v in enumerate(f.volumes):
        w = f"{where}: volumes[{k}]"
        if not _DNS_LABEL.match(v.name):
            raise SpecError(w, f"{v.name!r} is not a DNS label (lower case, digits, '-')")
        if v.name in names:
            raise SpecError(w, f"volume {v.name!r} is listed twice")
        names.add(v.name)
        if len(v.model_dump(exclude={"name"})) != 1:
            raise SpecError(w, "give exactly one volume source (hostPath, configMap, ...)")
    for k, m in enumerate(f.volumeMounts):
        w = f"{where}: volumeMounts[{k}]"
        if m.name not in names:
            raise SpecError(w, f"mounts volume {m.name!r}, which volumes does not list")
        if not m.mountPath.startswith("/"):
            raise SpecError(w, f"mountPath {m.mountPath!r} is not an absolute path")

    def dump(items: list[Any]) -> tuple[dict[str, Any], ...]:
        return tuple(i.model_dump(exclude_none=True, exclude_defaults=False) for i in items)

    return ReservationPodExtras(f.runtimeClassName, dump(f.env), dump(f.volumes), dump(f.volumeMounts))


def reservation_pod(node: str, index: int, cfg: AdapterConfig, mig: str = "") -> dict[str, Any]:
    """The pod that holds GPU group `index` of `node` for its shares (with the cluster's extras); with
    `mig` ("profile@start"), the MIG instance there that serves one share."""
    extras = cfg.reservation_extras
    resource, notes, args = keys.GPU_RESOURCE, {keys.NODE_INTENT: node}, ["node", "reserve", "--in-cluster"]
    if mig:  # the MIG device plugin hands it the instance these name
        resource = f"nvidia.com/mig-{mig.partition('@')[0]}"
        notes |= {keys.MIG_SLICE: mig, keys.GPU_DEVICES: str(index)}
        args.append("--mig")
    field_env = [
        {"name": n, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.{f}"}}}
        for n, f in (("POD_NAME", "name"), ("POD_NAMESPACE", "namespace"))
    ]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": reservation_name(node, index, mig),
            "namespace": cfg.reservation_namespace,
            "labels": {keys.GPU_RESERVATION: str(index), "app.kubernetes.io/name": "phalanx-gpu-reservation"},
            "annotations": notes,
        },
        "spec": {
            "nodeName": node,
            "priorityClassName": cfg.reservation_priority_class,
            "serviceAccountName": "phalanx-gpu-reservation",
            "terminationGracePeriodSeconds": 5,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "reserve",
                    "image": cfg.reservation_image,
                    "imagePullPolicy": "IfNotPresent",
                    "args": args,
                    "env": field_env + [dict(e) for e in extras.env],
                    "resources": {
                        "requests": {"cpu": "1m", "memory": "64Mi", resource: "1"},
                        "limits": {"memory": "128Mi", resource: "1"},
                    },
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    spec: dict[str, Any] = pod["spec"]
    if extras.runtime_class_name:
        spec["runtimeClassName"] = extras.runtime_class_name
    if extras.volumes:
        spec["volumes"] = [dict(v) for v in extras.volumes]
    if extras.volume_mounts:
        spec["containers"][0]["volumeMounts"] = [dict(m) for m in extras.volume_mounts]
    return pod


def share_env(b: Bind, uuids: list[str], cfg: AdapterConfig) -> dict[str, str]:
    """The variables a share's containers get: its GPU, and the limits an in-container limiter reads;
    an MPS share also the MPS client's: its thread percentage, pinned memory limit and pipes. A share
    served by a MIG instance gets the instance alone: the hardware holds it to its size."""
    if is_mig_share(b):
        assert b.mig is not None
        mig = f"{b.mig.profile}@{b.mig.start}"
        return {
            "NVIDIA_VISIBLE_DEVICES": ",".join(uuids),
            "PHALANX_GPU_BACKEND": MIG_BACKEND,
            "PHALANX_MIG_SLICE": mig,
        }
    env = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids), "PHALANX_GPU_FRACTION": f"{b.gpu_milli / MILLI:g}"}
    if b.backend:
        env["PHALANX_GPU_BACKEND"] = b.backend
    if b.backend == MPS_BACKEND:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(-(-b.gpu_milli * 100 // MILLI))
        if b.gpu_memory_mib:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{u}={b.gpu_memory_mib}M" for u in uuids)
        env["CUDA_MPS_PIPE_DIRECTORY"] = cfg.mps_pipe_directory
    if cfg.share_limit_env:
        if b.gpu_memory_mib:
            env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{b.gpu_memory_mib}m"  # HAMi-core's names
        env["CUDA_DEVICE_SM_LIMIT"] = str(max(1, round(100 * b.gpu_milli / MILLI)))
    return env


@dataclass
class Shares:
    """Reservation pods and ConfigMaps for the executor (one per scheduler)."""

    api: Api
    cfg: AdapterConfig
    retry: Callable[[Callable[[], Any]], Any]
    clock: Callable[[], float] = time.time
    pods: dict[Slot, dict[str, Any]] = field(default_factory=dict)  # reservation pods, from the store
    touched: dict[Slot, float] = field(default_factory=dict)  # what we created or saw ready lately
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self, pods: dict[Slot, dict[str, Any]]) -> None:
        with self.lock:
            self.pods = dict(pods)

    def recent(self, slot: Slot, ttl: float = 60.0) -> bool:
        with self.lock:
            return self.clock() - self.touched.get(slot, -1e18) < ttl

    def gone(self, slot: Slot) -> bool:
        """Whether the reservation pod of `slot`, absent from the store, is really gone: the store
        may lag behind one made or seen a moment ago, so then the API server is asked (a 404 or a
        pod on its way out: gone). A killed reservation pod's shares are evicted at once, not after
        the store-lag window."""
        if not self.recent(slot):
            return True
        obj = self.retry(partial(self.api.get, PODS, slot_name(slot), self.cfg.reservation_namespace))
        meta = (obj or {}).get("metadata") or {}
        if obj is None or meta.get("deletionTimestamp") or (obj.get("status") or {}).get("phase") == "Failed":
            with self.lock:
                self.touched.pop(slot, None)
                self.pods.pop(slot, None)
            return True
        return False

    def prepare(
        self, binds: list[Bind], pods: dict[str, dict[str, Any]], uids: Mapping[str, str]
    ) -> ShareStep:
        """READY when every share of the gang has its GPU and its ConfigMap (bind now); LATER while a
        reservation pod waits for its GPU; otherwise Broke: why the gang cannot go there."""
        shares = [b for b in binds if is_share(b)]
        uuids: dict[Slot, str] = {}
        waiting = False
        for slot in sorted({s for b in shares for s in slots_of(b)}):
            try:
                got = self._reserved(slot)
            except Broken as e:
                return Broke(str(e))
            if got is None:
                waiting = True
            else:
                uuids[slot] = got
        if waiting:
            return Step.LATER
        for b in shares:
            why = self._configmap(b, [uuids[s] for s in slots_of(b)], pods.get(b.task), uids)
            if why:
                return Broke(why)
        return Step.READY

    def _reserved(self, slot: Slot) -> str | None:
        """The UUID the reservation pod of `slot` reports; None while it waits (made if missing)."""
        node, index, mig = slot[0], slot[1], slot_mig(slot)
        with self.lock:
            obj = self.pods.get(slot)
        uuid = ((obj or {}).get("metadata") or {}).get("annotations", {}).get(keys.RESERVED_GPU)
        if obj is None or not uuid:  # the store may lag: ask
            name = slot_name(slot)
            obj = self.retry(partial(self.api.get, PODS, name, self.cfg.reservation_namespace))
            held = slot_of(obj, self.cfg) if mig and obj is not None else None
            if held is not None and held != slot:  # kubelet gave it another instance (its plugin says so)
                raise Broken(f"the reservation pod {name} made for {slot_text(slot)} holds {slot_text(held)}")
        if obj is None:
            body = reservation_pod(node, index, self.cfg, mig)
            try:
                obj = self.retry(partial(self.api.create, PODS, body, self.cfg.reservation_namespace))
                log.info(
                    "reservation pod %s/%s made for %s",
                    body["metadata"]["namespace"],
                    body["metadata"]["name"],
                    slot_text(slot),
                )
            except Conflict:
                return None  # made meanwhile (by an earlier try): look again next time
            self._touch(slot, obj)
            failpoint.hit("reservation-made")
            return None
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return None  # the last one is going away; a new one is made once it is gone
        uuid = (meta.get("annotations") or {}).get(keys.RESERVED_GPU)
        if uuid:
            self._touch(slot, obj)
            return str(uuid)
        status = obj.get("status") or {}
        if status.get("phase") == "Failed":
            self.delete(slot, obj)
            why = status.get("message") or status.get("reason") or "it failed"
            raise Broken(f"the reservation pod for {slot_text(slot)} failed: {why}")
        age = self.clock() - timestamp(meta.get("creationTimestamp"))
        if timestamp(meta.get("creationTimestamp")) and age > self.cfg.reservation_timeout_s:
            self.delete(slot, obj)
            if mig:
                asks = (
                    f"does the node have a free nvidia.com/mig-{mig.partition('@')[0]}, offered by "
                    "`phalanx node device-plugin --mig-strategy mixed`?"
                )
            else:
                asks = "does the node have a free nvidia.com/gpu?"
            raise Broken(
                f"the reservation pod for {slot_text(slot)} reported no "
                f"{'MIG device' if mig else 'GPU'} in {self.cfg.reservation_timeout_s:g} s "
                f"(is `phalanx node reserve` running there, and {asks})"
            )
        return None

    def _touch(self, slot: Slot, obj: dict[str, Any]) -> None:
        with self.lock:
            self.pods[slot] = obj
            self.touched[slot] = self.clock()

    def _configmap(
        self, b: Bind, uuids: list[str], pod: dict[str, Any] | None, uids: Mapping[str, str]
    ) -> str:
        ns, _, name = b.task.partition("/")
        notes = ((pod or {}).get("metadata") or {}).get("annotations") or {}
        cm = notes.get(keys.GPU_CONFIGMAP)
        if not cm:
            return f"pod {b.task} has no {keys.GPU_CONFIGMAP} annotation (it was not admitted by the webhook)"
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": cm,
                "namespace": ns,
                "labels": {"app.kubernetes.io/managed-by": "phalanx"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uids.get(b.task, "")}
                ],
            },
            "data": share_env(b, uuids, self.cfg),
        }
        try:
            self.retry(partial(self.api.create, CONFIG_MAPS, body, ns))
        except Conflict:  # an earlier try (or a restart) wrote it: make it say this assignment
            self.retry(partial(self.api.patch, CONFIG_MAPS, cm, ns, {"data": body["data"]}))
        failpoint.hit("configmap-written")
        return ""

    def delete(self, slot: Slot, obj: dict[str, Any] | None = None) -> None:
        meta = (obj or {}).get("metadata") or {}
        name = str(meta.get("name") or slot_name(slot))
        try:
            self.retry(partial(self.api.delete, PODS, name, self.cfg.reservation_namespace, 0))
            log.info("reservation pod %s deleted: no share left on %s", name, slot_text(slot))
        except NotFound:
            pass
        with self.lock:
            self.pods.pop(slot, None)
            self.touched.pop(slot, None)
