"""The distributed dataset cache (`spec.cache: distributed`, `phalanx.node.distcache`) on a real SeaweedFS.

The unit tests check the Dataset's new fields and the status arithmetic; the cluster tests start
a master, a filer and 4 volume servers on loopback, each smaller than the dataset, cache an S3
source (the `s3` fixture, itself a SeaweedFS) through the controller, read every file back through
the filer and check it, then SIGKILL a volume server and read everything again.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import pytest

from phalanx.core.errors import SpecError
from phalanx.node import distcache as dc
from phalanx.node.stager import RemoteFile
from phalanx.spec.datasets import parse_dataset


def _ds(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": "big"}, "spec": {"source": "s3://b/p", **spec}}


# ------------------------------------------------------------------------------ the Dataset fields
def test_cache_defaults_to_per_node_copies() -> None:
    ds = parse_dataset(_ds())
    assert (ds.spec.cache, ds.distributed, ds.copies) == ("node", False, 1)


def test_distributed_defaults_to_two_copies() -> None:
    ds = parse_dataset(_ds(cache="distributed"))
    assert (ds.distributed, ds.copies) == (True, 2)
    assert parse_dataset(_ds(cache="distributed", replicas=3)).copies == 3
    assert dc.replication(3) == "002"


@pytest.mark.parametrize(
    ("spec", "field_", "says"),
    [
        ({"cache": "striped"}, "spec.cache", "must be one of node, distributed; got 'striped'"),
        ({"replicas": 2}, "spec.replicas", "only a distributed cache"),
        ({"cache": "distributed", "replicas": 4}, "spec.replicas", "must be 1 to 3; got 4"),
        ({"cache": "distributed", "replicas": 0}, "spec.replicas", "must be 1 to 3; got 0"),
        ({"cache": "distributed", "source": "gs://b/p"}, "spec.source", "S3 sources only"),
        ({"cache": "distributed", "nodes": ["n1"]}, "spec.nodes", "cached across the group"),
        ({"cache": "distributed", "include": "train/*.tar"}, "spec.include", "file names only"),
    ],
)
def test_bad_cache_fields_name_the_field(spec: dict[str, Any], field_: str, says: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_dataset(_ds(**spec))
    assert f"Dataset team-a/big: {field_}" in str(e.value)
    assert says in str(e.value)


# ------------------------------------------------------------------------------ the status
def _src(*sizes: int) -> list[RemoteFile]:
    return [RemoteFile(f"b/p/f{i}", f"f{i}", n, f"e{i}") for i, n in enumerate(sizes)]


def _file(i: int, size: int, *vols: int, etag: str = "") -> dc.CachedFile:
    per = size // max(len(vols), 1)
    return dc.CachedFile(f"f{i}", size, etag or f"e{i}", tuple(dc.Chunk(v, per) for v in vols))


def test_summary_ready_counts_bytes_per_server_with_replicas() -> None:
    locs = {1: ["a", "b"], 2: ["c", "d"]}
    s = dc.summarize(_src(100, 60), [_file(0, 100, 1), _file(1, 60, 2)], locs, copies=2)
    assert (s.state, s.cached_bytes, s.total_bytes, s.cached_files) == ("ready", 160, 160, 2)
    assert s.servers == {"a": 100, "b": 100, "c": 60, "d": 60}
    assert s.status("/p", 2)["servers"] == {"a": 100, "b": 100, "c": 60, "d": 60}


def test_summary_never_reports_a_part_as_whole() -> None:
    locs = {1: ["a", "b"]}
    cached = [
        _file(0, 100, 1),
        _file(1, 50),  # listed by the mount, not fetched yet
        _file(2, 40, 1, etag="old"),  # the source object changed since it was cached
        dc.CachedFile("f3", 30, "e3", (dc.Chunk(1, 10),)),  # a chunk short
    ]
    s = dc.summarize(_src(100, 50, 40, 30, 20), cached, locs, copies=2)  # f4: not in the filer at all
    assert (s.state, s.cached_bytes, s.total_bytes, s.cached_files) == ("caching", 100, 240, 1)
    assert s.reason == "4 of 5 files not cached yet"


def test_summary_lost_and_degraded() -> None:
    cached = [_file(0, 100, 1), _file(1, 60, 2)]
    lost = dc.summarize(_src(100, 60), cached, {1: ["a"]}, copies=1)  # volume 2 has no server left
    assert (lost.state, lost.lost, lost.cached_bytes) == ("caching", ["f1"], 100)
    assert "1 lost with their volume servers" in lost.reason
    short = dc.summarize(_src(100, 60), cached, {1: ["a", "b"], 2: ["c"]}, copies=2)
    assert (short.state, short.cached_bytes) == ("degraded", 160)
    assert short.reason == "1 files have fewer than 2 copies (a volume server lost)"


def test_remote_cache_failures_are_read_from_its_output() -> None:
    out = "Caching /x/a... done\nCaching /x/b... failed: rpc error: no writable volumes\nerror: it broke\n"
    assert dc.failures(out) == ["failed: rpc error: no writable volumes", "error: it broke"]


# ------------------------------------------------------------------------------ a real cluster
@dataclass
class _Obj:
    raw: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.raw


@dataclass
class _Secret:
    data: dict[str, str]


@dataclass
class StubClient:
    """The three calls the controller makes to the API server: list Datasets, read a Secret, patch status."""

    datasets: list[dict[str, Any]]
    secret: dict[str, str]
    statuses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def list(self, res: Any, namespace: str = "") -> list[_Obj]:
        return [_Obj(d) for d in self.datasets]

    def get(self, res: Any, name: str, namespace: str = "") -> _Secret:
        return _Secret({k: base64.b64encode(v.encode()).decode() for k, v in self.secret.items()})

    def patch(self, res: Any, name: str, body: dict[str, Any], namespace: str = "", **_: Any) -> None:
        self.statuses.setdefault(f"{namespace}/{name}", []).append(body["status"])

    def last(self, key: str) -> dict[str, Any]:
        return dict(self.statuses[key][-1]["distributed"])


@pytest.fixture
def weed_cluster():
    from phalanx.node.objectstore import Unavailable
    from phalanx.node.weedcluster import WeedCluster

    try:
        cluster = WeedCluster(volumes=4, max_volumes=3, volume_mb=8).start()
    except Unavailable as e:
        pytest.skip(f"no SeaweedFS: {e}")
    yield cluster
    cluster.stop()


def _dataset(s3: Any, prefix: str, name: str, copies: int) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": name},
        "spec": {
            "source": f"s3://{prefix}",
            "endpoint": s3.endpoint,
            "secretRef": {"name": "s3"},
            "cache": "distributed",
            "replicas": copies,
        },
    }


def _read_all(cluster: Any, name: str, objs: dict[str, bytes]) -> None:
    for rel, data in objs.items():
        url = f"{cluster.filer_url}{dc.ROOT}/team-a/{name}/{rel}"
        with urllib.request.urlopen(url, timeout=30) as r:
            got = r.read()
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest(), rel


@pytest.mark.parametrize(("copies", "factor"), [(2, 1.5), (1, 2.0)], ids=["2-copies", "1-copy-refetch"])
def test_a_dataset_larger_than_a_server_is_cached_across_all_and_survives_one_lost(
    s3: Any, weed_cluster: Any, copies: int, factor: float
) -> None:
    """`factor` x one server's capacity; 2 copies: a replica serves; 1 copy: fetched again."""
    cluster = weed_cluster
    fs = s3.filesystem()
    prefix = f"{s3.bucket}/dist-{secrets.token_hex(4)}"
    shard = 4 << 20  # SeaweedFS 4.48 books 4 MiB of a volume per cached file, whatever its size
    n = int(cluster.capacity * factor) // shard
    objs = {f"shard-{i:03d}.bin": os.urandom(shard) for i in range(n - 1)}
    objs["sub/labels.json"] = b'{"classes": 1000}'
    objs["sub/deeper/part.bin"] = os.urandom(shard - 17)
    for rel, data in objs.items():
        fs.pipe_file(f"{prefix}/{rel}", data)
    size = sum(len(v) for v in objs.values())
    assert size > cluster.capacity  # no single volume server could hold it

    name = f"big{copies}"
    client = StubClient(
        [_dataset(s3, prefix, name, copies)],
        {"AWS_ACCESS_KEY_ID": s3.key, "AWS_SECRET_ACCESS_KEY": s3.secret},
    )
    ctl = dc.DistCache(client, dc.Weed(cluster.master, cluster.filer), progress_s=0.5)  # type: ignore[arg-type]
    t0 = time.monotonic()
    ctl.look()
    took = time.monotonic() - t0
    st = client.last(f"team-a/{name}")
    assert (st["state"], st["cachedBytes"], st["totalBytes"], st["files"]) == (
        "ready",
        size,
        size,
        len(objs),
    ), st["reason"]
    assert st["path"] == f"{dc.ROOT}/team-a/{name}"
    if copies == 2:  # 2 copies of 1.5 servers' worth: all 4 hold chunks (1 copy: the master may skip one)
        assert sorted(st["servers"]) == sorted(v.address for v in cluster.servers), st["servers"]
    assert sum(st["servers"].values()) == size * copies
    # a volume's size limit is soft: writes the master assigned before it heard the volume was full
    # land past it (seen: one 4 MiB file over on one server of four, in one run of two), so a
    # server holds at most a file per volume slot over its nominal capacity
    slack = cluster.max_volumes * shard
    assert all(0 < b <= cluster.capacity + slack for b in st["servers"].values()), st["servers"]
    print(f"cached {size} B x {copies} in {took:.1f} s: {st['servers']}")
    _read_all(cluster, name, objs)

    lost = cluster.kill_volume(0)
    if copies > 1:
        _read_all(cluster, name, objs)  # the replicas serve (1 copy: the filer answers 500 until repaired)
    ctl.look()  # the lost chunks are fetched again (1 copy) or stay short of a copy (2)
    st = client.last(f"team-a/{name}")
    assert lost.address not in st["servers"]
    assert st["cachedBytes"] == size
    assert st["state"] == ("degraded" if copies == 2 else "ready"), st
    if copies == 1:
        assert sum(st["servers"].values()) == size
    _read_all(cluster, name, objs)


def test_an_empty_or_missing_source_fails_clearly(s3: Any, weed_cluster: Any) -> None:
    empty = f"{s3.bucket}/nothing-{secrets.token_hex(4)}"
    gone = f"gone-{secrets.token_hex(4)}/x"
    client = StubClient(
        [_dataset(s3, empty, "empty", 2), _dataset(s3, gone, "gone", 2)],
        {"AWS_ACCESS_KEY_ID": s3.key, "AWS_SECRET_ACCESS_KEY": s3.secret},
    )
    dc.DistCache(client, dc.Weed(weed_cluster.master, weed_cluster.filer)).look()  # type: ignore[arg-type]
    e, g = client.last("team-a/empty"), client.last("team-a/gone")
    assert (e["state"], e["cachedBytes"]) == ("failed", 0)
    assert e["reason"] == f"no objects under s3://{empty}"
    assert (g["state"], g["cachedBytes"]) == ("failed", 0)
    assert f"s3://{gone}" in g["reason"], g["reason"]


def test_a_fetch_that_failed_is_retried_after_the_pause_not_at_every_look(s3: Any) -> None:
    """A cache too small for the dataset: the fetch fails, and the next look leaves it alone for
    RETRY_S (it used to read the missing files through the filer again every look, 2 s apart)."""
    from phalanx.node.objectstore import Unavailable
    from phalanx.node.weedcluster import WeedCluster

    try:
        small = WeedCluster(volumes=1, max_volumes=1, volume_mb=8).start()
    except Unavailable as e:
        pytest.skip(f"no SeaweedFS: {e}")
    try:
        prefix = f"{s3.bucket}/toobig-{secrets.token_hex(4)}"
        fs = s3.filesystem()
        for i in range(4):  # 16 MiB for a cache of 8
            fs.pipe_file(f"{prefix}/f{i}", os.urandom(4 << 20))
        client = StubClient(
            [_dataset(s3, prefix, "toobig", 1)],
            {"AWS_ACCESS_KEY_ID": s3.key, "AWS_SECRET_ACCESS_KEY": s3.secret},
        )
        cache = dc.DistCache(client, dc.Weed(small.master, small.filer))  # type: ignore[arg-type]
        cache.look()
        first = client.last("team-a/toobig")
        assert first["state"] == "failed", first
        said = len(client.statuses["team-a/toobig"])
        cache.look()
        assert len(client.statuses["team-a/toobig"]) == said, client.statuses["team-a/toobig"][said:]
        cache.failed["team-a/toobig"] -= dc.RETRY_S  # the pause over
        cache.look()
        assert len(client.statuses["team-a/toobig"]) > said
    finally:
        small.stop()
