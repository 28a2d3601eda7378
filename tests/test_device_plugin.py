"""`phalanx node device-plugin` through kubelet's device-plugin gRPC API.

A test double of kubelet's Registration service listens on `kubelet.sock`; the test then
plays kubelet's device manager against the plugin's socket, call by call, as kubelet does
when it admits a pod: GetPreferredAllocation, then Allocate.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from kube_objects import pod
from phalanx.node.deviceplugin import GPU_ALLOCATED, GpuDevice, Plugin
from phalanx.node.dpapi import KUBELET_SOCKET, M, path

UUIDS = [f"GPU-{k:08d}-0000-0000-0000-000000000000" for k in range(8)]


class FakePods:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.items = pods
        self.marked: list[tuple[str, list[str]]] = []

    def pods(self) -> list[dict[str, Any]]:
        return self.items

    def mark(self, p: dict[str, Any], uuids: list[str]) -> None:
        self.marked.append((p["metadata"]["name"], uuids))
        p["metadata"]["annotations"][GPU_ALLOCATED] = ",".join(uuids)


class FakeKubelet:
    """Kubelet's Registration service: records what plugins register."""

    def __init__(self, folder: Path) -> None:
        self.registered: list[Any] = []
        self.got = threading.Event()

        def register(req: Any, ctx: Any) -> Any:
            self.registered.append(req)
            self.got.set()
            return M["Empty"]()

        handler = grpc.unary_unary_rpc_method_handler(
            register,
            request_deserializer=M["RegisterRequest"].FromString,
            response_serializer=M["Empty"].SerializeToString,
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1beta1.Registration", {"Register": handler}),)
        )
        self.server.add_insecure_port(f"unix://{folder / KUBELET_SOCKET}")
        self.server.start()


def _bound(name: str, created: str, gpus: int, devices: str = "") -> dict[str, Any]:
    p = pod(
        name,
        gpus=gpus,
        node="n0",
        created=created,
        annotations={"phalanx.io/gpu-devices": devices} if devices else {},
    )
    p["metadata"]["uid"] = f"uid-{name}"
    return p


@pytest.fixture
def folder() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # unix socket paths must stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kubelet(folder: Path) -> Iterator[FakeKubelet]:
    k = FakeKubelet(folder)
    yield k
    k.server.stop(0)


def _call(ch: grpc.Channel, method: str, req: Any, resp: str) -> Any:
    fn = ch.unary_unary(
        path("DevicePlugin", method),
        request_serializer=req.SerializeToString,
        response_deserializer=M[resp].FromString,
    )
    return fn(req, timeout=5)


def _prefer(ch: grpc.Channel, available: list[str], size: int, must: list[str] | None = None) -> list[str]:
    req = M["PreferredAllocationRequest"]()
    req.container_requests.add(
        available_deviceIDs=available, must_include_deviceIDs=must or [], allocation_size=size
    )
    return list(
        _call(ch, "GetPreferredAllocation", req, "PreferredAllocationResponse")
        .container_responses[0]
        .deviceIDs
    )


def _allocate(ch: grpc.Channel, ids: list[str]) -> dict[str, str]:
    req = M["AllocateRequest"]()
    req.container_requests.add(devices_ids=ids)
    return dict(_call(ch, "Allocate", req, "AllocateResponse").container_responses[0].envs)


def test_registers_lists_and_allocates_what_the_scheduler_chose(folder: Path, kubelet: FakeKubelet) -> None:
    gpus = [GpuDevice(k, UUIDS[k], k // 4) for k in range(8)]
    pods = FakePods(
        [
            _bound("running", "2026-11-29T09:00:00Z", 2, "0,1") | {"status": {"phase": "Running"}},
            _bound("ours", "2026-11-29T10:00:00Z", 2, "5,6"),
            _bound("theirs", "2026-11-29T11:00:00Z", 2),
        ]
    )
    plugin = Plugin(gpus, pods, socket_dir=folder)
    server = plugin.start()
    try:
        plugin.register()
        assert kubelet.got.wait(5)
        reg = kubelet.registered[0]
        assert (reg.version, reg.endpoint, reg.resource_name) == (
            "v1beta1",
            "phalanx-gpu.sock",
            "nvidia.com/gpu",
        )
        assert reg.options.get_preferred_allocation_available
        with grpc.insecure_channel(f"unix://{folder / reg.endpoint}") as ch:
            opts = _call(ch, "GetDevicePluginOptions", M["Empty"](), "DevicePluginOptions")
            assert opts.get_preferred_allocation_available and not opts.pre_start_required
            stream = ch.unary_stream(
                path("DevicePlugin", "ListAndWatch"),
                request_serializer=M["Empty"].SerializeToString,
                response_deserializer=M["ListAndWatchResponse"].FromString,
            )(M["Empty"](), timeout=5)
            first = next(stream)
            assert [(d.ID, d.health, d.topology.nodes[0].ID) for d in first.devices] == [
                (UUIDS[k], "Healthy", k // 4) for k in range(8)
            ]
            stream.cancel()
            # kubelet admits the oldest waiting pod first: ours, placed on GPUs 5 and 6
            free = UUIDS[2:]
            assert _prefer(ch, free, 2) == [UUIDS[5], UUIDS[6]]
            # kubelet's Allocate carries them as a set, in its own order (seen on a real kubelet)
            env = _allocate(ch, [UUIDS[6], UUIDS[5]])
            assert env == {"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[6]},{UUIDS[5]}"}
            assert pods.marked == [("ours", [UUIDS[5], UUIDS[6]])]
            # then another scheduler's pod: no choice of ours, so the NUMA node of what it must have
            left = [u for u in free if u not in (UUIDS[5], UUIDS[6])]
            assert _prefer(ch, left, 2, must=[UUIDS[7]]) == [UUIDS[7], UUIDS[4]]
            # an unknown device is refused, not handed out
            with pytest.raises(grpc.RpcError) as err:
                _allocate(ch, ["GPU-nope"])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        plugin.stop.set()
        server.stop(0)


def test_choice_that_is_not_free_falls_back_to_kubelets(folder: Path) -> None:
    gpus = [GpuDevice(k, UUIDS[k], 0) for k in range(4)]
    plugin = Plugin(gpus, FakePods([_bound("ours", "2026-11-29T10:00:00Z", 2, "2,3")]), socket_dir=folder)
    assert plugin.prefer([UUIDS[0], UUIDS[1], UUIDS[2]], [], 2) == [UUIDS[0], UUIDS[1]]
    assert plugin.prefer(UUIDS, [], 2) == [UUIDS[2], UUIDS[3]]


def test_registers_again_when_kubelet_restarts(folder: Path) -> None:
    """A starting kubelet makes kubelet.sock anew and removes the plugins' sockets. The plugin
    registers again on either sign: a new socket (even one that got the old inode number, as
    happened under a real kubelet), or its own socket gone."""
    first = FakeKubelet(folder)
    plugin = Plugin([GpuDevice(0, UUIDS[0])], FakePods([]), socket_dir=folder)
    t = threading.Thread(target=plugin.run, daemon=True)
    t.start()
    try:
        assert first.got.wait(10)
        # kubelet restarts in its own order: the new kubelet removes the plugins' sockets, then
        # makes kubelet.sock anew. (Stopping the old one first let the plugin see kubelet.sock go,
        # restart its own server and so remove its socket before this test did: a race on a busy
        # machine, not a fault of the plugin.)
        (folder / plugin.endpoint).unlink()
        first.server.stop(0).wait()
        (folder / KUBELET_SOCKET).unlink(missing_ok=True)
        second = FakeKubelet(folder)
        assert second.got.wait(15), "no registration with the restarted kubelet"
        # only our socket removed (kubelet.sock looks the same): registered again all the same
        second.got.clear()
        (folder / plugin.endpoint).unlink()
        assert second.got.wait(15), "no registration after our socket was removed"
        assert [r.resource_name for r in second.registered] == ["nvidia.com/gpu", "nvidia.com/gpu"]
        second.server.stop(0)
    finally:
        plugin.stop.set()
        t.join(timeout=10)
