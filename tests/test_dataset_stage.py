"""Staging datasets from a real S3 server (SeaweedFS on loopback) and a plain HTTP server.

No mocked client: every byte comes over the network from a real server, and the faults are
real ones (a wrong key, a missing bucket, an object deleted after it was listed, a corrupt
partial file left by a crash)."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

import pytest

from phalanx.node import stager
from phalanx.node.cachestore import MANIFEST, CacheStore


def _md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes(), usedforsecurity=False).hexdigest()


@pytest.fixture
def bucket(s3):
    """A fresh prefix in the server's bucket with a few objects: (fs, prefix, {rel: bytes})."""
    fs = s3.filesystem()
    prefix = f"{s3.bucket}/t-{secrets.token_hex(4)}"
    objs = {f"shard-{i:02d}.tar": os.urandom(300_000 + i * 7_919) for i in range(12)}
    objs["meta/labels.json"] = b'{"classes": 1000}'
    objs["meta/empty"] = b""
    for rel, data in objs.items():
        fs.pipe_file(f"{prefix}/{rel}", data)
    yield fs, prefix, objs
    fs.rm(prefix, recursive=True)


def test_stage_from_s3_is_complete_and_verified(bucket, tmp_path: Path) -> None:
    fs, prefix, objs = bucket
    files = stager.list_source(fs, prefix, "", f"s3://{prefix}")
    assert sorted(f.rel for f in files) == sorted(objs)
    assert all(len(f.etag) == 32 for f in files if f.size)  # single-part uploads: the ETag is an MD5
    folder = tmp_path / "staging"
    seen: list[int] = []
    p = stager.stage(
        fs, files, folder, workers=4, report=lambda pr: seen.append(pr.done_bytes), checksum=True
    )
    assert p.done_files == len(objs) and p.done_bytes == sum(len(v) for v in objs.values())
    for rel, data in objs.items():
        assert (folder / rel).read_bytes() == data
    assert not list(folder.rglob("*.part"))
    assert seen and seen[-1] == p.done_bytes
    assert stager.changed(files, stager.list_source(fs, prefix, "", "x")) == []


def test_include_pattern_selects_files(bucket) -> None:
    fs, prefix, _ = bucket
    files = stager.list_source(fs, prefix, "shard-0*.tar", "s3://x")
    assert sorted(f.rel for f in files) == [f"shard-{i:02d}.tar" for i in range(10)]
    with pytest.raises(stager.StageError, match=r"no objects under s3://x match 'nothing\*'"):
        stager.list_source(fs, prefix, "nothing*", "s3://x")


def test_resume_keeps_verified_files_and_the_partial_tail(bucket, tmp_path: Path) -> None:
    fs, prefix, objs = bucket
    files = stager.list_source(fs, prefix, "", "s3://x")
    folder = tmp_path / "staging"
    done = files[0]
    (folder / done.rel).parent.mkdir(parents=True, exist_ok=True)
    (folder / done.rel).write_bytes(objs[done.rel])  # verified by the run that crashed
    half = next(f for f in files if f.size > 100_000 and f is not done)
    (folder / (half.rel + ".part")).write_bytes(objs[half.rel][: half.size // 2])
    p = stager.stage(fs, files, folder, workers=4, checksum=True)
    total = sum(f.size for f in files)
    assert p.fetched == total - done.size - half.size // 2  # nothing fetched twice
    for rel, data in objs.items():
        assert _md5(folder / rel) == hashlib.md5(data, usedforsecurity=False).hexdigest()


def test_corrupt_partial_file_fails_the_checksum_and_is_dropped(bucket, tmp_path: Path) -> None:
    fs, prefix, objs = bucket
    files = stager.list_source(fs, prefix, "shard-03.tar", "s3://x")
    folder = tmp_path / "staging"
    folder.mkdir()
    f = files[0]
    (folder / (f.rel + ".part")).write_bytes(b"\0" * 1000)  # a disk error left garbage behind
    with pytest.raises(
        stager.StageError, match=r"shard-03.tar: checksum mismatch \(MD5 [0-9a-f]{32}, source ETag"
    ):
        stager.stage(fs, files, folder, workers=2, checksum=True)
    assert not (folder / f.rel).exists() and not (folder / (f.rel + ".part")).exists()
    stager.stage(fs, files, folder, workers=2, checksum=True)  # the next try starts clean
    assert (folder / f.rel).read_bytes() == objs[f.rel]


def test_object_deleted_after_listing(bucket, tmp_path: Path) -> None:
    fs, prefix, _ = bucket
    files = stager.list_source(fs, prefix, "", "s3://x")
    fs.rm(f"{prefix}/shard-05.tar")
    with pytest.raises(stager.StageError, match=r"shard-05.tar is gone from the source \(it was listed\)"):
        stager.stage(fs, files, tmp_path / "s", workers=1)
    assert not (tmp_path / "s" / "shard-05.tar").exists()


def test_changed_object_is_seen_by_the_second_listing(bucket) -> None:
    fs, prefix, _ = bucket
    before = stager.list_source(fs, prefix, "", "s3://x")
    fs.pipe_file(f"{prefix}/shard-01.tar", b"new contents")
    assert stager.changed(before, stager.list_source(fs, prefix, "", "s3://x")) == ["shard-01.tar"]


def test_bad_credentials_and_missing_bucket_are_named(s3) -> None:
    import s3fs

    bad = s3fs.S3FileSystem(key=s3.key, secret="wrong", endpoint_url=s3.endpoint, skip_instance_cache=True)
    with pytest.raises(stager.StageError, match=r"access to s3://data/x denied .*check the credentials"):
        stager.list_source(bad, f"{s3.bucket}/x", "", "s3://data/x")
    with pytest.raises(stager.StageError, match=r"source s3://nobucket/x not found"):
        stager.list_source(s3.filesystem(), "nobucket/x", "", "s3://nobucket/x")


def test_stage_from_plain_http(http_source, tmp_path: Path) -> None:
    import fsspec

    root, url = http_source
    (root / "ds" / "sub").mkdir(parents=True)
    data = {"a.bin": os.urandom(200_000), "sub/b.bin": os.urandom(50_000)}
    for rel, blob in data.items():
        (root / "ds" / rel).write_bytes(blob)
    fs, path = fsspec.core.url_to_fs(f"{url}/ds/")
    files = stager.list_source(fs, path, "", f"{url}/ds/")
    assert sorted((f.rel, f.size) for f in files) == sorted((k, len(v)) for k, v in data.items())
    stager.stage(fs, files, tmp_path / "s", workers=2)
    for rel, blob in data.items():
        assert (tmp_path / "s" / rel).read_bytes() == blob


def test_store_promotes_atomically_and_evicts_least_recently_used(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "cache", capacity=1000)
    for key, size, used in (("ns/a", 300, 10.0), ("ns/b", 300, 5.0), ("ns/c", 300, 20.0)):
        d = store.staging_dir(key)
        d.mkdir(parents=True)
        (d / "x").write_bytes(b"1" * size)
        (d / MANIFEST).write_text("{}")
        assert not store.ready_dir(key).exists()
        store.promote(key, "s3://b/" + key)
        store.touch([key], used)
        assert (store.ready_dir(key) / "x").stat().st_size == size
        assert not (store.ready_dir(key) / MANIFEST).exists()
    assert store.used() == 900
    assert store.victims(400, keep={"ns/b"}) == ["ns/a"]  # b is in use; a is older than c
    assert store.victims(400, keep=set()) == ["ns/b"]
    assert store.victims(1001, keep=set()) is None
    assert store.victims(800, keep={"ns/a", "ns/c"}) is None
    store.evict("ns/b")
    assert not store.ready_dir("ns/b").exists() and store.ready() == {"ns/a": 300, "ns/c": 300}
    again = CacheStore(tmp_path / "cache", capacity=1000)  # a restarted agent reads the same state
    assert again.ready() == {"ns/a": 300, "ns/c": 300} and again.index["ns/a"].last_used == 10.0
