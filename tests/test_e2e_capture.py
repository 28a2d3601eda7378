"""`phalanx capture` on a real kube-apiserver: KAI, Volcano and Kueue objects, DRA slices and a claim.

Parity: the capture replays (through the same `build_world`) to the snapshot the live adapter
builds from its watch cache. Redaction: no original name is left in the file, and the redacted
capture replays to the same decisions. Read rights short of everything: the kinds refused are
listed with why, and the capture still completes. The CLI replays a capture to binds and waits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dra_kube import device_classes, dgx_slices
from e2e_kube import SERVICE_ACCOUNTS, Kube, wait_for
from kube_objects import node, pod, pod_group
from phalanx.k8s.client.api import Api
from phalanx.k8s.client.kinds import DEVICE_CLASSES, JOBS, RESOURCE_CLAIMS, RESOURCE_SLICES
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.loop.scheduler import Scheduler
from phalanx.k8s.trial import capture as cap
from phalanx.k8s.trial.redact import redact
from phalanx.k8s.trial.replay import compare, fingerprint
from phalanx.profiles import load_profile

pytestmark = pytest.mark.e2e
KV = "kueue.x-k8s.io/v1beta2"
R = "resource.k8s.io/v1"
CFG = AdapterConfig(profile="phalanx-queues", kueue="migrate", leader_elect=False, rediscover_seconds=1.0)
# every name the cluster below is made of (none a substring of the words a capture keeps)
NAMES = (
    "kestrel-a",
    "kestrel-b",
    "kestrel-dra",
    "quokka",
    "wombat-kai",
    "wombat-vc",
    "numbat-flavor",
    "numbat-cq",
    "numbat-lq",
    "kaiqueue-x",
    "vcqueue-x",
    "gang-kai",
    "gang-vc",
    "lone-pod",
    "other-pod",
    "dra-pod",
    "dra-claim",
    "kueue-pod",
    "kai-0",
    "kai-1",
    "vc-0",
    "vc-1",
)


def _claim() -> dict[str, Any]:
    req = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}
    return {
        "apiVersion": R,
        "kind": "ResourceClaim",
        "metadata": {"name": "dra-claim", "namespace": "default"},
        "spec": {"devices": {"requests": [req]}},
    }


def _cluster(kube: Kube) -> None:
    kube.dialects("kai", "volcano", "kueue")
    kube.api.create("nodes", node("kestrel-a", gpus=8, labels={"pool": "quokka"}))
    kube.api.create("nodes", node("kestrel-b", gpus=8, labels={"topology.phalanx.io/rack": "wombat-kai"}))
    bare = node("kestrel-dra", gpus=0)
    bare["metadata"]["labels"] = {"topology.phalanx.io/rack": "wombat-vc"}
    kube.api.create("nodes", bare)
    for c in device_classes():
        kube.apply(c)
    for s in dgx_slices("kestrel-dra"):
        kube.create(s)
    kube.create(_claim())
    kube.create(
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": "kaiqueue-x"},
            "spec": {"resources": {"gpu": {"quota": 8, "limit": -1, "overQuotaWeight": 1}}},
        }
    )
    kube.create(
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": "vcqueue-x"},
            "spec": {"weight": 1},
        }
    )
    kube.create(pod_group("gang-kai", 2, api="scheduling.run.ai/v2alpha2", queue="kaiqueue-x"))
    kube.create(pod_group("gang-vc", 2, api="scheduling.volcano.sh/v1beta1", queue="vcqueue-x"))
    flavor = {"name": "numbat-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}
    kube.create(
        {
            "apiVersion": KV,
            "kind": "ResourceFlavor",
            "metadata": {"name": "numbat-flavor"},
            "spec": {"nodeLabels": {"pool": "quokka"}},
        }
    )
    kube.create(
        {
            "apiVersion": KV,
            "kind": "ClusterQueue",
            "metadata": {"name": "numbat-cq"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [flavor]}],
            },
        }
    )
    kube.create(
        {
            "apiVersion": KV,
            "kind": "LocalQueue",
            "metadata": {"name": "numbat-lq", "namespace": "default"},
            "spec": {"clusterQueue": "numbat-cq"},
        }
    )
    for k in range(2):  # a KAI gang running, a Volcano gang waiting
        kube.create(pod(f"kai-{k}", gpus=4, node="kestrel-b", annotations={"pod-group-name": "gang-kai"}))
        kube.create(pod(f"vc-{k}", gpus=8, annotations={"scheduling.k8s.io/group-name": "gang-vc"}))
    kube.run_pod("kai-0")
    kube.create(pod("lone-pod", gpus=1, labels={"app": "quokka"}))
    kube.create(pod("kueue-pod", gpus=2, labels={"kueue.x-k8s.io/queue-name": "numbat-lq"}))
    kube.create(pod("other-pod", gpus=2, scheduler="default-scheduler", node="kestrel-a"))
    dra = pod("dra-pod")
    dra["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "dra-claim"}]
    dra["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    kube.create(dra)


@pytest.fixture
def cluster(kube: Kube):  # type: ignore[no-untyped-def]
    _cluster(kube)
    yield kube
    for k in (RESOURCE_CLAIMS, RESOURCE_SLICES, DEVICE_CLASSES):
        for o in kube.api.list(k)[0]:
            kube.api.delete(k, o["metadata"]["name"], o["metadata"].get("namespace"))


def _live(kube: Kube, now: float) -> dict[str, Any]:
    """The snapshot the scheduler builds from its watch cache (informers synced), as plain data."""
    from phalanx.k8s.read.gather import gather

    api = Api.connect(kubeconfig=str(kube.cp.kubeconfig))
    s = Scheduler(api, CFG, load_profile(CFG.profile))
    s.start()
    try:
        assert s.wait_synced(20)
        read = gather(
            s.store.items, s.store.is_synced((JOBS.key,)), CFG, s.assume.apply(s.store.items("pods"), now)
        )
        return fingerprint(read.world(CFG, now))
    finally:
        s.close()
        api.close()


def test_a_capture_replays_to_the_snapshot_the_live_adapter_builds(cluster: Kube, tmp_path: Path) -> None:
    now = time.time()
    c = cap.take(cluster.api, CFG, now=now)
    path = tmp_path / "c.json.gz"
    cap.write(c, path)
    back = cap.load(path)
    replayed = fingerprint(back.gathered(CFG).world(CFG, now))
    live = _live(cluster, now)
    assert replayed == live
    # it is the cluster above: every dialect, Kueue's queue, the DRA devices, the waiting gang
    assert {"kestrel-a", "kestrel-b", "kestrel-dra"} <= {n.split("'")[1] for n in live["nodes"]}
    assert {"kaiqueue-x", "vcqueue-x", "numbat-cq"} <= set(live["queues"])
    assert len(live["dra"]) == 12  # 8 GPUs and 4 NICs of kestrel-dra
    assert "default/gang-vc" in live["workloads"] and "default/kai-0" in live["allocations"]
    assert not back.unreadable and not back.redacted


def test_a_redacted_capture_holds_no_original_name_and_replays_alike(cluster: Kube, tmp_path: Path) -> None:
    now = time.time()
    c = cap.take(cluster.api, CFG, now=now)
    path = tmp_path / "r.json"
    cap.write(redact(c), path)
    text = path.read_text()
    left = [n for n in NAMES if n in text]
    assert not left, f"original names left in the redacted capture: {left}"
    prof = load_profile(CFG.profile)
    plain, hidden = compare(c, CFG, prof), compare(cap.load(path), CFG, prof)
    assert len(hidden.result.binds) == len(plain.result.binds) > 0
    assert [len(p.reasons) for p in hidden.result.pending] == [len(p.reasons) for p in plain.result.pending]
    a, b = fingerprint(plain.world), fingerprint(hidden.world)
    assert a["free"] == b["free"] and len(a["workloads"]) == len(b["workloads"])
    assert len(a["dra"]) == len(b["dra"]) == 12 and not set(a["workloads"]) & set(b["workloads"])


def test_kinds_that_cannot_be_read_are_listed_and_the_capture_completes(
    cluster: Kube, tmp_path: Path
) -> None:
    kube = cluster
    kube.ensure_namespace("capture-ro")
    rules = [{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["list"]}]
    for doc in (
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "reader", "namespace": "capture-ro"},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "capture-ro"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "capture-ro"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "capture-ro"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "capture-ro"}],
        },
    ):
        kube.apply(doc)
    tok = kube.api.request(
        "POST", SERVICE_ACCOUNTS.path("capture-ro", "reader", "token"), {"spec": {"expirationSeconds": 600}}
    )["status"]["token"]
    cfg = kube.cp.kubeconfig_for_token(tok, "reader")
    out = tmp_path / "ro.json"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "phalanx.cli.main", *args], capture_output=True, text=True, timeout=60
        )

    def readable() -> subprocess.CompletedProcess[str] | None:
        r = run("capture", "--kubeconfig", str(cfg), "-o", str(out))
        return r if r.returncode == 0 and "pods" not in cap.load(out).unreadable else None

    res = wait_for("the reader's binding in effect", readable, timeout=20, every=0.5)
    c = cap.load(out)
    assert len(c.items("pods")) == 8 and len(c.items("nodes")) == 3
    assert (
        "scheduling.run.ai/v2/queues" in c.unreadable and "403" in c.unreadable["scheduling.run.ai/v2/queues"]
    )
    assert "resource.k8s.io/v1/resourceslices" in c.unreadable
    assert "not read: scheduling.run.ai/v2/queues: 403" in res.stdout
    # the CLI replays it: what Phalanx would do for the pods of `phalanx` that wait
    rep = run(
        "schedule", "--capture", str(out), "--scheduler-name", "phalanx", "--profile", "phalanx", "--json"
    )
    assert rep.returncode == 0, rep.stdout + rep.stderr
    d = json.loads(rep.stdout)
    rows = {r["pod"]: r for r in d["pods"]}
    assert rows["default/lone-pod"]["phalanx"].startswith("bind to kestrel-")
    assert rows["default/lone-pod"]["current"].startswith("waits")
    assert d["placed_pods"] == {"default/kai-0": "kestrel-b", "default/kai-1": "kestrel-b"}
    table = run("schedule", "--capture", str(out), "--scheduler-name", "phalanx")
    assert table.returncode == 0 and "What phalanx did, and what Phalanx would do now" in table.stdout
    assert "not in the capture:" in table.stdout
