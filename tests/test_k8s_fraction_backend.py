"""The Kubernetes side of a fraction's backend: the pod's choice read, the choice written on the
pod and read back, the MPS client's environment, the webhook's pipe-directory mount, Events."""

from __future__ import annotations

import pytest

from kube_objects import pod
from phalanx.core.cluster import MigSlice
from phalanx.core.decisions import Bind
from phalanx.core.errors import SpecError
from phalanx.k8s import keys
from phalanx.k8s.act.explain import served_by
from phalanx.k8s.act.shares import share_env
from phalanx.k8s.admission.mutation import MPS_VOLUME, mutate
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.devices import binding_notes, decode
from phalanx.k8s.read.pods import parse_pod

UUID = "GPU-5a1e0000-1111-2222-3333-00000000abcd"
CFG = AdapterConfig()


def _share(name: str, fraction: str = "0.5", backend: str | None = None) -> dict:
    notes = {"gpu-fraction": fraction}
    if backend is not None:
        notes[keys.GPU_BACKEND] = backend
    return pod(name, annotations=notes)


def test_the_pods_choice_is_read():
    assert parse_pod(_share("a", backend="mps"), CFG).request.gpu.backends == ("mps",)
    assert parse_pod(_share("b", backend="auto"), CFG).request.gpu.backends == ()
    assert parse_pod(_share("c"), CFG).request.gpu.backends == ()
    # on a whole-GPU pod a good value changes nothing
    whole = pod("w", gpus=1, annotations={keys.GPU_BACKEND: "mps"})
    assert parse_pod(whole, CFG).request.gpu.backends == ()


@pytest.mark.parametrize(
    ("notes", "message"),
    [
        ({"gpu-fraction": "0.5", keys.GPU_BACKEND: "vgpu"}, "unknown GPU backend 'vgpu'"),
        (
            {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2", keys.GPU_BACKEND: "mig"},
            "a MIG instance is one device; this asks 2",
        ),
    ],
)
def test_a_bad_choice_is_one_line_naming_pod_and_annotation(notes, message):
    with pytest.raises(SpecError) as e:
        parse_pod(pod("p", annotations=notes), CFG)
    assert str(e.value).startswith(f"pod default/p: annotation {keys.GPU_BACKEND}: ")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_choice_is_written_with_the_assignment_and_read_back():
    mps = Bind("default/a", "w", "n0", (1,), 500, 40779, backend="mps")
    notes = binding_notes(mps)
    assert notes[keys.GPU_BACKEND_CHOSEN] == "mps"
    assert decode(notes, "default/a", "w", "n0") == mps
    mig = Bind("default/b", "w", "n0", (0,), 0, 0, MigSlice("1g.10gb", 3), backend="mig")
    assert decode(binding_notes(mig), "default/b", "w", "n0") == mig
    plain = Bind("default/c", "w", "n0", (0,), 500, 40779)
    assert keys.GPU_BACKEND_CHOSEN not in binding_notes(plain)
    with pytest.raises(SpecError, match=f"pod default/c: {keys.GPU_BACKEND_CHOSEN}: expected one of"):
        decode({**binding_notes(plain), keys.GPU_BACKEND_CHOSEN: "x"}, "default/c", "w", "n0")


def test_an_mps_share_gets_the_mps_clients_environment():
    b = Bind("default/a", "w", "n0", (1,), 333, 27159, backend="mps")
    env = share_env(b, [UUID], CFG)
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": UUID,
        "PHALANX_GPU_FRACTION": "0.333",
        "PHALANX_GPU_BACKEND": "mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "34",  # rounded up
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{UUID}=27159M",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia/mps",
    }
    ts = share_env(Bind("default/t", "w", "n0", (0,), 500, 40779, backend="time-slice"), [UUID], CFG)
    assert not any(k.startswith("CUDA_MPS") for k in ts)
    assert share_env(Bind("default/o", "w", "n0", (0,), 500, 40779), [UUID], CFG) == {
        "NVIDIA_VISIBLE_DEVICES": UUID,
        "PHALANX_GPU_FRACTION": "0.5",
    }


def _mps_volume(p: dict) -> list[str]:
    vols = [v for v in p["spec"].get("volumes", []) if v["name"] == MPS_VOLUME]
    mounts = [m["mountPath"] for m in p["spec"]["containers"][0].get("volumeMounts", [])]
    return [v["hostPath"]["path"] for v in vols] + mounts


def test_the_webhook_mounts_the_pipe_directory_where_mps_may_serve():
    asks = mutate(_share("a", backend="mps"), "default", CFG)
    assert asks is not None and _mps_volume(asks) == ["/run/nvidia/mps", "/run/nvidia/mps"]
    auto = mutate(_share("b"), "default", CFG)
    assert auto is not None and _mps_volume(auto) == []
    policy = AdapterConfig(mps_shares=True, mps_pipe_directory="/var/run/mps")
    auto = mutate(_share("c"), "default", policy)
    assert auto is not None and _mps_volume(auto) == ["/var/run/mps", "/var/run/mps"]
    ts = mutate(_share("d", backend="time-slice"), "default", policy)
    assert ts is not None and _mps_volume(ts) == []


def test_the_scheduled_event_says_what_serves_the_share():
    assert served_by(Bind("a", "w", "n", (0,), 500, 1, backend="mps")) == ", GPU share served by mps"
    mig = Bind("a", "w", "n", (0,), 0, 0, MigSlice("1g.10gb", 3), backend="mig")
    assert served_by(mig) == ", GPU share served by MIG instance 1g.10gb@3"
    assert served_by(Bind("a", "w", "n", (0,), 500, 1)) == ""
