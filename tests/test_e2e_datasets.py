"""The dataset cache on a real control plane, with a real S3 server (SeaweedFS) on loopback.

The cache agent runs as a local process with a node name (there is no kubelet); the admission
webhook is the real one, called by the real API server over TLS; the scheduler is Phalanx.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod
from phalanx.k8s import keys
from phalanx.k8s.client.kinds import Kind
from phalanx.node.cachestore import CacheStore
from test_e2e_shares import webhook  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e
DATASETS = Kind("scheduling.phalanx.io", "v1alpha1", "datasets", True, "Dataset")
SECRETS = Kind("", "v1", "secrets", True, "Secret")


@pytest.fixture
def source(s3) -> Any:
    """A dataset of 60 objects in S3: (prefix, {rel: md5})."""
    fs = s3.filesystem()
    prefix = f"{s3.bucket}/imagenet-{secrets.token_hex(3)}"
    sums = {}
    for i in range(60):
        data = os.urandom(100_000 + 1_000 * i)
        fs.pipe_file(f"{prefix}/train/{i:03d}.tar", data)
        sums[f"train/{i:03d}.tar"] = hashlib.md5(data, usedforsecurity=False).hexdigest()
    yield prefix, sums
    fs.rm(prefix, recursive=True)


def _dataset(
    kube: Kube, s3: Any, prefix: str, name: str = "imagenet", nodes: list[str] | None = None
) -> None:
    data = {"AWS_ACCESS_KEY_ID": s3.key, "AWS_SECRET_ACCESS_KEY": s3.secret}
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s3-creds", "namespace": "default"},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
    )
    spec: dict[str, Any] = {
        "source": f"s3://{prefix}",
        "endpoint": s3.endpoint,
        "secretRef": {"name": "s3-creds"},
    }
    if nodes:
        spec["nodes"] = nodes
    kube.apply(
        {
            "apiVersion": "scheduling.phalanx.io/v1alpha1",
            "kind": "Dataset",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        }
    )


def _agent(kube: Kube, node_name: str, root: Path, *extra: str) -> subprocess.Popen[str]:
    args = ["cache", "--node-name", node_name, "--kubeconfig", str(kube.cp.kubeconfig), "--root", str(root)]
    args += ["--capacity", "1Gi", "--metrics-port", "0", "--interval", "0.2", *extra]
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _status(kube: Kube, name: str = "imagenet") -> dict[str, Any]:
    return (kube.get(DATASETS, name, "default") or {}).get("status") or {}


def _md5s(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.md5(p.read_bytes(), usedforsecurity=False).hexdigest()
        for p in folder.rglob("*")
        if p.is_file()
    }


def test_dataset_staged_published_placed_and_mounted(
    kube: Kube,
    s3: Any,
    source: Any,
    webhook: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    prefix, sums = source
    kube.api.create("nodes", node("gpu-a", gpus=8))
    kube.api.create("nodes", node("gpu-b", gpus=8))
    _dataset(kube, s3, prefix, nodes=["gpu-b"])  # a warm-up on gpu-b
    root = tmp_path / "cache-b"
    agent = _agent(kube, "gpu-b", root, "--once")
    out, _ = agent.communicate(timeout=120)
    assert agent.returncode == 0, out
    assert (
        "staging default/imagenet (spec.nodes): 60 files" in out and "dataset default/imagenet ready" in out
    )
    # what the node and the Dataset say
    notes = (kube.api.get("nodes", "gpu-b") or {})["metadata"]["annotations"]
    total = sum(100_000 + 1_000 * i for i in range(60))
    assert json.loads(notes[keys.CACHED_DATASETS]) == {"default/imagenet": str(total)}
    st = _status(kube)
    assert st["totalBytes"] == total and st["files"] == 60
    assert st["nodes"]["gpu-b"]["state"] == "ready" and st["nodes"]["gpu-b"]["bytes"] == total
    assert _md5s(root / "ready" / "default" / "imagenet") == sums
    # a pod that names the dataset goes where the data is (gpu-a would win the tie otherwise)
    kube.create(pod("reader", gpus=1, annotations={keys.DATASET: "imagenet"}))
    created = kube.api.get_pod("default", "reader") or {}
    vols = {v["name"]: v for v in created["spec"].get("volumes") or []}
    assert vols["phalanx-dataset"]["hostPath"] == {
        "path": "/var/lib/phalanx/datasets/ready/default/imagenet",
        "type": "Directory",
    }
    mounts = created["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "phalanx-dataset", "mountPath": "/phalanx/datasets/imagenet", "readOnly": True} in mounts
    with running(kube):
        wait_for("reader bound", lambda: kube.node_of("reader") != "", timeout=30)
    assert kube.node_of("reader") == "gpu-b"


def test_dataset_from_another_namespace_is_refused(kube: Kube, webhook: Any) -> None:  # noqa: F811
    from phalanx.k8s.client.api import ApiError

    with pytest.raises(ApiError, match="is in another namespace"):
        kube.create(pod("thief", gpus=1, annotations={keys.DATASET: "kube-system/secrets"}))


def test_agent_killed_mid_staging_resumes_and_verifies(
    kube: Kube, s3: Any, source: Any, tmp_path: Path
) -> None:
    prefix, sums = source
    kube.api.create("nodes", node("gpu-c", gpus=8))
    _dataset(kube, s3, prefix, nodes=["gpu-c"])
    root = tmp_path / "cache-c"
    # slowed to 1 MiB/s so that the kill lands mid-staging (the dataset is 7.8 MiB)
    first = _agent(kube, "gpu-c", root, "--max-bandwidth", "1Mi", "--workers", "4")
    staging = root / "staging" / "default" / "imagenet"

    def some_done() -> bool:
        return len([p for p in staging.rglob("*.tar")]) >= 5 if staging.exists() else False

    wait_for("a few files verified", some_done, timeout=60)
    wait_for(
        "status says staging",
        lambda: (_status(kube).get("nodes") or {}).get("gpu-c", {}).get("state") == "staging",
    )
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    kept = {p.name for p in staging.rglob("*.tar")}
    partial = list(staging.rglob("*.part"))
    assert 5 <= len(kept) < 60 and not (root / "ready" / "default" / "imagenet").exists()
    kept_bytes = sum(p.stat().st_size for p in staging.rglob("*.tar")) + sum(
        p.stat().st_size for p in partial
    )
    second = _agent(kube, "gpu-c", root, "--once", "--checksum")
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, out
    ready = root / "ready" / "default" / "imagenet"
    assert _md5s(ready) == sums  # every file, and each one verified against its source
    assert not staging.exists()
    fetched = CacheStore(root, 1 << 30).ready()["default/imagenet"]
    assert fetched == sum(100_000 + 1_000 * i for i in range(60))
    assert kept_bytes > 0
    assert _status(kube)["nodes"]["gpu-c"]["state"] == "ready"


def test_bad_credentials_end_in_a_clear_status(kube: Kube, s3: Any, source: Any, tmp_path: Path) -> None:
    prefix, _ = source
    kube.api.create("nodes", node("gpu-d", gpus=8))
    _dataset(kube, s3, prefix, nodes=["gpu-d"])
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s3-creds", "namespace": "default"},
            "data": {
                "AWS_ACCESS_KEY_ID": base64.b64encode(s3.key.encode()).decode(),
                "AWS_SECRET_ACCESS_KEY": base64.b64encode(b"wrong").decode(),
            },
        }
    )
    for name, ds in (("reader", "imagenet"), ("typo", "imagenett")):  # bound here, as if scheduled
        kube.create(pod(name, node="gpu-d", annotations={keys.DATASET: ds}))
    agent = _agent(kube, "gpu-d", tmp_path / "cache-d", "--once")
    out, _ = agent.communicate(timeout=60)
    entry = _status(kube)["nodes"]["gpu-d"]
    assert entry["state"] == "failed", out
    assert "denied" in entry["reason"] and "check the credentials" in entry["reason"]
    notes = (kube.api.get("nodes", "gpu-d") or {})["metadata"]["annotations"]
    assert json.loads(notes[keys.CACHED_DATASETS]) == {}
    # the pods are told, not only kubelet's FailedMount: a Warning Event with the reason
    (told,) = [m for r, m in kube.events("reader") if r == "DatasetNotCached"]
    assert "staging Dataset default/imagenet on node gpu-d failed" in told and "denied" in told, told
    (told,) = [m for r, m in kube.events("typo") if r == "DatasetNotCached"]
    assert "Dataset default/imagenett does not exist" in told, told


def test_a_pod_given_the_per_node_mount_of_a_distributed_dataset_is_told(
    kube: Kube, s3: Any, source: Any, tmp_path: Path
) -> None:
    """The node agent copies nothing of a distributed Dataset (`phalanx distcache` caches it across
    the group). A pod the webhook gave the per-node mount (the distributed cache not running) waits
    for a copy never made: it is told, not left in FailedMount without a word; a pod on the
    distributed cache's mount is told nothing."""
    prefix, _ = source
    kube.api.create("nodes", node("gpu-f", gpus=8))
    _dataset(kube, s3, prefix, name="spread")
    kube.api.patch(DATASETS, "spread", "default", {"spec": {"cache": "distributed"}})
    for name, volume in (("spread-reader", keys.DATASET_VOLUME), ("spread-fuse", "phalanx-distcache")):
        p = pod(name, node="gpu-f", annotations={keys.DATASET: "spread"})
        p["spec"]["volumes"] = [{"name": volume, "hostPath": {"path": "/nowhere", "type": "Directory"}}]
        kube.create(p)
    agent = _agent(kube, "gpu-f", tmp_path / "cache-f", "--once")
    out, _ = agent.communicate(timeout=60)
    assert agent.returncode == 0, out
    (told,) = [m for r, m in kube.events("spread-reader") if r == "DatasetNotCached"]
    assert "Dataset default/spread is distributed" in told and "distcache.enabled" in told, told
    assert not [m for r, m in kube.events("spread-fuse") if r == "DatasetNotCached"]
    assert not (tmp_path / "cache-f" / "ready" / "default" / "spread").exists()


def test_scheduler_asks_for_staging_ahead_of_a_waiting_gang(
    kube: Kube, s3: Any, source: Any, tmp_path: Path
) -> None:
    prefix, sums = source
    kube.api.create("nodes", node("gpu-e", gpus=8))
    _dataset(kube, s3, prefix)  # no warm-up: only the scheduler's request can bring it here
    busy = {keys.ESTIMATED_RUNTIME: "600"}
    kube.create(pod("running", gpus=8, annotations=busy))
    with running(kube):
        wait_for("the node is full", lambda: kube.node_of("running") == "gpu-e", timeout=30)
        kube.create(pod("next", gpus=8, annotations={keys.DATASET: "imagenet"}))

        def requested() -> dict[str, str]:
            notes = (kube.api.get("nodes", "gpu-e") or {})["metadata"].get("annotations") or {}
            return json.loads(notes.get(keys.STAGE_DATASETS) or "{}")

        wait_for(
            "a staging request on gpu-e",
            lambda: requested() == {"default/imagenet": "default/next"},
            timeout=30,
        )
    agent = _agent(kube, "gpu-e", tmp_path / "cache-e", "--once")
    out, _ = agent.communicate(timeout=120)
    assert "staging default/imagenet (requested by the scheduler)" in out, out
    assert _md5s(tmp_path / "cache-e" / "ready" / "default" / "imagenet") == sums
    assert _status(kube)["nodes"]["gpu-e"]["state"] == "ready"
    time.sleep(0)  # the request is cleared by the scheduler once the data is there (next cycle)


def test_a_dataset_in_use_is_never_evicted_and_lru_makes_room(
    kube: Kube, s3: Any, source: Any, tmp_path: Path
) -> None:
    prefix, _ = source  # 7.8 MiB
    kube.api.create("nodes", node("gpu-f", gpus=8))
    _dataset(kube, s3, prefix, name="first", nodes=["gpu-f"])
    root = tmp_path / "cache-f"
    cap = ["--capacity", "12Mi"]  # room for one copy only
    out, _ = _agent(kube, "gpu-f", root, "--once", *cap).communicate(timeout=120)
    assert "dataset default/first ready" in out, out
    # a pod bound here uses it: the second dataset cannot take its place
    kube.create(pod("user", gpus=1, node="gpu-f", annotations={keys.DATASET: "first"}))
    _dataset(kube, s3, prefix, name="second", nodes=["gpu-f"])
    out, _ = _agent(kube, "gpu-f", root, "--once", *cap).communicate(timeout=120)
    entry = _status(kube, "second")["nodes"]["gpu-f"]
    assert entry["state"] == "failed" and entry["reason"].startswith("cache full:"), out
    assert "datasets in use" in entry["reason"]
    assert _status(kube, "first")["nodes"]["gpu-f"]["state"] == "ready"
    # the pod is gone: the least recently used copy makes room
    kube.force_delete_pod("user")
    wait_for("the pod gone", lambda: kube.api.get_pod("default", "user") is None)
    out, _ = _agent(kube, "gpu-f", root, "--once", *cap).communicate(timeout=120)
    assert "dataset default/first: evicted (least recently used) to make room for default/second" in out, out
    notes = (kube.api.get("nodes", "gpu-f") or {})["metadata"]["annotations"]
    assert list(json.loads(notes[keys.CACHED_DATASETS])) == ["default/second"]
    assert "gpu-f" not in (_status(kube, "first").get("nodes") or {})
    assert _status(kube, "second")["nodes"]["gpu-f"]["state"] == "ready"


def test_a_dataset_larger_than_the_cache_fails_clearly(
    kube: Kube, s3: Any, source: Any, tmp_path: Path
) -> None:
    prefix, _ = source
    kube.api.create("nodes", node("gpu-g", gpus=8))
    _dataset(kube, s3, prefix, nodes=["gpu-g"])
    out, _ = _agent(kube, "gpu-g", tmp_path / "c", "--once", "--capacity", "1Mi").communicate(timeout=60)
    entry = _status(kube)["nodes"]["gpu-g"]
    assert entry["state"] == "failed", out
    assert entry["reason"] == "the dataset (7.4 MiB) is larger than this node's cache (1.0 MiB)"
