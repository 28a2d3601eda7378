"""A fraction served by a MIG instance, on a real kubelet (issue 42): KAI-style reservation of the instance.

One control plane and one real node (shared/k8s/node), as in tests/test_e2e_mig_recut.py: kubelet,
containerd, runc and kubelet's device manager are real; the node's two H100s (each cut 7x1g.10gb)
are the fake NVML; `phalanx node discover` and `phalanx node device-plugin --mig-strategy mixed` run
as host processes. The scheduler runs in this process with `--gpu-shares reservation`. The chart's
reservation account and role are applied (`helm template --show-only templates/reservations.yaml`),
and the reservation pod runs Phalanx's image: its `phalanx node reserve --mig` reports what
kubelet's Allocate put in its NVIDIA_VISIBLE_DEVICES. The share pod is made as the webhook makes it
(its mutation, called here: the webhook server is not deployed).

What is checked: a `gpu-fraction: 0.1` pod asking `phalanx.io/gpu-backend: mig` gets a 1g instance;
its reservation pod asks `nvidia.com/mig-1g.10gb` and gets the device of the chosen slice, and the
share's container has that MIG device in NVIDIA_VISIBLE_DEVICES; when the share ends, the
reservation pod goes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e_kube import running, wait_for
from nodes_kube import CHART, IMAGE_NAME, KitCluster, kit_cluster, phase
from phalanx.k8s import keys
from phalanx.k8s.admission.mutation import mutate
from phalanx.k8s.client.kinds import NODES, PODS
from phalanx.k8s.config import AdapterConfig
from test_e2e_mig_recut import NodeSide, busybox_pod

pytestmark = [pytest.mark.e2e, pytest.mark.nodes]

NS = "migshare"
SYS = "phalanx-system"
SEVEN = [f"1g.10gb@{s}" for s in range(7)]


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KitCluster, NodeSide]]:
    with kit_cluster(nodes=1) as k:
        k.namespace_ready(NS)
        k.namespace_ready(SYS)
        tmp = tmp_path_factory.mktemp("migshare")
        chart = k.helm(
            "template", "phalanx", str(CHART), "-n", SYS, "--set", "scheduler.gpuShares=reservation",
            "--show-only", "templates/reservations.yaml",
        )  # fmt: skip
        docs = tmp / "reservations.yaml"
        docs.write_text(yaml.safe_dump_all([d for d in yaml.safe_load_all(chart) if d]))
        k.kubectl("apply", "-f", str(docs))
        ns = NodeSide(k, tmp)
        state = json.loads(ns.nvml.read_text())  # both GPUs cut 7x1g before anything is offered
        for g in state["gpus"]:
            g["mig_instances"] = list(SEVEN)
        ns.nvml.write_text(json.dumps(state))
        try:
            yield k, ns
        finally:
            ns.stop()


def _share(name: str) -> dict[str, Any]:
    body = busybox_pod(name, NS, {}, {"gpu-fraction": "0.1", keys.GPU_BACKEND: "mig"})
    made = mutate(body, NS, AdapterConfig())  # what the webhook does at admission
    assert made is not None
    return made


def _reservations(k: KitCluster) -> list[dict[str, Any]]:
    return [p for p in k.pods(SYS) if keys.GPU_RESERVATION in (p["metadata"].get("labels") or {})]


def _running(k: KitCluster, name: str, ns: str = NS) -> dict[str, Any] | None:
    p = k.kube.get(PODS, name, ns)
    return p if p is not None and phase(p) == "Running" else None


def _env(k: KitCluster, pod: str, ns: str = NS) -> str:
    return k.kubectl("exec", "-n", ns, pod, "--", "sh", "-c", 'echo "$NVIDIA_VISIBLE_DEVICES"').strip()


def _offered(k: KitCluster, name: str) -> str:
    alloc = ((k.kube.get(NODES, name) or {}).get("status") or {}).get("allocatable") or {}
    return str(alloc.get("nvidia.com/mig-1g.10gb", "0"))


def test_a_tenth_of_a_gpu_asking_mig_runs_on_the_1g_instance_its_reservation_pod_holds(
    side: tuple[KitCluster, NodeSide],
) -> None:
    k, ns = side
    node = ns.node.name
    wait_for("the node's MIG layout published", lambda: keys.DEVICE_TOPOLOGY in _notes(k, node), timeout=60)
    wait_for("kubelet offering fourteen 1g devices", lambda: _offered(k, node) == "14", timeout=60)
    image = f"{IMAGE_NAME}:0.1.0"
    with running(k.kube, gpu_shares="reservation", reservation_image=image, reservation_namespace=SYS):
        k.kube.create(_share("tenth"))
        try:
            share = wait_for("the share Running", lambda: _running(k, "tenth"), timeout=120)
        except AssertionError:
            print(k.kubectl("get", "pods", "-A", "-o", "wide", check=False), ns.report())
            for p in _reservations(k):
                name = p["metadata"]["name"]
                print(k.kubectl("describe", "pod", "-n", SYS, name, check=False)[-3000:])
                print(k.kubectl("logs", "-n", SYS, name, check=False)[-2000:])
            raise
        notes = share["metadata"]["annotations"]
        assert notes[keys.GPU_BACKEND_CHOSEN] == "mig" and notes[keys.MIG_SLICE].startswith("1g.10gb@")
        gpu, chosen = int(notes[keys.GPU_DEVICES]), notes[keys.MIG_SLICE]
        device = ns.device(gpu, chosen)
        (res,) = _reservations(k)
        rnotes = res["metadata"]["annotations"]
        assert (rnotes[keys.MIG_SLICE], rnotes[keys.GPU_DEVICES]) == (chosen, str(gpu))
        assert res["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"
        assert rnotes[keys.RESERVED_GPU] == device  # what `phalanx node reserve --mig` saw
        assert _env(k, res["metadata"]["name"], SYS) == device  # what kubelet's Allocate gave it
        assert _env(k, "tenth") == device  # the share's container: that MIG device, from its ConfigMap
        print(f"share on {chosen} of GPU {gpu}: {device}")
        k.kube.api.delete("pods", "tenth", NS, grace=0)
        wait_for("the reservation pod gone", lambda: not _reservations(k), timeout=60)


def _notes(k: KitCluster, name: str) -> dict[str, str]:
    return dict(((k.kube.get(NODES, name) or {}).get("metadata") or {}).get("annotations") or {})
