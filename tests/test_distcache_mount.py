"""Pods on a distributed Dataset: the webhook's FUSE mount and scheduling gate, the Dataset's
`spec.readiness`, and `phalanx distcache` lifting the gate (with a fake client: no cluster)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kube_objects import pod
from phalanx.core.errors import SpecError
from phalanx.k8s import keys
from phalanx.k8s.admission.mutation import (
    DATASET_GATE,
    DISTRIBUTED_VOLUME,
    Distributed,
    mutate,
    review,
)
from phalanx.k8s.config import AdapterConfig
from phalanx.node import distcache as dc
from phalanx.spec.datasets import parse_dataset

CFG = AdapterConfig()
ROOT = "/var/lib/phalanx/distcache"


def _ds(name: str = "big", state: str = "", **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"namespace": "team", "name": name},
        "spec": {"source": "s3://b/p", "cache": "distributed", **spec},
    }
    if state:
        obj["status"] = {"distributed": {"state": state}}
    return obj


def _dist(*objs: dict[str, Any]) -> Distributed:
    by = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}
    return Distributed(ROOT, lambda ns, name: by.get((ns, name)))


def _reader(dataset: str = "big") -> dict[str, Any]:
    return pod("reader", ns="team", annotations={keys.DATASET: dataset})


# ------------------------------------------------------------------------------ spec.readiness
def test_readiness_is_read_and_defaults_to_cached() -> None:
    assert not parse_dataset(_ds()).read_through
    assert parse_dataset(_ds(readiness="readThrough")).read_through


@pytest.mark.parametrize(
    "spec, field, says",
    [
        ({"readiness": "soon"}, "spec.readiness", "must be one of cached, readThrough; got 'soon'"),
        ({"cache": "node", "readiness": "cached"}, "spec.readiness", "only a distributed cache"),
    ],
)
def test_bad_readiness_is_refused_naming_the_field(spec: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_dataset(_ds(**spec))
    assert field in str(e.value) and says in str(e.value), str(e.value)


# ------------------------------------------------------------------------------ the webhook
def test_a_pod_on_a_distributed_dataset_mounts_its_folder_in_the_fuse_mount_at_the_same_path() -> None:
    per_node = mutate(_reader(), "team", CFG)
    dist = mutate(_reader(), "team", CFG, _dist(_ds(state="ready")))
    assert per_node is not None and dist is not None
    (vol,) = dist["spec"]["volumes"]
    assert vol == {
        "name": DISTRIBUTED_VOLUME,
        "hostPath": {"path": f"{ROOT}/fs/team/big", "type": "Directory"},
    }
    mounts = [m for m in dist["spec"]["containers"][0]["volumeMounts"] if m["name"] == DISTRIBUTED_VOLUME]
    (same,) = [
        m for m in per_node["spec"]["containers"][0]["volumeMounts"] if m["name"] == keys.DATASET_VOLUME
    ]
    assert mounts == [{**same, "name": DISTRIBUTED_VOLUME}]  # the job sees the same path, read-only
    assert "schedulingGates" not in dist["spec"]  # ready: nothing to wait for


@pytest.mark.parametrize("state", ["", "caching", "failed"])
def test_a_pod_waits_behind_a_gate_until_the_dataset_is_cached(state: str) -> None:
    out = mutate(_reader(), "team", CFG, _dist(_ds(state=state)))
    assert out is not None and out["spec"]["schedulingGates"] == [{"name": DATASET_GATE}]


def test_read_through_starts_at_once_and_per_node_datasets_are_unchanged() -> None:
    out = mutate(_reader(), "team", CFG, _dist(_ds(state="caching", readiness="readThrough")))
    assert out is not None and "schedulingGates" not in out["spec"]
    node = _ds()
    node["spec"]["cache"] = "node"
    for d in (_dist(node), _dist()):  # a per-node Dataset, or none (yet): the per-node copy
        out = mutate(_reader(), "team", CFG, d)
        assert out is not None and out["spec"]["volumes"][0]["name"] == keys.DATASET_VOLUME


def test_a_malformed_distributed_dataset_refuses_the_pod_naming_its_field() -> None:
    body = {"request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "team"}}
    body["request"]["object"] = _reader()
    resp = review(body, CFG, _dist(_ds(readiness="later")))["response"]
    assert resp["allowed"] is False
    assert "Dataset team/big: spec.readiness" in resp["status"]["message"], resp


def test_an_unreadable_api_leaves_the_pod_on_the_per_node_path() -> None:
    def broken(ns: str, name: str) -> dict[str, Any] | None:
        raise OSError("connection refused")

    out = mutate(_reader(), "team", CFG, Distributed(ROOT, broken))
    assert out is not None and out["spec"]["volumes"][0]["name"] == keys.DATASET_VOLUME


def test_review_patches_the_gate_in() -> None:
    body = {"request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "team"}}
    body["request"]["object"] = _reader()
    resp = review(body, CFG, _dist(_ds()))["response"]
    ops = {o["path"]: o["value"] for o in json.loads(base64.b64decode(resp["patch"]))}
    assert ops["/spec/schedulingGates"] == [{"name": DATASET_GATE}]


# ------------------------------------------------------------------------------ the gate lifted
class FakeClient:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.patches: list[tuple[str, Any]] = []
        self.events: list[Any] = []

    def list(self, res: Any, namespace: str = "") -> list[Any]:
        return [type("P", (), {"to_dict": lambda self, p=p: p})() for p in self.pods]

    def patch(self, res: Any, name: str, body: Any, **kw: Any) -> None:
        self.patches.append((name, body))

    def create(self, obj: Any) -> None:
        self.events.append(obj)


def _gated(name: str, dataset: str = "big", gates: tuple[str, ...] = (DATASET_GATE,)) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"u-{name}",
            "annotations": {keys.DATASET: dataset},
        },
        "spec": {"schedulingGates": [{"name": g} for g in gates]},
    }


def _summary(state: str) -> dc.Summary:
    return dc.Summary(state, 100, 40, 10, 4, {}, [], "")


def test_distcache_lifts_the_gate_once_the_dataset_is_cached_and_tells_the_pod_why_until_then() -> None:
    client = FakeClient(
        [_gated("a"), _gated("b", gates=(DATASET_GATE, "other")), _gated("c", dataset="small")]
    )
    ctl = dc.DistCache(client, None)  # type: ignore[arg-type]
    ds = parse_dataset(_ds())
    ctl.release(ds, _summary("caching"))
    ctl.release(ds, _summary("caching"))  # told once per state, not every look
    assert not client.patches
    assert [(e.involvedObject.name, e.reason) for e in client.events] == [
        ("a", "WaitingForDataset"),
        ("b", "WaitingForDataset"),
    ]
    assert "4 of 10 files cached" in client.events[0].message
    ctl.release(ds, _summary("ready"))
    assert client.patches == [
        ("a", [{"op": "replace", "path": "/spec/schedulingGates", "value": []}]),
        ("b", [{"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "other"}]}]),
    ]
    assert dc.GATE == DATASET_GATE


# ------------------------------------------------------------------------------ the scheduler
def test_the_scheduler_leaves_a_gated_pod_alone_until_the_gate_is_lifted() -> None:
    import numpy as np

    from kube_objects import node
    from phalanx.core.cycle import run_cycle
    from phalanx.k8s.read.world import build_world
    from phalanx.profiles import load_profile

    def cycle(p: dict[str, Any]) -> Any:
        w = build_world([node("a", gpus=8)], [p], [], [], AdapterConfig(), 0.0)
        return run_cycle(w.snapshot, load_profile("phalanx"), 0.0, np.random.default_rng(0))

    held = pod("reader", gpus=1)
    held["spec"]["schedulingGates"] = [{"name": DATASET_GATE}]
    r = cycle(held)
    assert not r.binds and not r.pending  # not placed, and not ours to explain: its Events say why
    held["spec"]["schedulingGates"] = []
    (b,) = cycle(held).binds
    assert b.node == "a"


# ------------------------------------------------------------------------------ readThrough, for real
def test_read_through_the_fuse_mount_fetches_what_is_not_cached_yet(tmp_path: Any) -> None:
    """What a `readThrough` pod does: read a mounted source before `remote.cache` ran, through
    `weed mount` (FUSE, as the chart's mount DaemonSet runs it); the filer fetches each file."""
    import hashlib
    import os
    import subprocess
    import time

    from phalanx.node.objectstore import S3Server, Unavailable, find_weed
    from phalanx.node.weedcluster import WeedCluster

    try:
        find_weed()
    except Unavailable as e:
        pytest.skip(str(e))
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("a FUSE mount needs root and /dev/fuse")
    s3 = S3Server().start()
    try:
        fs, want = s3.filesystem(), {}
        for i in range(3):
            data = os.urandom((i + 1) << 20)
            fs.pipe_file(f"{s3.bucket}/rt/f{i}.bin", data)
            want[f"f{i}.bin"] = hashlib.sha256(data).hexdigest()
        with WeedCluster(volumes=2) as c:
            weed = dc.Weed(c.master, c.filer)
            weed.configure_remote("rt", s3.endpoint, s3.key, s3.secret, "us-east-1")
            weed.mount("/phalanx/datasets/team/rt", f"rt/{s3.bucket}/rt", "rt", 1)
            assert not any(f.chunks for f in weed.files("/phalanx/datasets/team/rt"))  # nothing cached
            mnt = tmp_path / "fs"
            mnt.mkdir()
            args = [str(weed.weed), "mount", f"-filer={c.filer}", "-filer.path=/phalanx/datasets"]
            log = open(tmp_path / "mount.log", "wb")  # noqa: SIM115 (the process owns it)
            p = subprocess.Popen(
                [*args, f"-dir={mnt}", "-readOnly", "-cacheCapacityMB=0"], stdout=log, stderr=log
            )
            try:
                folder = mnt / "team" / "rt"
                deadline = time.monotonic() + 20
                while not folder.is_dir() and time.monotonic() < deadline:
                    time.sleep(0.1)
                got = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}
            finally:
                p.terminate()
                p.wait(10)
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
            assert got == want, (tmp_path / "mount.log").read_text()[-2000:]
            assert all(f.chunks for f in weed.files("/phalanx/datasets/team/rt"))  # and now cached
    finally:
        s3.stop()
