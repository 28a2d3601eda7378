"""The node side under real kubelets, checked from inside the containers (issue 21).

One control plane and two real nodes (shared/k8s/node) for the module, Phalanx's image imported
into both. The kubelets, containerd, runc, the pod network, hostPath mounts, kubelet's device
manager (registration, GetPreferredAllocation, Allocate, its checkpoint) and the API server's
webhook calls are real. The GPUs are not: there is no GPU here, so every Phalanx process that
asks NVML gets the fake NVML of the unit tests (tests/fake_nvml.py; its GPUs from the JSON file
`$PHALANX_FAKE_NVML`, seen through `NVIDIA_VISIBLE_DEVICES` as the NVIDIA container runtime would
show them), and sysfs is the fake tree of tests/fake_sysfs.py (4 GPUs and 2 RDMA NICs behind 2
PCIe switches). Both are in one host folder, mounted into the pods by hostPath at its own path.

How the chart is deployed:
- `helm install` of the chart: the scheduler (`scheduler.gpuShares=reservation`), the webhook,
  and the cache agent on node a only (`cache.nodeSelector`; the kit's nodes share this machine's
  filesystem and the webhook mounts one `cache.root` on every node, so one node has the cache;
  `hostNetwork`, since the object store listens on this machine's loopback). The reservation pods
  get the fake NVML through the new `reservations.env`/`volumes`/`volumeMounts` values; their
  `phalanx node reserve` imports `pynvml`, which a shim on their PYTHONPATH points at the fake.
- `phalanx node discover` and `phalanx node device-plugin`: `helm template --show-only` of their
  templates, then applied. The only edits to what the chart renders: the `sys` hostPath names the
  fake tree instead of /sys, the fake folder is mounted, and `--nvml-module=fake_nvml` is added.
  The device plugin is rendered once per node (release `phalanx-<node>`, a per-node nodeSelector):
  the kit's kubelets keep their device-plugin folder in their own dir, `DIR/kubelet/device-plugins`
  (the kit's limitation 3), and a DaemonSet's hostPath is one path for every node; the chart's
  `devicePlugin.kubeletDir` (kubelet's root folder, as microk8s and k0s move it) is that dir.
- The kubelet restart replays node-up.sh's launch (its own mount namespace, from the old
  process's command line and environment) and records the new PID in `DIR/pids`, so node-down.sh
  stops it; the module checks at the end that it did.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

import fake_sysfs
from e2e_kube import wait_for
from kube_objects import s3_secret
from nodes_kube import CHART, KitCluster, RealNode, kit_cluster, kit_values, merge, require_kit, skip_or_fail
from phalanx.k8s import keys
from phalanx.k8s.client.kinds import NODES, Kind
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.nodes import parse_node
from phalanx.node.deviceplugin import GPU_ALLOCATED

pytestmark = [pytest.mark.e2e, pytest.mark.nodes]

TESTS = Path(__file__).resolve().parent
BUSYBOX = "phalanx.local/busybox:1"
NS = "work"
SYS = "phalanx-system"
DATASETS = Kind("scheduling.phalanx.io", "v1alpha1", "datasets", True, "Dataset")
SMALL = {"requests": {"cpu": "10m", "memory": "32Mi"}}
# the sysctls node-up.sh fakes in the kubelet's mount namespace (NODEKIT_SYSCTL=fake, its default)
KIT_SYSCTLS = (
    "vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 "
    "kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000"
)
# runs until told to stop; says first which GPUs the container got
HOLD = 'echo "devices=$NVIDIA_VISIBLE_DEVICES"; trap "exit 0" TERM; while true; do sleep 0.5; done'


# ---------------------------------------------------------------------------------------- the module
@dataclass
class Side:
    k: KitCluster
    fake: Path
    gpus: dict[str, list[dict[str, Any]]]  # node -> the fake NVML's GPUs there
    kubelets: list[subprocess.Popen[bytes]] = field(default_factory=list)
    s3: Any = None  # the object store (phalanx.node.objectstore.S3Server), None if it did not start
    s3_error: str = ""

    @property
    def a(self) -> RealNode:
        return self.k.nodes[0]

    @property
    def b(self) -> RealNode:
        return self.k.nodes[1]

    def uuids(self, node: str, indices: list[int]) -> list[str]:
        return [self.gpus[node][i]["uuid"] for i in indices]


def fake_folder() -> Path:
    """The fakes, readable by the pods' users: the NVML module (and a `pynvml` shim), sysfs."""
    fake = Path(tempfile.mkdtemp(prefix="phalanx-side-"))
    fake.chmod(0o755)
    (fake / "py").mkdir()
    shutil.copy(TESTS / "fake_nvml.py", fake / "py" / "fake_nvml.py")
    (fake / "shim").mkdir()
    (fake / "shim" / "pynvml.py").write_text("from fake_nvml import *  # noqa: F403\n")
    fake_sysfs.dgx(fake / "sys", switches=2)
    for p in fake.rglob("*"):
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
    return fake


def gpu_list(uuid_prefix: str) -> list[dict[str, Any]]:
    """The fake NVML's GPUs of a node of the fake tree, with UUIDs of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        return fake_sysfs.dgx(Path(tmp), switches=2, uuid_prefix=uuid_prefix)


def write_nvml(side: Side, node: str, gpus: list[dict[str, Any]] | None) -> None:
    """The node's fake NVML: these GPUs, or none at all (no driver)."""
    body = {"gpus": gpus} if gpus is not None else {"missing": True}
    path = side.fake / f"nvml-{node}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.chmod(0o644)
    tmp.rename(path)


def render(k: KitCluster, release: str, values: dict[str, Any], template: str) -> list[dict[str, Any]]:
    """`helm template --show-only` of one of the chart's templates, with the kit's image."""
    path = k.cp.dir / f"values-{release}.yaml"
    path.write_text(yaml.safe_dump(merge(kit_values(), values)))
    out = k.helm("template", release, str(CHART), "-n", SYS, "-f", str(path), "--show-only", template)
    return [d for d in yaml.safe_load_all(out) if d]


def with_fakes(docs: list[dict[str, Any]], fake: Path) -> list[dict[str, Any]]:
    """The chart's DaemonSet with the fakes: sysfs from the fake tree, the fake NVML module."""
    for d in docs:
        if d["kind"] != "DaemonSet":
            continue
        spec = d["spec"]["template"]["spec"]
        for v in spec["volumes"]:
            if v["name"] == "sys":
                v["hostPath"] = {"path": str(fake / "sys"), "type": "Directory"}
        spec["volumes"].append({"name": "fake", "hostPath": {"path": str(fake), "type": "Directory"}})
        c = spec["containers"][0]
        c["volumeMounts"].append({"name": "fake", "mountPath": str(fake), "readOnly": True})
        c["args"].append("--nvml-module=fake_nvml")
    return docs


def apply_all(k: KitCluster, docs: list[dict[str, Any]]) -> None:
    for d in docs:
        k.kube.apply(d)


@pytest.fixture(scope="module")
def side() -> Iterator[Side]:
    from phalanx.node.objectstore import S3Server
    from phalanx.node.objectstore import Unavailable as NoWeed

    require_kit()  # before SeaweedFS starts: without the kit, nothing is started
    fake = fake_folder()
    s3 = S3Server()
    s3_error: list[BaseException] = []

    def start_s3() -> None:
        try:
            s3.start()
        except (NoWeed, RuntimeError) as e:
            s3_error.append(e)

    s3_thread = threading.Thread(target=start_s3, daemon=True)
    s3_thread.start()  # SeaweedFS starts while the cluster does
    kubelets: list[subprocess.Popen[bytes]] = []
    try:
        with kit_cluster(nodes=2) as k:
            a, b = (n.name for n in k.nodes)
            gpus = {a: gpu_list("GPU-a"), b: gpu_list("GPU-b")}
            s = Side(k, fake, gpus, kubelets)
            write_nvml(s, a, gpus[a])
            write_nvml(s, b, None)  # node b has no driver, for now
            for n in k.nodes:  # 2 RDMA NICs each (no RDMA device plugin here; the kubelet admits by count)
                k.api.patch_status(
                    "nodes", n.name, None, {"capacity": {"rdma/hca": "2"}, "allocatable": {"rdma/hca": "2"}}
                )
            k.namespace_ready(NS)
            _install(s)
            s3_thread.join(90)
            s.s3 = None if s3_error or s3_thread.is_alive() else s3
            s.s3_error = str(s3_error[0]) if s3_error else "SeaweedFS did not start in 90 s"
            yield s
    finally:
        s3_thread.join(120)  # a start still under way would race the stop (and leave weed running)
        s3.stop()
        stopped = True
        for p in kubelets:  # node-down.sh stops a restarted kubelet too (its PID is in DIR/pids)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                stopped = False
        shutil.rmtree(fake, ignore_errors=True)
        assert stopped, "node-down.sh left a restarted kubelet running"


def _install(s: Side) -> None:
    k, fake = s.k, s.fake
    a = s.a.name
    api_port = k.cp.url.rsplit(":", 1)[1]
    reservation_env = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "PHALANX_FAKE_NVML", "value": f"{fake}/nvml-$(NODE_NAME).json"},
        {"name": "PYTHONPATH", "value": f"{fake}/shim:{fake}/py"},
    ]
    try:
        _helm_install(k, fake, a, api_port, reservation_env)
    except AssertionError as e:
        tails = [
            f"--- {p['metadata']['name']}:\n"
            + k.kubectl("logs", "-n", SYS, p["metadata"]["name"], "--previous", check=False)[-2000:]
            for p in k.pods(SYS)
            if restarts(p)
        ]
        raise AssertionError(f"{e}\n" + "\n".join(tails)) from None
    env = [
        {"name": "PHALANX_FAKE_NVML", "value": f"{fake}/nvml-$(NODE_NAME).json"},
        {"name": "PYTHONPATH", "value": f"{fake}/py"},
    ]
    docs = render(
        k,
        "phalanx",
        {"discover": {"enabled": True, "interval": 2, "env": env, "resources": SMALL}},
        "templates/discover.yaml",
    )
    apply_all(k, with_fakes(docs, fake))


def _helm_install(
    k: KitCluster, fake: Path, a: str, api_port: str, reservation_env: list[dict[str, Any]]
) -> None:
    k.install(
        {
            "scheduler": {
                "replicas": 1,
                "gpuShares": "reservation",
                "leaseDurationSeconds": 6,
                "resources": SMALL,
                "mps": {"pipeDirectory": str(fake / "mps")},  # made by the share's hostPath
            },
            "webhook": {"replicas": 1, "resources": SMALL},
            "discover": {"enabled": False},
            "reservations": {
                "env": reservation_env,
                "volumes": [{"name": "fake", "hostPath": {"path": str(fake), "type": "Directory"}}],
                "volumeMounts": [{"name": "fake", "mountPath": str(fake), "readOnly": True}],
            },
            "cache": {
                "enabled": True,
                "root": str(fake / "cache"),
                "capacity": "1Mi",  # room for one of the test's datasets (0.7 MiB each)
                "metricsPort": free_port(),
                "extraArgs": ["--interval=0.5"],
                "hostNetwork": True,
                "nodeSelector": {"nvidia.com/gpu.present": None, "kubernetes.io/hostname": a},
                "env": [
                    {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": api_port},
                ],
                "resources": SMALL,
            },
        }
    )


def free_port() -> int:
    from phalanx.node.objectstore import free_port as fp

    return fp()


# ---------------------------------------------------------------------------------------- helpers
def pod_of(k: KitCluster, name: str, ns: str = NS) -> dict[str, Any]:
    return k.api.get_pod(ns, name) or {}


def phase(p: dict[str, Any]) -> str:
    return str((p.get("status") or {}).get("phase") or "")


def restarts(p: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount", 0)) for c in (p.get("status") or {}).get("containerStatuses") or [])


def running(k: KitCluster, name: str, ns: str = NS, timeout: float = 60) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        p = pod_of(k, name, ns)
        return p if phase(p) == "Running" else None

    try:
        return wait_for(f"pod {ns}/{name} Running", ready, timeout=timeout)  # type: ignore[no-any-return]
    except AssertionError:
        print(k.kubectl("describe", "pod", "-n", ns, name, check=False)[-3000:])
        raise


def logs(k: KitCluster, name: str, ns: str = NS, container: str = "") -> str:
    args = ["logs", "-n", ns, name] + (["-c", container] if container else [])
    return k.kubectl(*args, check=False)


def exec_env(k: KitCluster, name: str, var: str, ns: str = NS) -> str:
    """A variable as the container's own process sees it (kubectl exec)."""
    return k.kubectl("exec", "-n", ns, name, "--", "sh", "-c", f'echo "${var}"').strip()


def visible(k: KitCluster, name: str, ns: str = NS) -> list[str]:
    """The GPUs the container got (NVIDIA_VISIBLE_DEVICES, in kubelet's order), sorted."""
    return sorted(x for x in exec_env(k, name, "NVIDIA_VISIBLE_DEVICES", ns).split(",") if x)


def annotations(p: dict[str, Any]) -> dict[str, str]:
    return dict((p.get("metadata") or {}).get("annotations") or {})


def topology(k: KitCluster, node: str) -> dict[str, Any]:
    n = k.kube.get(NODES, node) or {}
    return json.loads(annotations(n).get(keys.DEVICE_TOPOLOGY) or "{}")


def allocatable(k: KitCluster, node: str, resource: str = "nvidia.com/gpu") -> str:
    n = k.kube.get(NODES, node) or {}
    return str(((n.get("status") or {}).get("allocatable") or {}).get(resource, ""))


def checkpoint(node: RealNode) -> dict[str, list[str]]:
    """kubelet's device-manager checkpoint: pod uid -> the nvidia.com/gpu device IDs it holds."""
    path = Path(node.env["NODEKIT_KUBELET_ROOT"]) / "device-plugins" / "kubelet_internal_checkpoint"
    data = json.loads(path.read_text())["Data"]
    out: dict[str, list[str]] = {}
    for e in data.get("PodDeviceEntries") or []:
        if e["ResourceName"] != "nvidia.com/gpu":
            continue
        ids = e["DeviceIDs"]
        flat = [d for v in ids.values() for d in v] if isinstance(ids, dict) else list(ids)
        out.setdefault(e["PodUID"], []).extend(flat)
    return {uid: sorted(v) for uid, v in out.items()}


def workload(
    name: str,
    gpus: int = 0,
    nics: int = 0,
    node: str = "",
    notes: dict[str, str] | None = None,
    script: str = HOLD,
) -> dict[str, Any]:
    """A pod for Phalanx: busybox, `gpus` whole GPUs and `nics` RDMA NICs."""
    limits = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if nics:
        limits["rdma/hca"] = str(nics)
    spec: dict[str, Any] = {
        "schedulerName": "phalanx",
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 3,
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "worker",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "resources": {"limits": limits} if limits else {},
            }
        ],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": dict(notes or {})},
        "spec": spec,
    }


def clean(k: KitCluster) -> None:
    """No workload left in NS (and so, soon, no reservation pod)."""
    k.kubectl("delete", "deployments,pods,podgroups", "--all", "-n", NS, "--wait=false", check=False)
    wait_for("no workload pods left", lambda: not k.pods(NS), timeout=90)


def reservations(k: KitCluster) -> list[dict[str, Any]]:
    return [p for p in k.pods(SYS) if keys.GPU_RESERVATION in (p["metadata"].get("labels") or {})]


# ---------------------------------------------------------------------------------------- kubelet restart
def _starttime(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _gone(pid: int) -> bool:
    """The process is reaped, or a zombie whose every thread is gone. A killed process's leader
    shows Z while its other threads still exit holding its files (its listening sockets): a
    kubelet started then cannot bind its port and exits 1 (seen under load)."""
    try:
        zombie = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        return zombie and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except OSError:
        return True


def restart_kubelet(node: RealNode) -> subprocess.Popen[bytes]:
    """Kill the node's kubelet (SIGKILL) and start it again as node-up.sh did: the same command line
    and environment, in a mount namespace of its own where /var/lib/kubelet/device-plugins is the
    node's folder and the kit's sysctls are faked. The new PID goes into DIR/pids for node-down.sh."""
    d = Path(node.env["NODEKIT_DIR"])
    lines = (d / "pids").read_text().splitlines()
    old = [ln for ln in lines if ln.split()[0] == "kubelet"][-1]
    pid = int(old.split()[1])
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    env = dict(
        kv.decode().split("=", 1)
        for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if b"=" in kv
    )
    os.kill(pid, signal.SIGKILL)
    wait_for("the old kubelet gone", lambda: _gone(pid), timeout=15)
    sysctls = KIT_SYSCTLS if (d / "sysctl").is_dir() else ""
    script = (
        'set -e; d="$1"; shift; s="$1"; shift\n'
        'mount --bind "$d/kubelet/device-plugins" /var/lib/kubelet/device-plugins\n'
        'for kv in $s; do k=${kv%=*}; v=${kv#*=}; f="$d/sysctl/$(echo "$k" | tr / _)"\n'
        '  [ "$(cat "/proc/sys/$k")" = "$v" ] && continue\n'
        '  echo "$v" > "$f"; mount --bind "$f" "/proc/sys/$k"\n'
        "done\n"
        'exec "$@"'
    )
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    cmd = [unshare, "--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c", script]
    cmd += ["nodekit-kubelet", str(d), sysctls, *argv]
    with open(d / "logs" / "kubelet.log", "ab") as log:
        p = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    (d / "pids").write_text(
        "".join(f"{ln}\n" for ln in lines if ln != old) + f"kubelet {p.pid} {_starttime(p.pid)}\n"
    )

    def healthy() -> bool:
        if p.poll() is not None:  # the kit's folder goes at teardown: say the log's last lines here
            tail = (d / "logs" / "kubelet.log").read_text(errors="replace").splitlines()[-15:]
            raise AssertionError(
                f"the restarted kubelet exited {p.returncode}; the end of {d}/logs/kubelet.log:\n"
                + "\n".join(tail)
            )
        try:
            with urllib.request.urlopen(node.env["NODEKIT_KUBELET_HEALTHZ"], timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_for("the restarted kubelet healthy", healthy, timeout=60, every=0.3)
    return p


# ---------------------------------------------------------------------------------------- 4. discovery
def discover_pod(k: KitCluster, node: str) -> dict[str, Any]:
    found = [
        p
        for p in k.pods(SYS, "app.kubernetes.io/component=node-discover")
        if (p.get("spec") or {}).get("nodeName") == node
    ]
    assert len(found) == 1, [p["metadata"]["name"] for p in found]
    return found[0]


def test_discovery_daemonset_publishes_the_fake_tree_and_a_node_without_nvml_says_why(side: Side) -> None:
    k, a, b = side.k, side.a.name, side.b.name
    wait_for("node a's topology", lambda: len(topology(k, a).get("gpus") or []) == 4, timeout=60)
    wait_for("node b's note", lambda: "note" in topology(k, b), timeout=60)
    topo = topology(k, a)
    assert [(g["index"], g["pcieSwitch"], g["numa"]) for g in topo["gpus"]] == [
        (0, 0, 0),
        (1, 0, 0),
        (2, 1, 0),
        (3, 1, 0),
    ]
    assert [g["uuid"] for g in topo["gpus"]] == side.uuids(a, [0, 1, 2, 3])
    assert [(n["index"], n["pcieSwitch"], n["bandwidthGbps"]) for n in topo["nics"]] == [
        (0, 0, 400),
        (1, 1, 400),
    ]
    node_a = k.kube.get(NODES, a) or {}
    labels = node_a["metadata"]["labels"]
    assert labels[keys.GFD_PRODUCT] == "NVIDIA-H100-80GB-HBM3" and labels[keys.GFD_COUNT] == "4"
    seen = parse_node(node_a, AdapterConfig())  # what the scheduler makes of it
    assert [(g.model, g.pcie_switch) for g in seen.gpus] == [
        ("H100", 0),
        ("H100", 0),
        ("H100", 1),
        ("H100", 1),
    ]
    assert [n.pcie_switch for n in seen.nics] == [0, 1]
    # node b: no NVML; it says why, in the annotation and the log, and does not crash-loop
    note = topology(k, b)
    assert note["gpus"] == [] and "NVML could not start: NVML Shared Library Not Found" in note["note"]
    assert len(note["nics"]) == 2  # sysfs still shows its NICs
    pb = discover_pod(k, b)["metadata"]["name"]
    wait_for("node b looked twice", lambda: logs(k, pb, SYS).count("no GPUs published") >= 2, timeout=30)
    assert "no GPUs published: NVML could not start" in logs(k, pb, SYS)
    for node in (a, b):
        p = discover_pod(k, node)
        assert phase(p) == "Running" and restarts(p) == 0, (node, p["status"])
    # the driver arrives on node b: its next look publishes the GPUs
    write_nvml(side, b, side.gpus[b])
    wait_for("node b's GPUs", lambda: len(topology(k, b).get("gpus") or []) == 4, timeout=30)
    assert "note" not in topology(k, b)
    assert restarts(discover_pod(k, b)) == 0


# ---------------------------------------------------------------------------------------- 1. device plugin
@pytest.fixture(scope="module")
def plugins(side: Side) -> Side:
    """Phalanx's device plugin on each node (one render per node: see the module docstring)."""
    k = side.k
    for n in k.nodes:
        write_nvml(side, n.name, side.gpus[n.name])  # (the discovery test gave node b its driver)
        values = {
            "devicePlugin": {
                "enabled": True,
                "kubeletDir": n.env["NODEKIT_KUBELET_ROOT"],
                "nodeSelector": {"nvidia.com/gpu.present": None, "kubernetes.io/hostname": n.name},
                "env": [
                    {"name": "PHALANX_FAKE_NVML", "value": f"{side.fake}/nvml-{n.name}.json"},
                    {"name": "PYTHONPATH", "value": f"{side.fake}/py"},
                ],
                "resources": SMALL,
            }
        }
        apply_all(
            k, with_fakes(render(k, f"phalanx-{n.name}", values, "templates/device-plugin.yaml"), side.fake)
        )
    for n in k.nodes:
        wait_for(f"{n.name}: 4 GPUs from the plugin", lambda n=n: allocatable(k, n.name) == "4", timeout=90)
    return side


def plugin_pod(k: KitCluster, node: str) -> str:
    (p,) = k.pods(SYS, f"app.kubernetes.io/instance=phalanx-{node}")
    return str(p["metadata"]["name"])


def test_pod_gets_exactly_the_gpus_phalanx_chose_and_keeps_them_over_a_kubelet_restart(plugins: Side) -> None:
    s, k = plugins, plugins.k
    a = s.a.name
    clean(k)
    for n in k.nodes:
        out = logs(k, plugin_pod(k, n.name), SYS)
        assert "registered nvidia.com/gpu with kubelet: 4 device(s)" in out, out
    # one GPU taken on PCIe switch 0: a 2-GPU pod goes to switch 1, GPUs {2, 3}
    k.kube.create(workload("one", gpus=1, node=a))
    one = running(k, "one")
    first = [int(x) for x in annotations(one)[keys.GPU_DEVICES].split(",")]
    assert len(first) == 1 and first[0] in (0, 1), first
    k.kube.create(workload("pair", gpus=2, node=a))
    pair = running(k, "pair")
    assert annotations(pair)[keys.GPU_DEVICES] == "2,3"
    want = s.uuids(a, [2, 3])
    # what the container sees, what the plugin recorded, what kubelet checkpointed
    assert visible(k, "pair") == want
    assert sorted(logs(k, "pair").split("devices=", 1)[1].split()[0].split(",")) == want
    assert exec_env(k, "one", "NVIDIA_VISIBLE_DEVICES") == s.uuids(a, first)[0]
    assert annotations(pair)[GPU_ALLOCATED] == ",".join(want)
    assert checkpoint(s.a)[pair["metadata"]["uid"]] == sorted(want)
    container = pair["status"]["containerStatuses"][0]["containerID"]

    # kill the kubelet and start it again: the plugin registers again, the pods keep their GPUs
    p = restart_kubelet(s.a)
    s.kubelets.append(p)
    wait_for(
        "the plugin registered again",
        lambda: "kubelet restarted: registering again" in logs(k, plugin_pod(k, a), SYS),
        timeout=60,
    )
    wait_for(
        "the plugin's registration taken",
        lambda: logs(k, plugin_pod(k, a), SYS).count("registered nvidia.com/gpu with kubelet") >= 2,
        timeout=60,
    )
    # the restarted kubelet reports 0 until the plugin's devices are listed again
    wait_for("4 GPUs again", lambda: allocatable(k, a) == "4", timeout=60)
    after = pod_of(k, "pair")
    assert phase(after) == "Running" and restarts(after) == 0
    assert after["status"]["containerStatuses"][0]["containerID"] == container  # the same container
    assert visible(k, "pair") == want
    assert checkpoint(s.a)[pair["metadata"]["uid"]] == sorted(want)
    # and the restarted kubelet hands out the GPU that is left, through the plugin
    k.kube.create(workload("last", gpus=1, node=a))
    last = running(k, "last")
    rest = ({0, 1} - set(first)).pop()
    assert annotations(last)[keys.GPU_DEVICES] == str(rest)
    assert exec_env(k, "last", "NVIDIA_VISIBLE_DEVICES") == s.uuids(a, [rest])[0]
    line = [
        ln
        for ln in (Path(s.a.env["NODEKIT_DIR"]) / "pids").read_text().splitlines()
        if ln.startswith("kubelet ")
    ]
    assert line == [f"kubelet {p.pid} {_starttime(p.pid)}"]  # node-down.sh stops this one


def test_gang_gets_gpu_nic_pairs_on_one_pcie_switch_on_each_node(plugins: Side) -> None:
    s, k = plugins, plugins.k
    clean(k)
    k.kube.create(
        {
            "apiVersion": "scheduling.phalanx.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "ring", "namespace": NS},
            "spec": {"minMember": 4},
        }
    )
    for r in range(4):
        k.kube.create(workload(f"ring-{r}", gpus=2, nics=1, notes={keys.POD_GROUP: "ring"}))
    got = {f"ring-{r}": running(k, f"ring-{r}", timeout=90) for r in range(4)}
    per_node: dict[str, list[int]] = {}
    for name, p in got.items():
        node = p["spec"]["nodeName"]
        notes = annotations(p)
        idx = [int(x) for x in notes[keys.GPU_DEVICES].split(",")]
        (nic,) = (int(x) for x in notes[keys.RDMA_NICS].split(","))
        topo = topology(k, node)
        switches = {topo["gpus"][i]["pcieSwitch"] for i in idx} | {topo["nics"][nic]["pcieSwitch"]}
        assert len(switches) == 1, (name, node, idx, nic, switches)  # the GPUs beside their NIC
        assert visible(k, name) == sorted(s.uuids(node, idx)), name
        per_node.setdefault(node, []).extend(idx)
    assert sorted(per_node) == sorted(n.name for n in k.nodes)
    assert all(sorted(v) == [0, 1, 2, 3] for v in per_node.values()), per_node  # 2 pods per node, apart


# ---------------------------------------------------------------------------------------- 2. GPU shares
def share_story(k: KitCluster) -> str:
    """The shares as they stand (node, GPUs chosen, phase), then what `KitCluster.report` says."""
    rows = [
        f"{p['metadata']['name']}: {phase(p)}, node {(p.get('spec') or {}).get('nodeName') or '-'}, "
        f"devices {annotations(p).get(keys.GPU_DEVICES) or '-'}"
        f"{', deleting' if p['metadata'].get('deletionTimestamp') else ''}"
        for p in k.pods(NS, "app=shares")
    ]
    return "shares: " + ("; ".join(rows) or "none") + "\n" + k.report(NS)


def shares_deployment(node: str, replicas: int = 2) -> dict[str, Any]:
    pod = workload("share", node=node, notes={"gpu-fraction": "0.5"})
    pod["spec"]["restartPolicy"] = "Always"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "shares", "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "shares"}},
            "template": {
                "metadata": {"labels": {"app": "shares"}, "annotations": pod["metadata"]["annotations"]},
                "spec": pod["spec"],
            },
        },
    }


def test_gpu_shares_run_on_the_gpu_their_reservation_pod_holds(plugins: Side) -> None:
    s, k = plugins, plugins.k
    a = s.a.name
    clean(k)
    k.kube.create(shares_deployment(a))

    def two_shares() -> list[dict[str, Any]] | None:
        live = [
            p
            for p in k.pods(NS, "app=shares")
            if phase(p) == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        return live if len(live) == 2 else None

    seen: list[str] = []  # the reservation pods as last looked at: said if a wait times out

    def held() -> dict[str, Any] | None:
        every = reservations(k)
        seen[:] = [
            f"{p['metadata']['name']} ({phase(p)}, gpu {annotations(p).get(keys.RESERVED_GPU) or '-'}"
            f"{', deleting' if p['metadata'].get('deletionTimestamp') else ''})"
            for p in every
        ]
        rs = [p for p in every if not p["metadata"].get("deletionTimestamp")]
        return (
            rs[0]
            if len(rs) == 1 and annotations(rs[0]).get(keys.RESERVED_GPU) and phase(rs[0]) == "Running"
            else None
        )

    def wait_held(what: str) -> dict[str, Any]:
        try:
            return wait_for(what, held, timeout=30)  # type: ignore[no-any-return]
        except AssertionError as e:  # say what was there instead, and what the scheduler decided
            raise AssertionError(
                f"{e}; reservation pods seen last: {'; '.join(seen) or 'none'}\n{share_story(k)}"
            ) from None

    shares = wait_for("two shares running", two_shares, timeout=90)
    res = wait_held("the reservation pod holding a GPU")
    uuid = annotations(res)[keys.RESERVED_GPU]
    assert res["spec"]["nodeName"] == a and uuid in s.uuids(a, [0, 1, 2, 3])
    # `phalanx node reserve` really ran in it, and saw the one GPU kubelet gave it
    rname = res["metadata"]["name"]
    assert f"holds GPU {uuid}" in logs(k, rname, SYS)
    assert exec_env(k, rname, "NVIDIA_VISIBLE_DEVICES", SYS) == uuid
    for p in shares:
        name = p["metadata"]["name"]
        assert p["spec"]["nodeName"] == a
        assert annotations(p)[keys.GPU_DEVICES] == res["metadata"]["labels"][keys.GPU_RESERVATION]
        assert exec_env(k, name, "NVIDIA_VISIBLE_DEVICES") == uuid, name
        assert exec_env(k, name, "PHALANX_GPU_FRACTION") == "0.5"
    # a whole GPU on the same node: another one
    k.kube.create(workload("whole", gpus=1, node=a))
    running(k, "whole")
    other = exec_env(k, "whole", "NVIDIA_VISIBLE_DEVICES")
    assert other in s.uuids(a, [0, 1, 2, 3]) and other != uuid

    # the reservation pod is killed: its shares are evicted, and placed again on a new one
    old = {p["metadata"]["name"] for p in shares}
    k.kubectl("delete", "pod", "-n", SYS, rname, "--grace-period=0", "--force")

    def replaced() -> list[dict[str, Any]] | None:
        live = two_shares()
        return live if live and not old & {p["metadata"]["name"] for p in live} else None

    again = wait_for("two new shares running", replaced, timeout=120)
    res2 = wait_held("a new reservation pod")
    uuid2 = annotations(res2)[keys.RESERVED_GPU]
    assert res2["metadata"]["uid"] != res["metadata"]["uid"] and uuid2 != other
    for p in again:
        assert exec_env(k, p["metadata"]["name"], "NVIDIA_VISIBLE_DEVICES") == uuid2

    # a share MPS serves (the pod asks it): MPS's variables and the pipe directory in the container,
    # on a GPU of its own (an MPS server runs its GPU in exclusive-process mode: no time-slice there)
    k.kube.create(workload("mps", node=a, notes={"gpu-fraction": "0.25", keys.GPU_BACKEND: "mps"}))
    running(k, "mps")
    pipe = str(s.fake / "mps")
    got = {v: exec_env(k, "mps", v) for v in ("NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
    assert got["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert (
        got["NVIDIA_VISIBLE_DEVICES"] in s.uuids(a, [0, 1, 2, 3]) and got["NVIDIA_VISIBLE_DEVICES"] != uuid2
    )
    assert exec_env(k, "mps", "CUDA_MPS_PIPE_DIRECTORY") == pipe
    assert (
        k.kubectl("exec", "-n", NS, "mps", "--", "sh", "-c", f"test -d {pipe} && echo mounted").strip()
        == "mounted"
    )
    assert annotations(pod_of(k, "mps"))[keys.GPU_BACKEND_CHOSEN] == "mps"
    for p in again:  # the time-slice shares: no MPS variable
        assert exec_env(k, p["metadata"]["name"], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == ""
    k.kubectl("delete", "pod", "-n", NS, "mps", "--wait=false")

    # both end: the reservation pod goes
    k.kubectl("scale", "deployment", "-n", NS, "shares", "--replicas=0")
    wait_for("no share left", lambda: not k.pods(NS, "app=shares"), timeout=60)
    wait_for("the reservation pods gone", lambda: not reservations(k), timeout=60)
    assert phase(pod_of(k, "whole")) == "Running"


# ---------------------------------------------------------------------------------------- 3. datasets
def put_dataset(s: Side, name: str, files: int = 24) -> str:
    """`files` random files in S3 under <bucket>/<name>; the md5sum listing a reader must print."""
    fs = s.s3.filesystem()
    lines = []
    for i in range(files):
        data = os.urandom(20_000 + 1_000 * i)
        rel = f"train/{i:03d}.bin"
        fs.pipe_file(f"{s.s3.bucket}/{name}/{rel}", data)
        lines.append(f"{hashlib.md5(data, usedforsecurity=False).hexdigest()}  ./{rel}\n")
    return "".join(sorted(lines, key=lambda ln: ln.split("  ", 1)[1]))


def dataset(s: Side, name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.phalanx.io/v1alpha1",
        "kind": "Dataset",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "source": f"s3://{s.s3.bucket}/{name}",
            "endpoint": s.s3.endpoint,
            "secretRef": {"name": "s3-creds"},
            "nodes": [node],
        },
    }


# reads every file of its dataset, prints how many and the checksum of the md5sum listing
READ = (
    'cd "$PHALANX_DATASET_DIR" && find . -type f | sort | xargs md5sum > /tmp/sums && '
    'echo "files=$(wc -l < /tmp/sums) checksum=$(md5sum < /tmp/sums | cut -d" " -f1)"'
)


def ds_state(k: KitCluster, name: str, node: str) -> dict[str, Any]:
    st = (k.kube.get(DATASETS, name, NS) or {}).get("status") or {}
    return dict((st.get("nodes") or {}).get(node) or {})


def test_dataset_cache_daemonset_stages_a_copy_that_pods_wait_for_and_read(side: Side) -> None:
    s, k = side, side.k
    a = s.a.name
    if s.s3 is None:
        skip_or_fail(f"no object store for the dataset cache: {s.s3_error}")
    clean(k)
    agent = k.pods(SYS, "app.kubernetes.io/component=cache")
    assert [p["spec"]["nodeName"] for p in agent] == [a] and agent[0]["spec"].get("hostNetwork")
    k.kube.apply(s3_secret(NS, s.s3.key, s.s3.secret))
    listing = put_dataset(s, "imagenet")
    want = f"files=24 checksum={hashlib.md5(listing.encode(), usedforsecurity=False).hexdigest()}"
    # bound before the copy exists: kubelet refuses the mount and retries
    k.kube.create(workload("early", gpus=1, node=a, notes={keys.DATASET: "imagenet"}, script=READ))
    wait_for("early bound", lambda: pod_of(k, "early").get("spec", {}).get("nodeName") == a, timeout=30)

    def refused() -> str:
        return "\n".join(m for r, m in k.kube.events("early", NS) if r == "FailedMount")

    why = wait_for("a FailedMount event", refused, timeout=30)
    assert "phalanx-dataset" in why and "ready/work/imagenet" in why, why
    assert phase(pod_of(k, "early")) == "Pending"
    k.kube.create(dataset(s, "imagenet", a))
    try:
        wait_for("the copy ready", lambda: ds_state(k, "imagenet", a).get("state") == "ready", timeout=60)
    except AssertionError:
        print(logs(k, agent[0]["metadata"]["name"], SYS)[-3000:], ds_state(k, "imagenet", a))
        raise
    wait_for("early ran", lambda: phase(pod_of(k, "early")) == "Succeeded", timeout=60)
    assert want in logs(k, "early")
    notes = annotations(k.kube.get(NODES, a) or {})
    assert "work/imagenet" in json.loads(notes[keys.CACHED_DATASETS])

    # a copy in use is never evicted: a pod reads it while a second dataset wants the room
    k.kube.create(workload("user", node=a, notes={keys.DATASET: "imagenet"}, script=f"{READ}; {HOLD}"))
    running(k, "user")
    wait_for("user read it", lambda: want in logs(k, "user"), timeout=30)
    put_dataset(s, "openimages")
    k.kube.create(dataset(s, "openimages", a))
    wait_for(
        "the second dataset refused",
        lambda: ds_state(k, "openimages", a).get("state") == "failed",
        timeout=60,
    )
    reason = ds_state(k, "openimages", a)["reason"]
    assert reason.startswith("cache full:") and "in use" in reason, reason
    assert ds_state(k, "imagenet", a)["state"] == "ready"
    again = k.kubectl("exec", "-n", NS, "user", "--", "sh", "-c", READ)
    assert want in again, again  # the same files, still there
