"""Real nodes for tests: kubelets and containerd from `shared/k8s/node`, Phalanx's image, the chart.

A test on real nodes needs, beyond the control plane of `e2e_kube`: the node kit
(`PHALANX_NODEKIT`, its `node-up.sh`), root, runc and the CNI plugins (what the kit's README
lists), Phalanx's image (built once per session by `deploy/image/build.sh`, or the OCI archive
named by `PHALANX_IMAGE`) and Helm (`PHALANX_HELM` or `helm` on PATH). Without one of them the
tests skip and say which; with `PHALANX_REQUIRE_NODES=1` (set by `.ci/run` where everything is
there) a missing piece is a failure instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e_kube import Kube, wait_for
from phalanx.k8s.client.api import Api, Conflict
from phalanx.k8s.client.kinds import NODES
from phalanx.k8s.lab.localcluster import ControlPlane, Unavailable, find_assets

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "phalanx"
BUILD = ROOT / "deploy" / "image" / "build.sh"
NODEKIT = os.environ.get("PHALANX_NODEKIT", "")
CRDS_DIR = CHART / "crds"
IMAGE_NAME = "phalanx.local/phalanx"


def required() -> bool:
    return os.environ.get("PHALANX_REQUIRE_NODES") == "1"


def skip_or_fail(why: str) -> None:
    if required():
        pytest.fail(f"PHALANX_REQUIRE_NODES=1 but {why}")
    pytest.skip(why)


def nodekit_missing() -> str:
    """Why real nodes cannot run here, or '' when they can (the kit README's checklist)."""
    if not NODEKIT or not os.path.isfile(os.path.join(NODEKIT, "node-up.sh")):
        return "PHALANX_NODEKIT is not set or has no node-up.sh (see shared/k8s/node)"
    if os.geteuid() != 0:
        return "real nodes need root"
    if not shutil.which("runc"):
        return "runc is missing (apt-get install runc)"
    if not all(os.path.exists(f"/usr/lib/cni/{p}") for p in ("bridge", "host-local", "loopback")):
        return "/usr/lib/cni/bridge is missing (apt-get install containernetworking-plugins)"
    if not shutil.which("iptables"):
        return "iptables is missing (apt-get install iptables)"
    return ""


def helm_bin() -> str:
    return os.environ.get("PHALANX_HELM") or shutil.which("helm") or ""


# ---------------------------------------------------------------------------------------- image
def git_files(*args: str) -> list[str]:
    """`git ls-files ARGS` in the checkout: the files an image is built from."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", *args], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def image_inputs_digest() -> str:
    """What the image is built from: the tracked sources, the project file and the build script."""
    h = hashlib.sha256()
    for f in sorted(git_files("src", "pyproject.toml", "README.md", "deploy/image")):
        p = ROOT / f
        if p.is_file():
            h.update(f.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cached_build(kind: str, digest: str, *args: str) -> Path:
    """deploy/image/build.sh's output, kept under ~/.cache/phalanx-image by the digest of its inputs."""
    for tool in ("mmdebstrap", "buildah"):
        if not shutil.which(tool):
            skip_or_fail(f"{tool} is missing to build the image (apt-get install {tool})")
    if os.geteuid() != 0:
        skip_or_fail("building the image needs root (mmdebstrap's root mode, buildah)")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "phalanx-image"
    out = cache / f"{kind}-{digest}.tar"
    cache.mkdir(parents=True, exist_ok=True)
    with locked(cache / ".lock"):  # test runs of several checkouts build one at a time
        if not out.is_file():
            # what another checkout's run used in the last hours stays: it may still import it
            for old in cache.glob(f"{kind}-*.tar"):
                if time.time() - old.stat().st_mtime > 6 * 3600:
                    old.unlink()
            r = subprocess.run([str(BUILD), "--out", str(out), *args], capture_output=True, text=True)
            if r.returncode != 0:
                pytest.fail(f"deploy/image/build.sh {' '.join(args)} failed:\n{r.stderr[-4000:]}")
        out.touch()
    return out


@contextmanager
def locked(path: Path | str) -> Iterator[None]:
    """An exclusive flock(2) on `path` while the block runs (compatible with flock(1))."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def image_archive() -> Path:
    """Phalanx's image as an OCI archive: `PHALANX_IMAGE`, or built (and cached by its inputs)."""
    given = os.environ.get("PHALANX_IMAGE", "")
    if given:
        if not os.path.isfile(given):
            pytest.fail(f"PHALANX_IMAGE={given} is not a file")
        return Path(given)
    return cached_build("phalanx", image_inputs_digest())


def base_archive() -> Path:
    """The Debian base alone (build.sh --base-only), for building the Dockerfile without a registry."""
    digest = hashlib.sha256(BUILD.read_bytes()).hexdigest()[:16]
    return cached_build("debian-python", digest, "--base-only")


# ---------------------------------------------------------------------------------------- nodes
@dataclass
class RealNode:
    name: str
    env: dict[str, str]

    @property
    def ip(self) -> str:
        return self.env["NODEKIT_NODE_IP"]

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                f"{self.env['NODEKIT_BIN']}/ctr",
                "-a",
                self.env["NODEKIT_CONTAINERD_SOCK"],
                "-n",
                "k8s.io",
                *args,
            ],
            capture_output=True,
            text=True,
        )


def node_env(name: str) -> dict[str, str]:
    d = Path(f"/run/nodekit/nodes/{name}").read_text().strip()
    out: dict[str, str] = {}
    for line in (Path(d) / "env").read_text().splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip().strip("'\"")
    return out


def kubelet_api_refused(node: RealNode, wait_s: float = 15.0) -> str:
    """Why the kubelet's API port (what `kubectl logs` and `exec` reach) does not answer, with what
    the kubelet's log says of listening; "" when it answers."""
    ip, port = node.env.get("NODEKIT_NODE_IP", ""), node.env.get("NODEKIT_KUBELET_PORT", "")
    if not ip or not port:
        return ""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            socket.create_connection((ip, int(port)), timeout=2).close()
            return ""
        except OSError as e:
            if time.monotonic() > deadline:
                log = Path(node.env.get("NODEKIT_DIR", "/nonexistent")) / "logs" / "kubelet.log"
                said = [
                    ln
                    for ln in (log.read_text(errors="replace") if log.exists() else "").splitlines()
                    if "listen" in ln.lower() or "bind" in ln.lower()
                ]
                return (
                    f"kubelet API {ip}:{port} does not answer ({e}); the kubelet's log on listening:\n"
                    + "\n".join(said[-10:])
                )
            time.sleep(0.5)


def node_up(kubeconfig: Path, name: str, images: list[Path], extra_env: dict[str, str]) -> RealNode:
    env = dict(os.environ)
    env["NODEKIT_IMAGES"] = " ".join(str(i) for i in images)
    env.update(extra_env)
    for attempt in (1, 2):
        up = subprocess.run(
            [f"{NODEKIT}/node-up.sh", str(kubeconfig), name], capture_output=True, text=True, env=env
        )
        if up.returncode == 0:
            node = RealNode(name, node_env(name))
            why = kubelet_api_refused(node)
            if not why:
                return node
            # node-up checks the kubelet's healthz port only: its API port (logs, exec) can have
            # failed to bind (a CI-like run under load: every `kubectl logs` of a node refused)
            up = subprocess.CompletedProcess(up.args, 1, up.stdout, why)
        subprocess.run([f"{NODEKIT}/node-down.sh", name], capture_output=True)
        # the kit picks the kubelet's ports at random in 32100-40099, inside the kernel's ephemeral
        # range (32768-60999): a connection of another test (a watch lives for minutes) can hold the
        # port it picked by the time the kubelet binds it (seen once in CI). Another pick is the fix
        # for a port chosen before it is bound; any other failure is reported at once.
        refused = up.stderr.startswith("kubelet API")
        if attempt == 2 or ("bind: address already in use" not in up.stderr and not refused):
            break
    pytest.fail(f"node-up.sh {name} failed:\n{up.stderr[-4000:]}")


def node_down(name: str) -> None:
    subprocess.run([f"{NODEKIT}/node-down.sh", name], capture_output=True, timeout=120)


# ---------------------------------------------------------------------------------------- cluster
@dataclass
class KitCluster:
    """A control plane with real nodes, Phalanx's image on them and (once installed) its chart."""

    cp: ControlPlane
    kube: Kube
    nodes: list[RealNode]
    image: Path
    release: str = "phalanx"
    namespace: str = "phalanx-system"

    @property
    def api(self) -> Api:
        return self.kube.api

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        r = subprocess.run(
            [str(self.cp.bins / "kubectl"), f"--kubeconfig={self.cp.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def namespace_ready(self, ns: str) -> None:
        """A namespace whose pods can mount service-account tokens (the node kit's limitation 11)."""
        self.kube.ensure_namespace(ns)
        with suppress(Conflict):
            self.kube.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "openshift-service-ca.crt", "namespace": ns},
                    "data": {"service-ca.crt": self.cp.ca_crt.read_text()},
                }
            )

    def helm(self, *args: str, timeout: float = 300) -> str:
        r = subprocess.run(
            [helm_bin(), f"--kubeconfig={self.cp.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if r.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{r.stderr[-3000:]}")
        return r.stdout

    def install(self, values: dict[str, Any], wait: bool = True) -> float:
        """`helm install` the chart with the kit's image; seconds it took (with --wait: until Ready)."""
        self.namespace_ready(self.namespace)
        path = self.cp.dir / f"values-{self.release}.yaml"
        path.write_text(yaml.safe_dump(merge(kit_values(), values)))
        t0 = time.monotonic()
        args = ["install", self.release, str(CHART), "-n", self.namespace, "-f", str(path)]
        if wait:
            args += ["--wait", "--timeout", "180s"]
        try:
            self.helm(*args)
        except AssertionError as e:
            pods = self.kubectl("get", "pods", "-A", "-o", "wide", check=False)
            events = self.kubectl("get", "events", "-n", self.namespace, check=False)
            crashed = ""
            for line in pods.splitlines():
                f = line.split()
                if len(f) > 4 and f[0] == self.namespace and f[4] != "0":  # restarted: why
                    log = self.kubectl(
                        "logs", "-n", self.namespace, f[1], "--previous", "--tail=30", check=False
                    )
                    crashed += f"\n--- {f[1]} (previous run) ---\n{log}"
            raise AssertionError(f"{e}\n{pods}\n{events[-3000:]}{crashed}") from None
        return time.monotonic() - t0

    def pods(self, ns: str, selector: str = "") -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        return list(self.api.request("GET", f"/api/v1/namespaces/{ns}/pods", params=params)["items"])

    def report(self, ns: str) -> str:
        """What a person would look at when a wait on `ns` timed out: its pods (phase, node,
        containers' states), their logs' last lines, the namespace's Events, the leader's log."""
        out = [self.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)]
        for p in self.pods(ns):
            name = p["metadata"]["name"]
            states = [c.get("state") for c in (p.get("status") or {}).get("containerStatuses") or []]
            out.append(f"--- {name}: {phase(p)} on {p['spec'].get('nodeName') or '-'}: {states}")
            out.append(self.kubectl("logs", "-n", ns, name, "--tail=8", check=False).rstrip())
        events = self.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False)
        out.append("--- events:\n" + "\n".join(events.splitlines()[-25:]))
        leader = self.lease_holder()
        if leader:
            tail = self.kubectl("logs", "-n", self.namespace, leader, "--tail=40", check=False)
            out.append(f"--- scheduler {leader}:\n{tail.rstrip()}")
        return "\n".join(out)

    def wait(self, what: str, fn: Callable[[], Any], ns: str, timeout: float) -> Any:
        """`wait_for`, whose timeout says what the namespace looked like then."""
        try:
            return wait_for(what, fn, timeout=timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.report(ns)}") from None

    def lease_holder(self, name: str = "phalanx-scheduler") -> str:
        lease = self.api.get_lease(self.namespace, name) or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def gpus(self, count: int) -> None:
        """Advertise `count` nvidia.com/gpu on every node (no GPU here; the kubelet is real)."""
        for n in self.nodes:
            self.api.patch_status("nodes", n.name, None, {"capacity": {"nvidia.com/gpu": str(count)}})
        wait_for(
            "GPUs in the nodes' allocatable",
            lambda: all(
                ((self.kube.get(NODES, n.name) or {}).get("status") or {})
                .get("allocatable", {})
                .get("nvidia.com/gpu")
                == str(count)
                for n in self.nodes
            ),
            timeout=30,
        )


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def kit_values() -> dict[str, Any]:
    """Chart values every kit install needs: the imported image (there is no registry to pull from)."""
    return {"image": {"repository": IMAGE_NAME, "tag": "0.1.0", "pullPolicy": "Never"}}


def require_kit() -> None:
    """Skip (or fail, where the kit is required) unless real nodes can run: called before a module
    starts anything of its own, so that a machine without the kit starts nothing."""
    if why := nodekit_missing():
        skip_or_fail(why)
    if not helm_bin():
        skip_or_fail("helm is missing (PHALANX_HELM, or helm on PATH)")
    try:
        find_assets()
    except Unavailable as e:
        skip_or_fail(f"no Kubernetes control plane: {e}")


@contextmanager
def kit_cluster(nodes: int = 2, labels: dict[str, str] | None = None) -> Iterator[KitCluster]:
    """A control plane (service-account tokens on, webhooks reached at pod IPs) and `nodes` kit nodes."""
    require_kit()
    image = image_archive()
    # PHALANX_KIT_LOCK: where several test runs share one machine's kit, one cluster at a time
    lock = os.environ.get("PHALANX_KIT_LOCK")
    with locked(lock) if lock else nullcontext():
        yield from _kit_cluster(nodes, labels, image)


def _kit_cluster(nodes: int, labels: dict[str, str] | None, image: Path) -> Iterator[KitCluster]:
    cp = ControlPlane(service_accounts=True, apiserver_args=("--enable-aggregator-routing=true",)).start()
    cp.start_scheduler()  # kube-scheduler places Phalanx's own pods, as in any cluster
    names = [f"pn{os.getpid() % 10000}-{chr(ord('a') + i)}" for i in range(nodes)]
    extra = {"NODEKIT_NODE_LABELS": ",".join(f"{k}={v}" for k, v in (labels or {}).items())}
    kube = Kube(cp)
    try:
        kube.install_crds(sorted(CRDS_DIR.glob("*.yaml")))
        with ThreadPoolExecutor(nodes) as pool:
            up = list(pool.map(lambda n: node_up(cp.kubeconfig, n, [image], extra), names))
        yield KitCluster(cp, kube, up, image)
    finally:
        with ThreadPoolExecutor(max(1, nodes)) as pool:
            list(pool.map(node_down, names))
        kube.close()
        cp.stop()


# ---------------------------------------------------------------------------------------- watching
def phase(p: dict[str, Any]) -> str:
    return str((p.get("status") or {}).get("phase") or "")


class Watch:
    """Samples a namespace every 0.1 s: when each pod was first seen bound / Running / ended, and
    every moment at which a node held more GPUs in live pods than it has."""

    def __init__(self, k: KitCluster, ns: str, gpus_per_node: int) -> None:
        self.k = k
        self.ns = ns
        self.gpus_per_node = gpus_per_node
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.gone: dict[str, float] = {}
        self.deleting: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self.over: list[str] = []
        self.seen: set[str] = set()
        self._stop = False
        self._pool = ThreadPoolExecutor(1)
        self._fut = self._pool.submit(self._loop)

    def _loop(self) -> None:
        while not self._stop:
            now = time.monotonic()
            pods = {p["metadata"]["name"]: p for p in self.k.pods(self.ns)}
            held: dict[str, int] = {}
            for name, p in pods.items():
                self.seen.add(name)
                node = (p.get("spec") or {}).get("nodeName") or ""
                if node:
                    self.bound.setdefault(name, now)
                    self.nodes[name] = node
                ph = phase(p)
                if ph == "Running":
                    self.running.setdefault(name, now)
                if ph in ("Succeeded", "Failed"):
                    self.ended.setdefault(name, now)
                if p["metadata"].get("deletionTimestamp"):
                    self.deleting.setdefault(name, now)
                if node and ph not in ("Succeeded", "Failed"):
                    lim = p["spec"]["containers"][0].get("resources", {}).get("limits", {})
                    held[node] = held.get(node, 0) + int(lim.get("nvidia.com/gpu", 0))
            for name in self.seen - set(pods):
                self.gone.setdefault(name, now)
            self.over += [f"{n}: {g} GPUs at {now:.1f}" for n, g in held.items() if g > self.gpus_per_node]
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop = True
        self._fut.result(timeout=10)
        self._pool.shutdown()
