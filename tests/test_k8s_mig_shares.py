"""A fraction served by a MIG instance on Kubernetes (`--gpu-shares reservation`), KAI-style: a
reservation pod per instance asks `nvidia.com/mig-<profile>: 1` with the chosen slice, `phalanx node
reserve --mig` reports the MIG device's UUID, the share's ConfigMap names it; the world keys the
reservation by (node, GPU, slice), idles it out when no share uses it and evicts a share whose
reservation is gone. The whole-GPU path is checked unchanged beside it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import fake_nvml
from kube_objects import node, pod
from phalanx.cli.kube import _check_backends
from phalanx.core.cluster import MigSlice
from phalanx.core.decisions import Bind
from phalanx.core.errors import SpecError
from phalanx.k8s import keys
from phalanx.k8s.act.shares import Shares, is_share, reservation_name, share_env
from phalanx.k8s.act.step import Broke, Step
from phalanx.k8s.admission.mutation import MPS_VOLUME, mutate
from phalanx.k8s.client.api import Conflict, NotFound
from phalanx.k8s.client.kinds import PODS, Kind
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.patch import _special
from phalanx.k8s.read.pods import parse_pod
from phalanx.k8s.read.reservations import slot_of
from phalanx.k8s.read.world import build_world
from phalanx.node import nvml, reserve

CFG = AdapterConfig(gpu_shares="reservation")
NS = CFG.reservation_namespace
GPU_UUID = "GPU-5a1e0000-1111-2222-3333-00000000abcd"
MIG_UUID = "MIG-5a1e0000-1111-2222-3333-00000000abcd-1g.10gb-3"
MIG_BIND = Bind("default/f", "default/f", "n1", (0,), 0, 0, MigSlice("1g.10gb", 3), backend="mig")
WHOLE_BIND = Bind("default/h", "default/h", "n1", (1,), 500, 40779)


class Api:
    """Pods and ConfigMaps in dicts, with the API server's create (409) and delete (404)."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str, str, str], dict[str, Any]] = {}

    def get(self, kind: Kind, name: str, ns: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objs.get((kind.plural, ns, name)))

    def create(self, kind: Kind, body: dict[str, Any], ns: str) -> dict[str, Any]:
        key = (kind.plural, ns, body["metadata"]["name"])
        if key in self.objs:
            raise Conflict(409, "AlreadyExists")
        obj = copy.deepcopy(body)
        obj["metadata"] |= {"namespace": ns, "creationTimestamp": "2026-11-29T10:00:00Z"}
        self.objs[key] = obj
        return copy.deepcopy(obj)

    def patch(self, kind: Kind, name: str, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = self.objs[(kind.plural, ns, name)]
        obj["data"] = body["data"]
        return copy.deepcopy(obj)

    def delete(self, kind: Kind, name: str, ns: str, grace: int | None = None) -> None:
        if self.objs.pop((kind.plural, ns, name), None) is None:
            raise NotFound(404, "NotFound")


def _shares(now: float = 1_000.0) -> tuple[Shares, Api]:
    api = Api()
    return Shares(api, CFG, retry=lambda f: f(), clock=lambda: now), api  # type: ignore[arg-type]


def _share_pods() -> dict[str, dict[str, Any]]:
    return {
        "default/f": pod("f", annotations={"gpu-fraction": "0.1", keys.GPU_CONFIGMAP: "f-abc-gpu"}),
        "default/h": pod("h", annotations={"gpu-fraction": "0.5", keys.GPU_CONFIGMAP: "h-abc-gpu"}),
    }


def test_the_mig_instance_gets_a_reservation_pod_of_its_own_and_the_share_its_uuid():
    s, api = _shares()
    pods, uids = _share_pods(), {"default/f": "uid-f", "default/h": "uid-h"}
    assert is_share(MIG_BIND) and is_share(WHOLE_BIND)
    assert s.prepare([MIG_BIND, WHOLE_BIND], pods, uids) is Step.LATER
    mig_name, whole_name = reservation_name("n1", 0, "1g.10gb@3"), reservation_name("n1", 1)
    assert (mig_name, whole_name) == ("phalanx-gpu-n1-0-1g.10gb-3", "phalanx-gpu-n1-1")
    made = {name: api.objs[("pods", NS, name)] for name in (mig_name, whole_name)}
    assert len(api.objs) == 2
    mig = made[mig_name]
    box = mig["spec"]["containers"][0]
    assert box["resources"]["requests"]["nvidia.com/mig-1g.10gb"] == "1"
    assert box["resources"]["limits"] == {"memory": "128Mi", "nvidia.com/mig-1g.10gb": "1"}
    assert keys.GPU_RESOURCE not in box["resources"]["requests"]
    assert box["args"] == ["node", "reserve", "--in-cluster", "--mig"]
    notes = mig["metadata"]["annotations"]
    assert (notes[keys.MIG_SLICE], notes[keys.GPU_DEVICES], notes[keys.NODE_INTENT]) == (
        "1g.10gb@3",
        "0",
        "n1",
    )
    assert slot_of(mig, CFG) == ("n1", 0, "1g.10gb@3")
    # the whole GPU's reservation pod is what it always was
    whole = made[whole_name]
    assert whole["spec"]["containers"][0]["resources"]["limits"] == {
        "memory": "128Mi",
        keys.GPU_RESOURCE: "1",
    }
    assert whole["spec"]["containers"][0]["args"] == ["node", "reserve", "--in-cluster"]
    assert keys.MIG_SLICE not in whole["metadata"]["annotations"] and slot_of(whole, CFG) == ("n1", 1)
    # the node reports: the MIG device's UUID, the GPU's
    api.objs[("pods", NS, mig_name)]["metadata"]["annotations"][keys.RESERVED_GPU] = MIG_UUID
    assert s.prepare([MIG_BIND, WHOLE_BIND], pods, uids) is Step.LATER  # the GPU is not reported yet
    api.objs[("pods", NS, whole_name)]["metadata"]["annotations"][keys.RESERVED_GPU] = GPU_UUID
    assert s.prepare([MIG_BIND, WHOLE_BIND], pods, uids) is Step.READY
    cm = api.objs[("configmaps", "default", "f-abc-gpu")]
    assert cm["data"] == {
        "NVIDIA_VISIBLE_DEVICES": MIG_UUID,
        "PHALANX_GPU_BACKEND": "mig",
        "PHALANX_MIG_SLICE": "1g.10gb@3",
    }
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "uid-f"
    assert api.objs[("configmaps", "default", "h-abc-gpu")]["data"] == {
        "NVIDIA_VISIBLE_DEVICES": GPU_UUID,
        "PHALANX_GPU_FRACTION": "0.5",
    }


def test_a_pod_asking_the_slice_itself_is_no_share():
    direct = Bind("default/d", "default/d", "n1", (0,), 0, 0, MigSlice("1g.10gb", 3))
    assert not is_share(direct)
    s, api = _shares()
    assert s.prepare([direct], {}, {}) is Step.READY and not api.objs


def test_a_mig_share_with_the_hardware_limit_gets_no_software_limits():
    env = share_env(MIG_BIND, [MIG_UUID], AdapterConfig(share_limit_env=True))
    assert not any(k.startswith("CUDA_") for k in env) and env["NVIDIA_VISIBLE_DEVICES"] == MIG_UUID


def test_a_reservation_pod_kubelet_gave_another_instance_sends_the_share_back_to_be_placed():
    s, api = _shares()
    assert s.prepare([MIG_BIND], _share_pods(), {}) is Step.LATER
    name = reservation_name("n1", 0, "1g.10gb@3")
    # the MIG device plugin corrected its annotations: it holds 1g.10gb@4
    api.objs[("pods", NS, name)]["metadata"]["annotations"][keys.MIG_SLICE] = "1g.10gb@4"
    s.refresh({})  # the store does not show it at (n1, 0, 1g.10gb@3)
    out = s.prepare([MIG_BIND], _share_pods(), {})
    assert isinstance(out, Broke)
    assert out.why == (
        f"the reservation pod {name} made for MIG instance 1g.10gb@3 of GPU 0 of n1 "
        "holds MIG instance 1g.10gb@4 of GPU 0 of n1"
    )


def test_a_reservation_pod_with_no_mig_device_says_which_plugin_offers_one():
    s, api = _shares(now=2_000_000_000.0)  # long after its creation (2026-11-29)
    api.create(PODS, {"metadata": {"name": reservation_name("n1", 0, "1g.10gb@3")}}, NS)
    out = s.prepare([MIG_BIND], _share_pods(), {})
    assert isinstance(out, Broke) and not api.objs  # deleted: the share is placed again
    assert out.why.startswith("the reservation pod for MIG instance 1g.10gb@3 of GPU 0 of n1 reported no MIG")
    assert (
        "free nvidia.com/mig-1g.10gb, offered by `phalanx node device-plugin --mig-strategy mixed`" in out.why
    )


# ------------------------------------------------------------------ the world: keys, idle, orphans
def _mig_node() -> dict[str, Any]:
    return node(
        "n1",
        gpus=0,
        labels={"nvidia.com/gpu.count": "2", "nvidia.com/mig.config": "all-1g.10gb"},
        extra={"nvidia.com/mig-1g.10gb": "14"},
    )


def _bound_mig_share(name: str = "f", start: int = 3) -> dict[str, Any]:
    notes = {
        "gpu-fraction": "0.1",
        keys.GPU_BACKEND: "mig",
        keys.GPU_CONFIGMAP: f"{name}-abc-gpu",
        keys.NODE_INTENT: "n1",
        keys.GPU_DEVICES: "0",
        keys.MIG_SLICE: f"1g.10gb@{start}",
        keys.GPU_BACKEND_CHOSEN: "mig",
    }
    p = pod(name, annotations=notes, node="n1")
    p["status"]["phase"] = "Running"
    return p


def _reservation(slot: str, gpu: int = 0) -> dict[str, Any]:
    p = pod(
        reservation_name("n1", gpu, slot),
        ns=NS,
        scheduler="",
        labels={keys.GPU_RESERVATION: str(gpu)},
        annotations={keys.MIG_SLICE: slot, keys.GPU_DEVICES: str(gpu), keys.RESERVED_GPU: MIG_UUID},
        resources={"nvidia.com/mig-1g.10gb": "1"},
        node="n1",
    )
    p["status"]["phase"] = "Running"
    return p


def _mask(w: Any, start: int) -> int:
    at = Bind("x", "", "n1", (0,), mig=MigSlice("1g.10gb", start))
    return int(w.snapshot.assignment_of(at).mig_mask)


def test_the_world_keys_a_mig_reservation_by_its_instance():
    share, held = _bound_mig_share(), _reservation("1g.10gb@3")
    w = build_world([_mig_node()], [share, held], [], [], CFG, now=100.0)
    assert set(w.reservations) == {("n1", 0, "1g.10gb@3")}
    assert not w.idle_reservations and not w.orphan_shares
    a = w.snapshot.allocations["default/f"]
    assert a.devices.mig == MigSlice("1g.10gb", 3)  # the share holds the instance, counted once
    assert int(w.snapshot.cluster.mig_used[0, 0]) == _mask(w, 3)
    # a second reservation on the same GPU, at another instance, is idle: deleted by the executor,
    # and until then its instance is held (no pod asking the slice is placed there)
    w = build_world([_mig_node()], [share, held, _reservation("1g.10gb@4")], [], [], CFG, now=100.0)
    assert w.idle_reservations == [("n1", 0, "1g.10gb@4")]
    assert int(w.snapshot.cluster.mig_used[0, 0]) == _mask(w, 3) | _mask(w, 4)
    # the reservation gone: the share is evicted
    w = build_world([_mig_node()], [share], [], [], CFG, now=100.0)
    assert w.orphan_shares == {"default/f": ("n1", 0, "1g.10gb@3")}
    # a whole-GPU reservation of GPU 0 does not stand for the instance
    whole = pod(
        reservation_name("n1", 0), ns=NS, scheduler="", labels={keys.GPU_RESERVATION: "0"}, gpus=1, node="n1"
    )
    w = build_world([_mig_node()], [share, whole], [], [], CFG, now=100.0)
    assert w.orphan_shares == {"default/f": ("n1", 0, "1g.10gb@3")} and w.idle_reservations == [("n1", 0)]


def test_a_mig_share_is_never_patched_into_the_world():
    assert _special(parse_pod(_bound_mig_share(), CFG))
    direct = pod("d", resources={"nvidia.com/mig-1g.10gb": "1"}, annotations={keys.MIG_SLICE: "1g.10gb@0"})
    assert not _special(parse_pod(direct, CFG))


# ------------------------------------------------------------------ the reservation pod's program
def test_reserve_reports_the_mig_device_the_plugin_handed_out(monkeypatch: pytest.MonkeyPatch):
    assert reserve.my_mig("no_such_nvml", visible=MIG_UUID) == MIG_UUID  # NVML is not asked
    with pytest.raises(nvml.NvmlUnavailable, match="NVIDIA_VISIBLE_DEVICES names 2"):
        reserve.my_mig("no_such_nvml", visible=f"{MIG_UUID},MIG-x")
    # another device-list strategy: NVML's MIG devices, exactly one
    gpu = {"uuid": GPU_UUID, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "bus_id": "0000:05:00.0"}
    monkeypatch.setattr(fake_nvml, "CONFIG", {"gpus": [{**gpu, "mig": True, "mig_instances": ["1g.10gb@3"]}]})
    assert reserve.my_mig("fake_nvml", visible="/var/run/nvidia-container-devices") == MIG_UUID
    two = {"gpus": [{**gpu, "mig": True, "mig_instances": ["1g.10gb@3", "1g.10gb@4"]}]}
    monkeypatch.setattr(fake_nvml, "CONFIG", two)
    with pytest.raises(nvml.NvmlUnavailable, match="exactly one MIG device, NVML shows 2"):
        reserve.my_mig("fake_nvml", visible="")
    monkeypatch.setattr(fake_nvml, "CONFIG", {"gpus": [gpu]})  # a whole GPU: no MIG device
    with pytest.raises(nvml.NvmlUnavailable, match="NVML shows 0"):
        reserve.my_mig("fake_nvml", visible="")


# ------------------------------------------------------------------ admission and start-up
def test_the_webhook_admits_a_pod_asking_mig_with_its_configmap():
    p = pod("m", annotations={"gpu-fraction": "0.1", keys.GPU_BACKEND: "mig"})
    out = mutate(p, "default", AdapterConfig(mps_shares=True))
    assert out is not None
    cm = out["metadata"]["annotations"][keys.GPU_CONFIGMAP]
    assert out["spec"]["containers"][0]["envFrom"] == [{"configMapRef": {"name": cm, "optional": False}}]
    assert not any(v["name"] == MPS_VOLUME for v in out["spec"].get("volumes", []))
    two = pod(
        "m2", annotations={"gpu-fraction": "0.1", "gpu-fraction-num-devices": "2", keys.GPU_BACKEND: "mig"}
    )
    with pytest.raises(SpecError, match="a MIG instance is one device; this asks 2"):
        mutate(two, "default", AdapterConfig())


def test_the_scheduler_starts_with_a_mig_policy_and_reservation_shares():
    _check_backends("/run/nvidia/mps")
    with pytest.raises(SpecError, match=r"^--mps-pipe-directory: must be an absolute path"):
        _check_backends("run/mps")
