"""GPU shares on the stock device plugin, on a real control plane (issue 13's done criteria).

No kubelet runs here, so the test plays the node: it runs `phalanx node reserve` (with the
fake NVML, as the reservation pod's container would with the real one) and marks the
reservation pod running. The admission webhook is the real one, called by the real
kube-apiserver over TLS with its self-made certificate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e_kube import Kube, phalanx, running, wait_for
from helm_chart import render
from kube_objects import node, pod
from phalanx.k8s import keys
from phalanx.k8s.act.failpoint import EXIT_CODE
from phalanx.k8s.admission.webhook import WEBHOOK_CONFIG, CertSource, Webhook
from phalanx.k8s.client.api import Api, ApiError
from phalanx.k8s.client.kinds import CONFIG_MAPS, WEBHOOK_CONFIGS
from phalanx.k8s.config import AdapterConfig

pytestmark = pytest.mark.e2e
NS = "phalanx-system"
UUID = "GPU-5a1e0000-1111-2222-3333-00000000abcd"
TESTS = Path(__file__).resolve().parent


@pytest.fixture
def webhook(kube: Kube) -> Iterator[Webhook]:
    """The real webhook, registered with the API server by the Helm chart's configuration (URL instead
    of Service), with the chart's PriorityClass and accounts for reservation shares."""
    chart = render({"scheduler": {"gpuShares": "reservation"}})  # skips here without helm
    kube.ensure_namespace(NS)
    api = Api.connect(kubeconfig=str(kube.cp.kubeconfig))
    hook = Webhook(
        CertSource(api, NS, "phalanx-webhook", extra_names=("127.0.0.1",)), AdapterConfig(), "127.0.0.1", 0
    )
    for doc in chart:
        if doc["kind"] in ("PriorityClass", "ServiceAccount"):
            kube.apply(doc)
        elif doc["kind"] == "MutatingWebhookConfiguration":
            for h in doc["webhooks"]:
                h["clientConfig"] = {"url": f"https://127.0.0.1:{hook.port}/mutate"}
            kube.apply(doc)
    assert hook.refresh() is False  # same certificate; the CA went into the new configuration
    cfg = kube.get(WEBHOOK_CONFIGS, WEBHOOK_CONFIG)
    assert cfg is not None and cfg["webhooks"][0]["clientConfig"]["caBundle"]
    stop = threading.Event()
    t = threading.Thread(target=hook.serve, args=(stop, 3600.0), daemon=True)
    t.start()
    probe = pod("probe", annotations={"gpu-fraction": "0.5"})
    wait_for("the API server to call the webhook", lambda: _mutated(kube, probe) is True, timeout=30)
    try:
        yield hook
    finally:
        kube.api.delete(WEBHOOK_CONFIGS, WEBHOOK_CONFIG)
        stop.set()
        t.join(timeout=10)
        api.close()

        # the API server's copy of the configuration lags a moment
        wait_for("the API server to forget the webhook", lambda: _mutated(kube, probe) is False, timeout=30)


def _mutated(kube: Kube, probe: dict[str, Any]) -> bool | None:
    """Whether a dry-run create comes back through the webhook (None: the call failed)."""
    try:
        return keys.GPU_CONFIGMAP in kube.create(probe, dry_run=True)["metadata"].get("annotations", {})
    except ApiError:
        return None


def _nvml(tmp_path: Path) -> Path:
    f = tmp_path / "nvml.json"
    gpu = {"uuid": UUID, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "bus_id": "0000:05:00.0"}
    f.write_text(json.dumps({"gpus": [gpu]}))
    return f


def _reservations(kube: Kube) -> dict[str, dict[str, Any]]:
    return {n: p for n, p in kube.pods(NS).items() if keys.GPU_RESERVATION in p["metadata"].get("labels", {})}


def _play_node(kube: Kube, name: str, nvml: Path, visible: str = "", mig: bool = False) -> None:
    """What the node does for a reservation pod: kubelet runs it, it reports its GPU (with `mig`,
    the MIG device the device plugin put in its NVIDIA_VISIBLE_DEVICES: `visible`)."""
    env = {
        **os.environ,
        "PHALANX_FAKE_NVML": str(nvml),
        "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path]),
        **({"NVIDIA_VISIBLE_DEVICES": visible} if visible else {}),
    }
    args = ["node", "reserve", *(["--mig"] if mig else []), "--pod", f"{NS}/{name}"]
    args += ["--kubeconfig", str(kube.cp.kubeconfig)]
    res = subprocess.run(
        [sys.executable, "-m", "phalanx.cli.main", *args, "--nvml-module", "fake_nvml", "--once"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    kube.run_pod(name, NS)


def _serve_reservations(kube: Kube, nvml: Path) -> None:
    for name, p in _reservations(kube).items():
        if keys.RESERVED_GPU not in p["metadata"].get("annotations", {}) and not p["metadata"].get(
            "deletionTimestamp"
        ):
            _play_node(kube, name, nvml)


def _shares(kube: Kube) -> list[dict[str, Any]]:
    out = []
    for name in ("s1", "s2"):
        created = kube.create(pod(name, annotations={"gpu-fraction": "0.5"}))
        notes = created["metadata"]["annotations"]
        cm = notes[keys.GPU_CONFIGMAP]  # the webhook ran
        assert created["spec"]["containers"][0]["envFrom"] == [
            {"configMapRef": {"name": cm, "optional": False}}
        ]
        out.append(created)
    return out


def _check_shared(kube: Kube) -> None:
    """Both shares bound to the GPU one reservation pod holds, their ConfigMaps naming its UUID."""
    wait_for(
        "both shares bound", lambda: kube.node_of("s1") == "n0" and kube.node_of("s2") == "n0", timeout=40
    )
    pods = kube.pods()
    devices = {pods[n]["metadata"]["annotations"][keys.GPU_DEVICES] for n in ("s1", "s2")}
    assert len(devices) == 1, devices
    held = _reservations(kube)
    assert len(held) == 1, sorted(held)
    (res,) = held.values()
    assert res["metadata"]["labels"][keys.GPU_RESERVATION] == devices.pop()
    assert res["spec"]["nodeName"] == "n0"
    assert res["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    for n in ("s1", "s2"):
        cm = kube.get(CONFIG_MAPS, pods[n]["metadata"]["annotations"][keys.GPU_CONFIGMAP], "default")
        assert cm is not None and cm["data"]["NVIDIA_VISIBLE_DEVICES"] == UUID
        assert cm["data"]["PHALANX_GPU_FRACTION"] == "0.5"
        assert cm["metadata"]["ownerReferences"][0]["uid"] == pods[n]["metadata"]["uid"]


def _end_shares(kube: Kube) -> None:
    for n in ("s1", "s2"):
        kube.force_delete_pod(n)
    wait_for("the reservation pod removed", lambda: not _reservations(kube), timeout=30)


def test_two_half_gpu_pods_share_one_reserved_gpu(kube: Kube, webhook: Webhook, tmp_path: Path) -> None:
    nvml = _nvml(tmp_path)
    kube.api.create("nodes", node("n0", gpus=2))
    with running(kube, gpu_shares="reservation"):
        _shares(kube)
        wait_for("a reservation pod", lambda: _reservations(kube), timeout=30)
        time.sleep(1.0)  # several cycles: nothing is bound while the GPU is not reported
        assert kube.node_of("s1") == "" and kube.node_of("s2") == ""
        assert len(_reservations(kube)) == 1
        _serve_reservations(kube, nvml)
        _check_shared(kube)
        # the reserved GPU counts once, for the shares: one whole GPU is left, not zero, not two
        kube.create(pod("w1", gpus=1))
        kube.create(pod("w2", gpus=1))
        wait_for("w1 bound", lambda: kube.node_of("w1") == "n0", timeout=20)
        time.sleep(1.0)
        assert kube.node_of("w2") == ""
        for n in ("w1", "w2"):
            kube.force_delete_pod(n)
        _end_shares(kube)


@pytest.mark.parametrize("point", ["plan-written", "reservation-made", "configmap-written", "bound"])
def test_a_kill_between_any_two_steps_is_recovered(
    kube: Kube, webhook: Webhook, tmp_path: Path, point: str
) -> None:
    nvml = _nvml(tmp_path)
    kube.api.create("nodes", node("n0", gpus=2))
    args = ["scheduler", "--kubeconfig", str(kube.cp.kubeconfig), "--no-leader-elect", "--port", "0"]
    args += ["--cycle-seconds", "0.2", "--gpu-shares", "reservation"]
    proc = phalanx(*args, env={**os.environ, "PHALANX_FAILPOINT": point})
    try:
        _shares(kube)

        def died() -> bool:
            _serve_reservations(kube, nvml)  # the node does its part whenever there is one
            return proc.poll() is not None

        wait_for(f"the scheduler to die at {point}", died, timeout=40, every=0.2)
        out = proc.communicate(timeout=10)[0]
        assert proc.returncode == EXIT_CODE, out
        assert f"failpoint {point}" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    with running(kube, gpu_shares="reservation"):

        def finished() -> bool:
            _serve_reservations(kube, nvml)
            return kube.node_of("s1") == "n0" and kube.node_of("s2") == "n0"

        wait_for("both shares bound after the restart", finished, timeout=40, every=0.2)
        _check_shared(kube)
        _end_shares(kube)


def test_webhook_certificate_is_shared_renewed_and_reloaded(kube: Kube) -> None:
    import base64

    from phalanx.k8s import certs
    from phalanx.k8s.admission.webhook import SECRET
    from phalanx.k8s.client.kinds import SECRETS

    kube.ensure_namespace(NS)
    if kube.get(SECRETS, SECRET, NS) is not None:
        kube.api.delete(SECRETS, SECRET, NS)
    api = Api.connect(kubeconfig=str(kube.cp.kubeconfig))
    try:
        a = CertSource(api, NS, "phalanx-webhook", extra_names=("127.0.0.1",))
        b = CertSource(api, NS, "phalanx-webhook", extra_names=("127.0.0.1",))
        first = a.get()
        assert b.get() == first  # a second replica serves the same certificate
        # a certificate about to expire (10 days left) is replaced, and the server reloads it
        ca = certs.make_ca("old")
        leaf = certs.issue(ca, "x", server_names=a.names, days=10)
        secret = kube.get(SECRETS, SECRET, NS) or {}
        secret["data"] = {
            k: base64.b64encode(v).decode()
            for k, v in (("ca.crt", ca.cert), ("tls.crt", leaf.cert), ("tls.key", leaf.key))
        }
        kube.api.replace(SECRETS, secret)
        hook = Webhook(a, AdapterConfig(), "127.0.0.1", 0)
        renewed = hook.current
        assert renewed is not None and renewed.cert not in (leaf.cert, first.cert)
        assert (certs.expires(renewed.cert) - certs.expires(leaf.cert)).days > 300
        assert b.get() == renewed and hook.refresh() is False
        hook.server.server_close()
    finally:
        api.close()


def test_a_share_served_by_mps_gets_the_mps_clients_env(kube: Kube, webhook: Webhook, tmp_path: Path) -> None:
    """A profile that serves fractions by MPS before time-slice: the MPS share's ConfigMap carries
    CUDA_MPS_* for the reserved GPU, the webhook mounted the pipe directory, the pod and its Scheduled
    Event say the backend; a pod that asks time-slice itself goes to another GPU (never mixed)."""
    nvml = _nvml(tmp_path)
    prof = tmp_path / "mps.yaml"
    prof.write_text(
        "name: mps-first\nactions: [{name: allocate}]\nscorers: [{name: binpack}]\n"
        "fraction_backend: {order: [mps, time-slice]}\n"
    )
    kube.api.create("nodes", node("n0", gpus=2))
    with running(kube, profile=str(prof), gpu_shares="reservation"):
        m = kube.create(pod("m1", annotations={"gpu-fraction": "0.5", keys.GPU_BACKEND: "mps"}))
        assert {"name": "phalanx-mps-pipe", "mountPath": "/run/nvidia/mps"} in m["spec"]["containers"][0][
            "volumeMounts"
        ]
        kube.create(pod("t1", annotations={"gpu-fraction": "0.25", keys.GPU_BACKEND: "time-slice"}))
        wait_for("two reservation pods", lambda: len(_reservations(kube)) == 2, timeout=30)
        _serve_reservations(kube, nvml)
        wait_for("both bound", lambda: kube.node_of("m1") == "n0" and kube.node_of("t1") == "n0", timeout=40)
        pods = kube.pods()
        notes = {n: pods[n]["metadata"]["annotations"] for n in ("m1", "t1")}
        assert notes["m1"][keys.GPU_BACKEND_CHOSEN] == "mps"
        assert notes["t1"][keys.GPU_BACKEND_CHOSEN] == "time-slice"
        assert notes["m1"][keys.GPU_DEVICES] != notes["t1"][keys.GPU_DEVICES]
        cm = kube.get(CONFIG_MAPS, notes["m1"][keys.GPU_CONFIGMAP], "default")
        assert cm is not None
        assert {k: v for k, v in cm["data"].items() if k.startswith("CUDA_MPS")} == {
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{UUID}=40779M",  # half of the node's 81559 MiB
            "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia/mps",
        }
        ts = kube.get(CONFIG_MAPS, notes["t1"][keys.GPU_CONFIGMAP], "default")
        assert ts is not None and not any(k.startswith("CUDA_MPS") for k in ts["data"])
        # decided while its GPU was not reserved yet: said then (bound in a later cycle)
        wait_for(
            "the Event that says the backend",
            lambda: any(
                r == "GPUBackendChosen" and "GPU share served by mps" in msg for r, msg in kube.events("m1")
            ),
            timeout=20,
        )
        for n in ("m1", "t1"):
            kube.force_delete_pod(n)
        wait_for("the reservation pods removed", lambda: not _reservations(kube), timeout=30)


MIG_GPU = "GPU-3c1e0000-1111-2222-3333-00000000abcd"


def _mig_uuid(slice_: str) -> str:
    """The MIG device's UUID as the fake NVML names it (`MIG-<gpu>-<profile>-<start>`)."""
    profile, _, start = slice_.partition("@")
    return f"MIG-{MIG_GPU.removeprefix('GPU-')}-{profile}-{start}"


def _play_mig_node(kube: Kube, name: str, tmp_path: Path) -> str:
    """What a MIG node does for a MIG reservation pod: its MIG device plugin hands it the chosen
    instance (NVIDIA_VISIBLE_DEVICES names that MIG device), `phalanx node reserve --mig` reports it."""
    notes = kube.pods(NS)[name]["metadata"]["annotations"]
    assert notes[keys.GPU_DEVICES] == "0"
    uuid = _mig_uuid(notes[keys.MIG_SLICE])
    f = tmp_path / "mig-nvml.json"
    gpu = {"uuid": MIG_GPU, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "bus_id": "0000:05:00.0"}
    f.write_text(json.dumps({"gpus": [{**gpu, "mig": True, "mig_instances": [notes[keys.MIG_SLICE]]}]}))
    _play_node(kube, name, f, visible=uuid, mig=True)
    return uuid


def test_a_fraction_served_by_mig_gets_its_instance_reserved(
    kube: Kube, webhook: Webhook, tmp_path: Path
) -> None:
    """Two 0.1 fractions that ask MIG on a MIG node: one reservation pod each asks
    nvidia.com/mig-1g.10gb for its chosen instance, the shares' ConfigMaps name the MIG devices; a
    share whose reservation pod is killed is evicted, and a reservation no share uses is deleted."""
    kube.api.create(
        "nodes",
        node(
            "n0",
            gpus=0,
            labels={"nvidia.com/gpu.count": "1", "nvidia.com/mig.config": "all-1g.10gb"},
            extra={"nvidia.com/mig-1g.10gb": "7"},
        ),
    )
    with running(kube, gpu_shares="reservation"):
        for n in ("f1", "f2"):
            made = kube.create(pod(n, annotations={"gpu-fraction": "0.1", keys.GPU_BACKEND: "mig"}))
            assert keys.GPU_CONFIGMAP in made["metadata"]["annotations"]  # admitted by the webhook
        wait_for("two reservation pods", lambda: len(_reservations(kube)) == 2, timeout=30)
        held = _reservations(kube)
        slices = set()
        for name, p in held.items():
            notes = p["metadata"]["annotations"]
            slices.add(notes[keys.MIG_SLICE])
            assert name == f"phalanx-gpu-n0-0-{notes[keys.MIG_SLICE].replace('@', '-')}"
            box = p["spec"]["containers"][0]
            assert box["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"
            assert "nvidia.com/gpu" not in box["resources"]["limits"] and "--mig" in box["args"]
        assert len(slices) == 2 and all(s.startswith("1g.10gb@") for s in slices)
        time.sleep(1.0)  # nothing is bound while the MIG devices are not reported
        assert kube.node_of("f1") == "" and kube.node_of("f2") == ""
        uuids = {_play_mig_node(kube, name, tmp_path) for name in held}
        wait_for("both bound", lambda: kube.node_of("f1") == "n0" and kube.node_of("f2") == "n0", timeout=40)
        pods = kube.pods()
        for n in ("f1", "f2"):
            notes = pods[n]["metadata"]["annotations"]
            assert notes[keys.GPU_BACKEND_CHOSEN] == "mig" and notes[keys.MIG_SLICE] in slices
            cm = kube.get(CONFIG_MAPS, notes[keys.GPU_CONFIGMAP], "default")
            assert cm is not None
            assert cm["data"] == {
                "NVIDIA_VISIBLE_DEVICES": _mig_uuid(notes[keys.MIG_SLICE]),
                "PHALANX_GPU_BACKEND": "mig",
                "PHALANX_MIG_SLICE": notes[keys.MIG_SLICE],
            }
        assert {_mig_uuid(pods[n]["metadata"]["annotations"][keys.MIG_SLICE]) for n in ("f1", "f2")} == uuids
        wait_for(
            "the Event that says the instance",
            lambda: any(
                r == "GPUBackendChosen" and "GPU share served by MIG instance 1g.10gb@" in msg
                for r, msg in kube.events("f1")
            ),
            timeout=20,
        )
        # f1's reservation pod is killed: f1 is evicted (it holds no MIG device any more)
        f1_slice = pods["f1"]["metadata"]["annotations"][keys.MIG_SLICE]
        kube.force_delete_pod(f"phalanx-gpu-n0-0-{f1_slice.replace('@', '-')}", NS)

        def evicted() -> bool:
            p = kube.api.get_pod("default", "f1")
            return p is None or bool(p["metadata"].get("deletionTimestamp"))

        wait_for("f1 evicted", evicted, timeout=30)
        assert kube.node_of("f2") == "n0" and len(_reservations(kube)) == 1
        kube.force_delete_pod("f1")
        kube.force_delete_pod("f2")
        wait_for("the reservation pod removed", lambda: not _reservations(kube), timeout=30)
