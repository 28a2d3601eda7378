"""A throw-away, real Kubernetes control plane on loopback, for e2e tests, benchmarks and the demo.

Like controller-runtime's envtest: the binaries come from a folder named by an environment
variable (`PHALANX_K8S_ASSETS`: kube-apiserver, kube-controller-manager, kube-scheduler;
etcd there or on PATH). It starts etcd and kube-apiserver, optionally
kube-controller-manager (Jobs, ResourceClaims from templates, garbage collection) and
kube-scheduler (the baseline), each on a free port, with fresh certificates and RBAC on.
There are no kubelets: tests create Node objects and play the node where they must.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import yaml

from phalanx.k8s import certs

ASSETS_ENV = "PHALANX_K8S_ASSETS"


class Unavailable(Exception):
    """The binaries are not there: say which and how to get them."""


def find_assets() -> tuple[Path, Path]:
    """(folder of the Kubernetes binaries, etcd binary), or Unavailable with the reason."""
    folder = os.environ.get(ASSETS_ENV, "")
    if not folder:
        raise Unavailable(
            f"{ASSETS_ENV} is not set: point it at a folder with kube-apiserver, kube-controller-manager "
            "and kube-scheduler (kubernetes/server/bin of a release's kubernetes-server-linux-amd64.tar.gz)"
        )
    p = Path(folder)
    for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        if not os.access(p / b, os.X_OK):
            raise Unavailable(f"{ASSETS_ENV}={folder}: no executable {b} there")
    etcd = p / "etcd" if os.access(p / "etcd", os.X_OK) else Path(shutil.which("etcd") or "")
    if not etcd.name:
        raise Unavailable(
            "etcd is not on PATH nor in the assets folder (Debian: apt-get install etcd-server)"
        )
    return p, etcd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ControlPlane:
    controller_manager: bool = True
    # Real kubelets (shared/k8s/node): pods get service-account tokens and reach the API server
    # through the `kubernetes` Service (10.0.0.1), so the serving certificate must name that IP.
    service_accounts: bool = False
    apiserver_args: tuple[str, ...] = ()
    kcm_args: tuple[str, ...] = ()
    # CRDs made before the server is waited on as ready: an API a newer Kubernetes serves, given
    # to this one as CRDs, that the server's own informers list (they keep /readyz failing until then)
    early_crds: tuple[dict[str, Any], ...] = ()
    timeout_s: float = 120.0
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="phalanx-k8s.")))
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    url: str = ""
    etcd_url: str = ""

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ControlPlane:
        bins, etcd = find_assets()
        self.bins = bins
        pki = self.dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        ca = certs.make_ca("phalanx-local-ca")
        self.ca_crt, self.ca_key = ca.write(pki, "ca")
        names = (
            "127.0.0.1",
            "10.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        )
        self.server_crt, self.server_key = certs.issue(ca, "kube-apiserver", server_names=names).write(
            pki, "apiserver"
        )
        self.admin_crt, self.admin_key = certs.issue(
            ca, "kubernetes-admin", org="system:masters", client=True
        ).write(pki, "admin")
        proxy_ca = certs.make_ca("phalanx-local-front-proxy-ca")
        self.proxy_ca_crt, _ = proxy_ca.write(pki, "front-proxy-ca")
        self.proxy_crt, self.proxy_key = certs.issue(proxy_ca, "front-proxy-client", client=True).write(
            pki, "front-proxy-client"
        )
        sa_priv, sa_pub = certs.signing_key()
        (pki / "sa.key").write_bytes(sa_priv)
        (pki / "sa.pub").write_bytes(sa_pub)
        try:
            self._etcd(etcd)
            self._apiserver()
            self._write_kubeconfig()
            if self.controller_manager:
                self._kcm()
            self._wait(self.url + "/api/v1/namespaces/default", "namespace default")
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self, keep: bool = False) -> None:
        for name in reversed(list(self.procs)):
            self._kill(name)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _kill(self, name: str) -> None:
        """SIGKILL: the state is thrown away, and a graceful kube-apiserver takes 15 s to go."""
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        p.kill()
        p.wait(timeout=10)

    def restart(self, name: str) -> None:
        """SIGKILL one component ("etcd", "kube-apiserver", ...) and start it again with the same
        arguments (same port, same data): what a crashed static pod does under kubelet."""
        p = self.procs[name]
        args = [str(a) for a in p.args]  # type: ignore[union-attr]
        self._kill(name)
        self._spawn(name, args)
        if name == "etcd":
            self._wait(self.etcd_url + "/health", "etcd", name="etcd", ours=False)
        elif name == "kube-apiserver":
            self._wait(self.url + "/readyz", "kube-apiserver /readyz")

    # ------------------------------------------------------------------ components
    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        self.procs[name] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def _client(self) -> httpx.Client:
        ctx = ssl.create_default_context(cafile=str(self.ca_crt))
        ctx.load_cert_chain(str(self.admin_crt), str(self.admin_key))
        return httpx.Client(verify=ctx, timeout=5.0)

    def _wait(self, url: str, what: str, name: str = "kube-apiserver", ours: bool = True) -> None:
        """Poll `url` until it answers 200; `ours`: served with our CA (else a self-signed component cert)."""
        deadline = time.monotonic() + self.timeout_s
        client = self._client() if ours else httpx.Client(timeout=5.0, verify=False)
        with client:
            while time.monotonic() < deadline:
                proc = self.procs.get(name)
                if proc is not None and proc.poll() is not None:
                    tail = (self.dir / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{name} exited while waiting for {what}:\n{tail}")
                try:
                    if client.get(url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(
            f"timed out after {self.timeout_s:g} s waiting for {what} (logs in {self.dir}/logs)"
        )

    def _etcd(self, etcd: Path) -> None:
        port, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{port}"
        self._spawn(
            "etcd",
            [
                str(etcd),
                "--name=phalanx-local",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=phalanx-local=http://127.0.0.1:{peer}",
                "--initial-cluster-state=new",
                "--quota-backend-bytes=8589934592",
            ],
        )
        self._wait(self.etcd_url + "/health", "etcd", name="etcd", ours=False)

    def _apiserver(self) -> None:
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        pki = self.dir / "pki"
        self._spawn(
            "kube-apiserver",
            [
                str(self.bins / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={self.server_crt}",
                f"--tls-private-key-file={self.server_key}",
                f"--client-ca-file={self.ca_crt}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=RBAC",
                f"--requestheader-client-ca-file={self.proxy_ca_crt}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={self.proxy_crt}",
                f"--proxy-client-key-file={self.proxy_key}",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                # no kubelets: nodes would stay tainted not-ready; pods need no service account
                # (unless real kubelets run them)
                "--disable-admission-plugins=TaintNodesByCondition"
                + ("" if self.service_accounts else ",ServiceAccount"),
                *self.apiserver_args,
            ],
        )
        if self.early_crds:
            self._wait(self.url + "/livez", "kube-apiserver /livez")
            self._make_early_crds()
        self._wait(self.url + "/readyz", "kube-apiserver /readyz")

    def _make_early_crds(self) -> None:
        """Create `early_crds`, retrying while the server is still starting (it answers 5xx then)."""
        url = self.url + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        deadline = time.monotonic() + self.timeout_s
        with self._client() as client:
            for crd in self.early_crds:
                while True:
                    try:
                        r = client.post(url, json=crd)
                        if r.status_code in (201, 409):
                            break
                        last = f"{r.status_code} {r.text[:200]}"
                    except httpx.HTTPError as e:
                        last = repr(e)
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"CRD {crd['metadata']['name']} not made: {last}")
                    time.sleep(0.2)

    def _cluster(self) -> dict[str, str]:
        """The CA embedded, as kubeadm writes it (shared/k8s/node's node-up reads it from the data)."""
        ca = base64.b64encode(self.ca_crt.read_bytes()).decode()
        return {"server": self.url, "certificate-authority-data": ca}

    def _write_kubeconfig(self) -> None:
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": self._cluster()}],
            "users": [
                {
                    "name": "admin",
                    "user": {"client-certificate": str(self.admin_crt), "client-key": str(self.admin_key)},
                }
            ],
            "contexts": [
                {"name": "local", "context": {"cluster": "local", "user": "admin", "namespace": "default"}}
            ],
            "current-context": "local",
        }
        self.kubeconfig.write_text(yaml.safe_dump(cfg))
        self.kubeconfig.chmod(0o600)

    def kubeconfig_for_token(self, token: str, name: str) -> Path:
        """A kubeconfig that authenticates with a bearer token (a service account's, for RBAC tests)."""
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": self._cluster()}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": name}}],
            "current-context": "local",
        }
        path = self.dir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path

    def _kcm(self) -> None:
        port = free_port()
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bins / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                # nodes without a kubelet never report Ready: this controller would taint and evict
                "--controllers=*,-node-lifecycle-controller,-service-ca-certificate-publisher-controller",
                f"--service-account-private-key-file={self.dir / 'pki' / 'sa.key'}",
                f"--root-ca-file={self.ca_crt}",
                f"--cluster-signing-cert-file={self.ca_crt}",
                f"--cluster-signing-key-file={self.ca_key}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--profiling=false",
                *self.kcm_args,
            ],
        )
        self._wait(
            f"https://127.0.0.1:{port}/healthz",
            "kube-controller-manager",
            name="kube-controller-manager",
            ours=False,
        )

    def start_scheduler(self, qps: float | None = None, burst: int | None = None) -> None:
        """kube-scheduler (the baseline), with a raised client QPS if asked."""
        port = free_port()
        args = [
            str(self.bins / "kube-scheduler"),
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--profiling=false",
        ]
        cfg: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaderElect": False},
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
        }
        if qps is not None:
            cfg["clientConnection"] |= {"qps": qps, "burst": burst or int(qps * 2)}
        path = self.dir / "kube-scheduler.yaml"
        path.write_text(yaml.safe_dump(cfg))
        args.append(f"--config={path}")
        self._spawn("kube-scheduler", args)
        self._wait(f"https://127.0.0.1:{port}/readyz", "kube-scheduler", name="kube-scheduler", ours=False)

    def stop_scheduler(self) -> None:
        self._kill("kube-scheduler")

    def compact(self) -> int:
        """Compact etcd up to its current revision: watches from older resourceVersions get 410 Gone."""
        with httpx.Client(timeout=10.0) as c:
            rev = int(
                c.post(self.etcd_url + "/v3/kv/range", json={"key": "AA=="}).json()["header"]["revision"]
            )
            c.post(
                self.etcd_url + "/v3/kv/compaction", json={"revision": rev, "physical": True}
            ).raise_for_status()
        return rev
