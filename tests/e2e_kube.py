"""End-to-end helpers: a real control plane (`phalanx.k8s.lab.localcluster`), objects, waits, clean-up.

The control plane is started once per test session from `PHALANX_K8S_ASSETS` (skipped with
the reason where the binaries are absent); each test gets a clean cluster (no nodes, no
pods, no queues) and, when it asks, a Phalanx scheduler running in this process.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

from phalanx.k8s.client.api import Api, ApiError, Conflict, NotFound
from phalanx.k8s.client.kinds import CONFIG_MAPS, Kind
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.lab.localcluster import ControlPlane
from phalanx.k8s.loop.scheduler import Scheduler
from phalanx.k8s.loop.service import CONFIGMAP as SERVICE_CONFIGMAP
from phalanx.profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent
CRDS = Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", False, "CustomResourceDefinition")
PDBS = Kind("policy", "v1", "poddisruptionbudgets", True, "PodDisruptionBudget")
PRIORITY_CLASSES = Kind("scheduling.k8s.io", "v1", "priorityclasses", False, "PriorityClass")
JOBS = Kind("batch", "v1", "jobs", True, "Job")
SERVICE_ACCOUNTS = Kind("", "v1", "serviceaccounts", True, "ServiceAccount")
DIALECT_CRDS = {
    "kai": ("kai-queues", "kai-podgroups"),
    "volcano": ("volcano-queues", "volcano-podgroups"),
    "scheduler-plugins": ("scheduler-plugins-podgroups",),
    "kueue": (
        "kueue-clusterqueues",
        "kueue-localqueues",
        "kueue-resourceflavors",
        "kueue-cohorts",
        "kueue-workloads",
    ),
}


CLUSTER_SCOPED = (
    "Node",
    "Namespace",
    "PriorityClass",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "ResourceSlice",
    "Queue",
    "MutatingWebhookConfiguration",
    "ClusterQueue",
    "ResourceFlavor",
    "Cohort",
)


def kind_of(obj: dict[str, Any]) -> Kind:
    api = str(obj["apiVersion"])
    group, _, version = api.rpartition("/")
    plural = {
        "Pod": "pods",
        "Node": "nodes",
        "Namespace": "namespaces",
        "Queue": "queues",
        "PodGroup": "podgroups",
        "PriorityClass": "priorityclasses",
        "PodDisruptionBudget": "poddisruptionbudgets",
        "Job": "jobs",
        "CustomResourceDefinition": "customresourcedefinitions",
        "ServiceAccount": "serviceaccounts",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "Role": "roles",
        "RoleBinding": "rolebindings",
        "Deployment": "deployments",
        "Service": "services",
        "ConfigMap": "configmaps",
        "DeviceClass": "deviceclasses",
        "ResourceSlice": "resourceslices",
        "ResourceClaim": "resourceclaims",
        "ResourceClaimTemplate": "resourceclaimtemplates",
        "DaemonSet": "daemonsets",
        "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
        "ClusterQueue": "clusterqueues",
        "LocalQueue": "localqueues",
        "ResourceFlavor": "resourceflavors",
        "Cohort": "cohorts",
        "Workload": "workloads",
        "Secret": "secrets",
        "Dataset": "datasets",
    }[obj["kind"]]
    namespaced = obj["kind"] not in CLUSTER_SCOPED
    return Kind(group, version, plural, namespaced, obj["kind"])


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 20.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


class Kube:
    """An admin connection to the test control plane, with the few verbs the tests need."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.api = Api.connect(kubeconfig=str(cp.kubeconfig))

    # ------------------------------------------------------------------ objects
    def create(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        k = kind_of(obj)
        ns = (obj.get("metadata") or {}).get("namespace") or ("default" if k.namespaced else None)
        params = {"dryRun": "All"} if dry_run else None
        return self.api.request("POST", k.path(ns), obj, params=params)  # type: ignore[no-any-return]

    def apply(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply: validated by the real server whether the object exists or not."""
        k = kind_of(obj)
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or ("default" if k.namespaced else None)
        params = {"fieldManager": "phalanx-e2e", "force": "true"} | ({"dryRun": "All"} if dry_run else {})
        headers = {"Content-Type": "application/apply-patch+yaml"}
        return self.api.request("PATCH", k.path(ns, meta["name"]), obj, params=params, headers=headers)  # type: ignore[no-any-return]

    def run_pod(
        self, name: str, ns: str = "default", started_s_ago: float = 3600.0, started_at: float | None = None
    ) -> None:
        """Play the kubelet: the pod runs and is ready (since `started_s_ago`, or `started_at`: pods
        meant to start together get the same second even when the calls straddle one)."""
        at = started_at if started_at is not None else time.time() - started_s_ago
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
        status = {
            "phase": "Running",
            "startTime": since,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": since}],
        }
        self.api.patch_status("pods", name, ns, status)

    def apply_file(self, path: Path) -> list[dict[str, Any]]:
        return [self.create(doc) for doc in yaml.safe_load_all(path.read_text()) if doc]

    def get(self, kind: Kind, name: str, ns: str | None = None) -> dict[str, Any] | None:
        return self.api.get(kind, name, ns)

    def pods(self, ns: str = "default") -> dict[str, dict[str, Any]]:
        items = self.api.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        return {p["metadata"]["name"]: p for p in items}

    def node_of(self, name: str, ns: str = "default") -> str:
        p = self.api.get_pod(ns, name) or {}
        return str((p.get("spec") or {}).get("nodeName") or "")

    def events(self, name: str, ns: str = "default") -> list[tuple[str, str]]:
        items = self.api.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]
        return [(e["reason"], e["message"]) for e in items if e["involvedObject"].get("name") == name]

    def ensure_namespace(self, name: str) -> None:
        with suppress(Conflict):
            self.api.create_namespace(name)

    def force_delete_pod(self, name: str, ns: str = "default") -> None:
        """What a kubelet would confirm: the pod is gone (there are no kubelets here)."""
        with suppress(NotFound):
            self.api.delete("pods", name, ns, grace=0)

    # ------------------------------------------------------------------ CRDs
    def install_crds(self, paths: list[Path]) -> None:
        names = []
        for p in paths:
            for doc in yaml.safe_load_all(p.read_text()):
                if not doc:
                    continue
                names.append(doc["metadata"]["name"])
                with suppress(Conflict):
                    self.create(doc)
        for n in names:
            wait_for(f"CRD {n} established", lambda n=n: _established(self.get(CRDS, n)), timeout=30)
        # the API server serves a new CRD's resources a moment after Established
        wait_for("new kinds served", lambda: all(self._served(n) for n in names), timeout=30)

    def _served(self, crd_name: str) -> bool:
        crd = self.get(CRDS, crd_name) or {}
        spec = crd.get("spec") or {}
        v = spec["versions"][0]["name"]
        try:
            self.api.request("GET", f"/apis/{spec['group']}/{v}/{spec['names']['plural']}")
            return True
        except ApiError:
            return False

    def remove_crds(self, names: list[str]) -> None:
        for n in names:
            with suppress(NotFound):
                self.api.delete(CRDS, n)
        for n in names:
            wait_for(f"CRD {n} removed", lambda n=n: self.get(CRDS, n) is None, timeout=60)

    def dialects(self, *which: str) -> None:
        self.install_crds(
            [ROOT / "tests" / "fixtures" / "crds" / f"{f}.yaml" for w in which for f in DIALECT_CRDS[w]]
        )

    # ------------------------------------------------------------------ clean slate
    def cleanup(self) -> None:
        """Every test starts from no nodes, no pods, no queues, no pod groups, no PDBs."""
        served = self.api.served(CLEAN)
        for k in CLEAN:
            if k.key not in served:
                continue
            for o in self.api.list(k)[0]:
                meta = o["metadata"]
                if meta.get("namespace") == "kube-system":
                    continue
                with suppress(NotFound):
                    self.api.delete(
                        k, meta["name"], meta.get("namespace"), grace=0 if k.plural == "pods" else None
                    )
        wait_for("no pods left", lambda: not self.api.list("pods")[0], timeout=30)
        with suppress(NotFound):  # the last test's scheduler's memory: evictions, budgets, service
            self.api.delete(CONFIG_MAPS, SERVICE_CONFIGMAP, "phalanx-system")
        for ns in self.api.list("namespaces")[0]:  # Events about earlier tests' pods of the same names
            name = ns["metadata"]["name"]
            if name != "kube-system":
                self.api.request("DELETE", f"/api/v1/namespaces/{name}/events")

    def terminate(self, gone: set[str]) -> None:
        """Play the kubelet at once: every pod being deleted (a victim terminating) is gone, and
        its name is added to `gone`."""
        for n, p in self.pods().items():
            if p["metadata"].get("deletionTimestamp"):
                gone.add(n)
                self.force_delete_pod(n)

    def delete_all(self, kinds: tuple[Kind, ...]) -> None:
        """Every object of these kinds, finalizers dropped first (no controller here removes them:
        PodGroupProtection's, a claim's delete-protection), pods without their grace."""
        for kind in kinds:
            for o in self.api.list(kind)[0]:
                meta = o["metadata"]
                with suppress(NotFound):
                    if meta.get("finalizers"):
                        self.api.patch(
                            kind, meta["name"], meta.get("namespace"), {"metadata": {"finalizers": None}}
                        )
                    grace = 0 if kind.plural == "pods" else None
                    self.api.delete(kind, meta["name"], meta.get("namespace"), grace=grace)

    def close(self) -> None:
        self.api.close()


CLEAN = (
    JOBS,
    Kind("", "v1", "pods", True, "Pod"),
    Kind("", "v1", "nodes", False, "Node"),
    PDBS,
    Kind("scheduling.phalanx.io", "v1alpha1", "podgroups", True),
    Kind("scheduling.phalanx.io", "v1alpha1", "queues", False),
    Kind("scheduling.phalanx.io", "v1alpha1", "datasets", True),
    Kind("scheduling.run.ai", "v2alpha2", "podgroups", True),
    Kind("scheduling.run.ai", "v2", "queues", False),
    Kind("scheduling.volcano.sh", "v1beta1", "podgroups", True),
    Kind("scheduling.volcano.sh", "v1beta1", "queues", False),
    Kind("scheduling.x-k8s.io", "v1alpha1", "podgroups", True),
    Kind("kueue.x-k8s.io", "v1beta2", "workloads", True),
    Kind("kueue.x-k8s.io", "v1beta2", "localqueues", True),
    Kind("kueue.x-k8s.io", "v1beta2", "clusterqueues", False),
    Kind("kueue.x-k8s.io", "v1beta2", "resourceflavors", False),
    Kind("kueue.x-k8s.io", "v1beta2", "cohorts", False),
)


def _established(crd: dict[str, Any] | None) -> bool:
    for c in ((crd or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "Established" and c.get("status") == "True":
            return True
    return False


@contextmanager
def running(kube: Kube, profile: str = "phalanx", **cfg: Any) -> Iterator[Scheduler]:
    """A Phalanx scheduler in this process, cycling every 0.2 s until the block ends. Its kept and
    patched worlds are audited against one built from scratch every second: a difference fails the
    test (the scheduler itself would log it and go on with the one from scratch)."""
    api = Api.connect(kubeconfig=str(kube.cp.kubeconfig))
    settings = {
        "leader_elect": False,
        "cycle_seconds": 0.2,
        "rediscover_seconds": 1.0,
        "world_audit_s": 1.0,
        "gc_full_every_s": 0.0,  # in this process: the test runner's objects are not to be frozen
    } | cfg
    s = Scheduler(api, AdapterConfig(profile=profile, **settings), load_profile(profile))
    s.start()
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    try:
        yield s
        drift = s.metrics.drift._value.get()
        assert drift == 0, f"the kept world differed from one built from scratch {drift:g} time(s)"
    finally:
        s.close()
        t.join(timeout=10)
        for inf in [s.informers, *s.informers.running.values()]:
            inf.join(timeout=5)
        api.close()
    # closed means its watches ended: an informer left reading a socket closed under it once read
    # the bytes of the next connection made in this process (a webhook's TLS handshake)
    left = [i.name for i in [s.informers, *s.informers.running.values()] if i.is_alive()]
    assert not left, f"still running after the scheduler was closed: {left}"


def phalanx(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`phalanx ...` as a separate process (for kills, exit codes and leader hand-over)."""
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
