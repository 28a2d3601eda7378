"""Staging throughput from a loopback S3 server (SeaweedFS) against a plain parallel s3fs copy of
the same objects, in the same run; and reading from the cache against reading a local file
(docs/benchmarks.md section 10).

    python benchmarks/bench_stage.py [--total 2e9] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from phalanx.node import stager
from phalanx.node.cachestore import CacheStore
from phalanx.node.objectstore import S3Server


def _drop(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _read_all(folder: Path) -> int:
    n = 0
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                while buf := f.read(8 << 20):
                    n += len(buf)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", type=float, default=2e9, help="bytes per dataset")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="phalanx-bench-stage-"))
    print(
        "| files | plain s3fs copy (MB/s) | phalanx cache (MB/s) | ratio | with --checksum (MB/s) | ratio |"
    )
    print("|---|---|---|---|---|---|")
    with S3Server() as srv:
        fs = srv.filesystem()
        for count in (1000, 20):
            size = int(args.total // count)
            prefix = f"{srv.bucket}/ds{count}"
            blob = os.urandom(size)
            for i in range(count):
                fs.pipe_file(f"{prefix}/part-{i:04d}.bin", blob[i % 97 :] + blob[: i % 97])
            plain, ours, summed = [], [], []
            for _ in range(args.repeat):
                for which, out in (("plain", plain), ("ours", ours), ("summed", summed)):
                    dest = work / which
                    _drop(dest)
                    f2 = srv.filesystem()  # a fresh client each time: no cached listing or connection
                    t = time.perf_counter()
                    if which == "plain":
                        f2.get(prefix + "/", str(dest) + "/", recursive=True)
                    else:
                        files = stager.list_source(f2, prefix, "", f"s3://{prefix}")
                        stager.stage(f2, files, dest, args.workers, checksum=which == "summed")
                        assert stager.changed(files, stager.list_source(f2, prefix, "", "x")) == []
                    out.append(count * size / (time.perf_counter() - t) / 1e6)
            p, o, s = (statistics.median(x) for x in (plain, ours, summed))
            print(
                f"| {count:,} x {size / 1e6:.0f} MB | {p:.0f} | {o:.0f} | {o / p:.2f} | "
                f"{s:.0f} | {s / p:.2f} |"
            )
            # the read path: a cached copy is a local folder (a hostPath bind mount in the pod)
            store = CacheStore(work / "cache", capacity=int(4 * args.total))
            _drop(store.staging_dir("b/ds"))
            shutil.copytree(work / "ours", store.staging_dir("b/ds"))
            store.promote("b/ds", prefix)
            local = work / "ours"
            reads = {"local": [], "cache": []}
            for _ in range(args.repeat):
                for name, folder in (("local", local), ("cache", store.ready_dir("b/ds"))):
                    t = time.perf_counter()
                    n = _read_all(folder)
                    reads[name].append(n / (time.perf_counter() - t) / 1e6)
            lo, ca = statistics.median(reads["local"]), statistics.median(reads["cache"])
            print(
                f"|   read back (page cache warm): local file {lo:.0f} MB/s, cached copy {ca:.0f} MB/s "
                f"({ca / lo:.2f}) | | | | | |"
            )
            store.evict("b/ds")
            fs.rm(prefix, recursive=True)
    _drop(work)


if __name__ == "__main__":
    main()
