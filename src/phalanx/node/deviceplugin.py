"""`phalanx node device-plugin`: `nvidia.com/gpu` whose allocation follows the scheduler's choice.

With NVIDIA's device plugin, kubelet picks which GPUs a pod gets; Phalanx's choice of GPU
indices (beside a pod's RDMA NIC, inside one NVLink group) is then only a count. This plugin
answers kubelet's GetPreferredAllocation with the GPUs the pod's `phalanx.io/gpu-devices`
names, and kubelet allocates what the plugin prefers when those devices are free.

Kubelet does not say which pod it is allocating for. It admits a node's pods one at a time,
oldest first; so the pod is the oldest one bound here, not started, asking for GPUs, whose
GPUs were not handed out yet (`phalanx.io/gpu-allocated`, written at Allocate). A pod with no
assignment of ours (another scheduler's) gets GPUs on the NUMA node of those it must include,
lowest index first.

Containers get `NVIDIA_VISIBLE_DEVICES=<uuids>`, which the NVIDIA container runtime acts on
(its `envvar` device-list strategy; the GPU Operator's default). Device health is not
watched: a GPU that fails stays listed until the plugin restarts.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc

from phalanx.node.dpapi import HEALTHY, KUBELET_SOCKET, VERSION, M, path

log = logging.getLogger("phalanx.node")
GPU_DEVICES = "phalanx.io/gpu-devices"
GPU_ALLOCATED = "phalanx.io/gpu-allocated"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    numa: int = 0


class PodSource(Protocol):
    def pods(self) -> list[dict[str, Any]]:
        """This node's pods."""

    def mark(self, pod: dict[str, Any], uuids: list[str]) -> None:
        """Record on the pod that these GPUs were handed out to it."""

    def note(self, pod: dict[str, Any], notes: dict[str, str]) -> None:
        """Write these annotations on the pod."""


def _asked(pod: dict[str, Any], resource: str = GPU_RESOURCE) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        amount = (res.get("limits") or {}).get(resource) or (res.get("requests") or {}).get(resource)
        total += int(str(amount)) if amount and str(amount).isdigit() else 0
    return total


def _indices(pod: dict[str, Any]) -> list[int]:
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_DEVICES, "")
    return [int(x) for x in str(text).split(",") if x.strip().isdigit()]


@dataclass
class Plugin:
    gpus: list[GpuDevice]
    source: PodSource
    socket_dir: Path = Path("/var/lib/kubelet/device-plugins")
    resource: str = GPU_RESOURCE
    endpoint: str = "phalanx-gpu.sock"
    given: dict[str, int] = field(default_factory=dict)  # pod uid -> how many of its GPUs were handed out
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    # ------------------------------------------------------------------ choosing
    def _waiting(self) -> list[dict[str, Any]]:
        """Pods here that wait for their GPUs, in kubelet's admission order (oldest first)."""
        out = []
        for p in self.source.pods():
            meta = p.get("metadata") or {}
            if (p.get("status") or {}).get("phase", "Pending") != "Pending" or meta.get("deletionTimestamp"):
                continue
            if GPU_ALLOCATED in (meta.get("annotations") or {}) or not _asked(p, self.resource):
                continue
            out.append(p)
        return sorted(
            out, key=lambda p: (str(p["metadata"].get("creationTimestamp", "")), p["metadata"]["name"])
        )

    def listed(self) -> list[tuple[str, int]]:
        """The devices offered now: (ID, NUMA node)."""
        return [(g.uuid, g.numa) for g in self.gpus]

    def wanted(self, pod: dict[str, Any]) -> list[str] | None:
        """The device IDs Phalanx chose for the pod, all its containers' in order (None: no choice of
        ours, or one this node does not have)."""
        by_index = {g.index: g.uuid for g in self.gpus}
        idx = _indices(pod)
        if not idx or not all(i in by_index for i in idx):
            return None
        return [by_index[i] for i in idx]

    def _planned(self, size: int) -> tuple[dict[str, Any], list[str]] | None:
        """The pod being admitted, if Phalanx placed it, and the devices of its next container."""
        for p in self._waiting():
            ids = self.wanted(p)
            if not ids:
                return None  # the oldest waiting pod is not ours: no preference
            with self.lock:
                start = self.given.get(p["metadata"].get("uid", ""), 0)
            want = ids[start : start + size]
            return (p, want) if len(want) == size else None
        return None

    def prefer(self, available: list[str], must: list[str], size: int) -> list[str]:
        planned = self._planned(size)
        if planned is not None:
            want = planned[1]
            if set(want) <= set(available) and set(must) <= set(want):
                return want
            log.info(
                "GPUs %s chosen for pod %s are not all free here; kubelet picks",
                want,
                planned[0]["metadata"].get("name"),
            )
        listed = self.listed()
        numa = dict(listed)
        order = {uuid: k for k, (uuid, _) in enumerate(listed)}
        home = {numa.get(u, 0) for u in must}
        rest = sorted(
            (u for u in available if u not in must),
            key=lambda u: (numa.get(u, 0) not in home, order.get(u, 1 << 30)),
        )
        return [*must, *rest][:size]

    def given_out(self, uuids: list[str]) -> None:
        """After Allocate: which pod got these GPUs (if it is ours), recorded once all its GPUs are out.
        Kubelet sends them as a set, in its own order (a real kubelet sent 3,2 for a preferred 2,3)."""
        planned = self._planned(len(uuids))
        if planned is None or sorted(planned[1]) != sorted(uuids):
            return
        pod = planned[0]
        uid = pod["metadata"].get("uid", "")
        every = self.wanted(pod) or []
        with self.lock:
            self.given[uid] = self.given.get(uid, 0) + len(uuids)
            done = self.given[uid] >= len(every)
        if done:
            self.source.mark(pod, every)
            with self.lock:
                self.given.pop(uid, None)

    # ------------------------------------------------------------------ the gRPC service
    def _options(self, request: Any, context: Any) -> Any:
        return M["DevicePluginOptions"](get_preferred_allocation_available=True)

    def _list_and_watch(self, request: Any, context: Any) -> Iterator[Any]:
        """The devices, and again whenever they change (a MIG recut): kubelet's offer follows."""
        sent: list[tuple[str, int]] | None = None
        while True:
            now = self.listed()
            if now != sent:
                devices = [
                    M["Device"](ID=i, health=HEALTHY, topology=M["TopologyInfo"](nodes=[M["NUMANode"](ID=n)]))
                    for i, n in now
                ]
                yield M["ListAndWatchResponse"](devices=devices)
                sent = now
            if self.stop.wait(1.0) or not context.is_active():
                return

    def _preferred(self, request: Any, context: Any) -> Any:
        out = M["PreferredAllocationResponse"]()
        for c in request.container_requests:
            ids = self.prefer(
                list(c.available_deviceIDs), list(c.must_include_deviceIDs), int(c.allocation_size)
            )
            out.container_responses.add(deviceIDs=ids)
        return out

    def _allocate(self, request: Any, context: Any) -> Any:
        known = {i for i, _ in self.listed()}
        out = M["AllocateResponse"]()
        for c in request.container_requests:
            ids = list(c.devices_ids)
            unknown = [i for i in ids if i not in known]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown GPU(s) {unknown}")
            resp = out.container_responses.add()
            resp.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
            self.given_out(ids)
        return out

    def _prestart(self, request: Any, context: Any) -> Any:
        return M["PreStartContainerResponse"]()

    def handler(self) -> grpc.GenericRpcHandler:
        fns: dict[str, tuple[Callable[..., Any], str, str, bool]] = {
            "GetDevicePluginOptions": (self._options, "Empty", "DevicePluginOptions", False),
            "ListAndWatch": (self._list_and_watch, "Empty", "ListAndWatchResponse", True),
            "GetPreferredAllocation": (
                self._preferred,
                "PreferredAllocationRequest",
                "PreferredAllocationResponse",
                False,
            ),
            "Allocate": (self._allocate, "AllocateRequest", "AllocateResponse", False),
            "PreStartContainer": (
                self._prestart,
                "PreStartContainerRequest",
                "PreStartContainerResponse",
                False,
            ),
        }
        handlers = {}
        for name, (fn, req, resp, stream) in fns.items():
            make = grpc.unary_stream_rpc_method_handler if stream else grpc.unary_unary_rpc_method_handler
            handlers[name] = make(
                fn, request_deserializer=M[req].FromString, response_serializer=M[resp].SerializeToString
            )
        return grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", handlers)

    # ------------------------------------------------------------------ life
    def start(self) -> grpc.Server:
        sock = self.socket_dir / self.endpoint
        if sock.exists():
            sock.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        server.add_generic_rpc_handlers((self.handler(),))
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        return server

    def register(self, timeout: float = 10.0) -> None:
        """Tell kubelet (its Registration service on kubelet.sock) that we serve `resource`."""
        with grpc.insecure_channel(f"unix://{self.socket_dir / KUBELET_SOCKET}") as ch:
            call = ch.unary_unary(
                path("Registration", "Register"),
                request_serializer=M["RegisterRequest"].SerializeToString,
                response_deserializer=M["Empty"].FromString,
            )
            opts = M["DevicePluginOptions"](get_preferred_allocation_available=True)
            req = M["RegisterRequest"](
                version=VERSION, endpoint=self.endpoint, resource_name=self.resource, options=opts
            )
            call(req, timeout=timeout)
        log.info("registered %s with kubelet: %d device(s)", self.resource, len(self.listed()))

    def _kubelet_socket(self) -> tuple[int, int] | None:
        """Which kubelet.sock is there: (inode, change time); None when there is none."""
        try:
            st = (self.socket_dir / KUBELET_SOCKET).stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_ctime_ns

    def run(self) -> None:
        """Serve; when kubelet restarts, serve and register again. A starting kubelet makes its
        socket anew and removes the plugins' sockets; either says so (an inode alone does not: a
        new kubelet.sock may get the old one's inode number, as it did under a real kubelet)."""
        while not self.stop.is_set():
            server = self.start()
            try:
                self.register()
            except grpc.RpcError as e:
                log.warning("kubelet did not take the registration (%s); trying again in 5 s", e.code())
                server.stop(grace=0).wait()
                self.stop.wait(5.0)
                continue
            seen = self._kubelet_socket()
            ours = self.socket_dir / self.endpoint
            while not self.stop.wait(2.0):
                if self._kubelet_socket() != seen or not ours.exists():
                    log.info("kubelet restarted: registering again")
                    break
            # stopped for good before the next one binds the same path: a server still shutting
            # down could remove the new socket when its listener goes
            server.stop(grace=1.0).wait()
        sock = self.socket_dir / self.endpoint
        if sock.exists():
            os.unlink(sock)


class ApiPods:
    """This node's pods from the API server (one list per question kubelet asks: they are rare)."""

    def __init__(self, client: Any, node: str) -> None:
        self.client = client
        self.node = node

    def pods(self) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Pod

        found = self.client.list(Pod, namespace="*", fields={"spec.nodeName": self.node})
        return [p.to_dict() for p in found]

    def mark(self, pod: dict[str, Any], uuids: list[str]) -> None:

        self.note(pod, {GPU_ALLOCATED: ",".join(uuids)})

    def note(self, pod: dict[str, Any], notes: dict[str, str]) -> None:
        from lightkube.resources.core_v1 import Pod

        meta = pod["metadata"]
        patch = {"metadata": {"annotations": notes}}
        self.client.patch(Pod, meta["name"], patch, namespace=meta.get("namespace"))


def node_gpus(sys_root: Path, nvml_module: str) -> list[GpuDevice]:
    """The node's GPUs by NVML index, with their NUMA node from sysfs (none if NVML is absent)."""
    from phalanx.node import nvml, topology

    nv = nvml.load(nvml_module)
    try:
        found = nvml.gpus(nv)
    finally:
        nv.nvmlShutdown()
    return [GpuDevice(g.index, g.uuid, topology.numa_of(sys_root, g.bus_id)) for g in found if not g.mig]
