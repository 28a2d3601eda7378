"""Dynamic MIG on a real kubelet (issue 42): the scheduler decides a recut, the agent cuts, kubelet offers.

One control plane and one real node (shared/k8s/node); kubelet, containerd, runc and kubelet's
device manager are real. The GPUs are not: the node's two H100s (MIG mode, each cut 1x7g) are the
fake NVML of tests/fake_nvml.py, whose state is a JSON file every process reads and the agent's
NVML calls rewrite. The node side runs as host processes, as the chart's DaemonSets would on the
node: `phalanx node discover --mig-recut` and `phalanx node device-plugin --mig-strategy mixed`
(its sockets in the kit node's own device-plugin folder). The scheduler runs in this process with a
profile that has the `repartition` action.

What is checked:
- a pod asking the 7g slice runs on one GPU; eight pods asking 1g slices wait, the scheduler asks
  for the other (idle) GPU to be cut 7x1g, the agent cuts it, kubelet offers seven 1g devices, and
  seven of the pods run, each with the MIG device of the slice the scheduler chose in its
  NVIDIA_VISIBLE_DEVICES; the eighth waits: the GPU in use is never cut;
- a recut asked by hand of the GPU in use is refused by the agent (the pod holding it is named in
  the status annotation and a Warning Event) and the GPU keeps its layout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fake_sysfs
from e2e_kube import running, wait_for
from nodes_kube import KitCluster, kit_cluster, phase
from phalanx.k8s import keys
from phalanx.k8s.client.kinds import NODES, PODS
from phalanx.spec import mig_layout
from phalanx.spec.mig_layout import Want

pytestmark = [pytest.mark.e2e, pytest.mark.nodes]

TESTS = Path(__file__).resolve().parent
NS = "mig"
BUSYBOX = "phalanx.local/busybox:1"
HOLD = 'echo "devices=$NVIDIA_VISIBLE_DEVICES"; trap "exit 0" TERM; while true; do sleep 0.5; done'
PROFILE = """
name: mig-dynamic
tie_break: name
actions:
  - name: allocate
  - name: repartition
    args: {recut_s: 5, min_interval_s: 600}
order:
  - name: priority
"""


def busybox_pod(
    name: str, ns: str, limits: dict[str, str], notes: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod for Phalanx that says which devices it got, then holds them until deleted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": dict(notes or {})},
        "spec": {
            "schedulerName": "phalanx",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "worker",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", HOLD],
                    "resources": {"limits": {**limits, "cpu": "10m", "memory": "32Mi"}},
                }
            ],
        },
    }


def _pod(name: str, profile: str) -> dict[str, Any]:
    return busybox_pod(name, NS, {f"nvidia.com/mig-{profile}": "1"})


class NodeSide:
    """The discover agent and the device plugin of the node, as host processes on the fake NVML."""

    def __init__(self, k: KitCluster, tmp: Path) -> None:
        self.node = k.nodes[0]
        self.sys = tmp / "sys"
        self.sys.mkdir()
        gpus = fake_sysfs.dgx(self.sys, switches=1)
        for g in gpus:
            g.update(mig=True, mig_instances=["7g.80gb@0"])
        self.nvml = tmp / "nvml.json"
        self.nvml.write_text(json.dumps({"gpus": gpus}))
        env = {
            **os.environ,
            "PHALANX_FAKE_NVML": str(self.nvml),
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        }
        common = ["--kubeconfig", str(k.cp.kubeconfig), "--node-name", self.node.name]
        common += ["--sys-root", str(self.sys), "--nvml-module", "fake_nvml"]
        root = self.node.env["NODEKIT_KUBELET_ROOT"]
        plugins = f"{root}/device-plugins"
        self.logs = {name: tmp / f"{name}.log" for name in ("discover", "plugin")}
        common += ["--pod-resources-socket", f"{root}/pod-resources/kubelet.sock"]
        recut = ["discover", *common, "--mig-recut", "--mig-interval", "0.5"]
        serve = ["device-plugin", *common, "--socket-dir", plugins, "--mig-strategy", "mixed"]
        self.procs = [self._start(env, "discover", recut), self._start(env, "plugin", serve)]

    def _start(self, env: dict[str, str], name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with open(self.logs[name], "wb") as out:
            cmd = [sys.executable, "-m", "phalanx.cli.main", "node", *args]
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    def layout(self, gpu: int) -> list[str]:
        return list(json.loads(self.nvml.read_text())["gpus"][gpu]["mig_instances"])

    def device(self, gpu: int, chosen: str) -> str:
        """The fake NVML's UUID of the MIG device at `chosen` (profile@start) on `gpu`."""
        prof, _, at = chosen.partition("@")
        parent = json.loads(self.nvml.read_text())["gpus"][gpu]["uuid"]
        return f"MIG-{parent.removeprefix('GPU-')}-{prof}-{at}"

    def report(self) -> str:
        return "\n".join(f"--- {n}\n{p.read_text()[-3000:]}" for n, p in self.logs.items())

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KitCluster, NodeSide]]:
    with kit_cluster(nodes=1) as k:
        k.namespace_ready(NS)
        ns = NodeSide(k, tmp_path_factory.mktemp("mig"))
        try:
            yield k, ns
        finally:
            ns.stop()


def _node(k: KitCluster, name: str) -> dict[str, Any]:
    return k.kube.get(NODES, name) or {}


def _notes(k: KitCluster, name: str) -> dict[str, str]:
    return dict((_node(k, name).get("metadata") or {}).get("annotations") or {})


def _offered(k: KitCluster, name: str, profile: str) -> str:
    alloc = (_node(k, name).get("status") or {}).get("allocatable") or {}
    return str(alloc.get(f"nvidia.com/mig-{profile}", "0"))


def _running(k: KitCluster, name: str) -> dict[str, Any] | None:
    p = k.kube.get(PODS, name, NS)
    return p if p is not None and phase(p) == "Running" else None


def _small(k: KitCluster, bound: bool | None = None, running: bool = False) -> list[dict[str, Any]]:
    """The 1g pods: all, bound or not bound, or Running."""
    out = [p for p in k.pods(NS) if p["metadata"]["name"].startswith("small")]
    if bound is not None:
        out = [p for p in out if bool(p["spec"].get("nodeName")) == bound]
    return [p for p in out if phase(p) == "Running"] if running else out


def _env(k: KitCluster, pod: str) -> str:
    return k.kubectl("exec", "-n", NS, pod, "--", "sh", "-c", 'echo "$NVIDIA_VISIBLE_DEVICES"').strip()


def _node_events(k: KitCluster, node: str) -> list[str]:
    out = k.kubectl("get", "events", "-A", "--field-selector", f"involvedObject.name={node}", "-o", "json")
    return [e["reason"] for e in json.loads(out)["items"]]


def _answer(k: KitCluster, node: str, gpu: int) -> mig_layout.Answer | None:
    return mig_layout.answers(_notes(k, node).get(keys.MIG_LAYOUT_STATUS), "status").get(gpu)


def test_waiting_slices_get_an_idle_gpu_recut_and_the_gpu_in_use_is_never_cut(
    side: tuple[KitCluster, NodeSide], tmp_path: Path
) -> None:
    k, ns = side
    node = ns.node.name
    seven = [f"1g.10gb@{s}" for s in range(7)]
    wait_for("the node's topology published", lambda: keys.DEVICE_TOPOLOGY in _notes(k, node), timeout=60)
    wait_for("kubelet offering two 7g devices", lambda: _offered(k, node, "7g.80gb") == "2", timeout=60)
    profile = tmp_path / "mig.yaml"
    profile.write_text(PROFILE)
    with running(k.kube, profile=str(profile)):
        k.kube.create(_pod("holder", "7g.80gb"))
        try:
            holder = wait_for("the 7g pod Running", lambda: _running(k, "holder"), timeout=90)
        except AssertionError:
            print(k.kubectl("describe", "pod", "-n", NS, "holder", check=False)[-3000:], ns.report())
            raise
        busy = int(holder["metadata"]["annotations"][keys.GPU_DEVICES])
        idle = 1 - busy
        assert _env(k, "holder") == ns.device(busy, "7g.80gb@0")
        for j in range(8):
            k.kube.create(_pod(f"small-{j}", "1g.10gb"))
        start = time.monotonic()
        try:
            wait_for("seven 1g pods Running", lambda: len(_small(k, running=True)) >= 7, timeout=120)
        except AssertionError:
            print(json.dumps(_notes(k, node), indent=1), ns.report())
            raise
        took = time.monotonic() - start
        runs = _small(k, running=True)
        assert len(runs) == 7, [p["metadata"]["name"] for p in runs]
        assert ns.layout(idle) == seven
        assert ns.layout(busy) == ["7g.80gb@0"]  # in use: never cut
        wants = mig_layout.wants(_notes(k, node).get(keys.MIG_LAYOUT), "layout")
        assert list(wants) == [idle] and wants[idle].same(seven)
        answer = _answer(k, node, idle)
        assert answer is not None and answer.state == "applied" and answer.answers(wants[idle])
        envs = {p["metadata"]["name"]: _env(k, p["metadata"]["name"]) for p in runs}
        assert len(set(envs.values())) == 7  # seven distinct MIG devices of the cut GPU

        def agree() -> bool:
            """Each pod's slice annotation names the device it has (the scheduler chose it, or the
            device plugin put it right from kubelet's PodResources record)."""
            for p in _small(k, running=True):
                a = p["metadata"]["annotations"]
                if a.get(keys.GPU_DEVICES) != str(idle) or envs[p["metadata"]["name"]] != ns.device(
                    idle, a.get(keys.MIG_SLICE, "")
                ):
                    return False
            return True

        wait_for("the pods' slices as kubelet allocated them", agree, timeout=20)
        corrected = ns.logs["plugin"].read_text().count("its annotations follow")
        time.sleep(3)  # the eighth waits: nothing else may be cut while the 7g pod runs
        assert len(_small(k, bound=False)) == 1 and ns.layout(busy) == ["7g.80gb@0"]
        assert "MigRepartitioned" in _node_events(k, node)
        print(f"seven 1g pods Running {took:.1f} s after they were made; {corrected} slice(s) corrected")

        # a recut of the GPU in use, asked by hand: refused, the holder named, the layout kept
        asked = {**wants, busy: Want(layout=seven, at=time.time())}
        body = {"metadata": {"annotations": {keys.MIG_LAYOUT: mig_layout.dump(asked)}}}
        k.api.patch(NODES, node, None, body)
        refusal = wait_for("the agent's answer", lambda: _answer(k, node, busy), timeout=30)
        assert refusal.state == "refused" and f"{NS}/holder" in refusal.reason
        assert ns.layout(busy) == ["7g.80gb@0"]
        time.sleep(2)
        assert _running(k, "holder") is not None  # still served by its slice
        assert "MigRepartitionRefused" in _node_events(k, node)
