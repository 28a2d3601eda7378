"""The distributed dataset cache on real kubelets: what a pod reads per epoch, and what the source
sends, against reading the source directly and against a per-node copy.

Kit nodes (shared/k8s/node) with the chart (`distcache.enabled`, and `cache.enabled` with the
per-node agent on node b), set up as tests/distcache_kit.py does. Every node is a volume server of
`--max-volumes` x `--volume-mb` MiB (its "NVMe"); the source is an S3 server (SeaweedFS) behind
benchmarks/slowlink.py, one link of `--source-mibs` MiB/s that counts every byte it returns (the
stand-in for a remote object store: slower than the cache, as a WAN or a shared bucket is).

Datasets (random 4 MiB files, in the source once):
- `big`: `--times` x one volume server's capacity, `cache: distributed`, 1 replica, the default
  readiness (`cached`): pods wait until it is cached, then read it through the FUSE mount on node a.
- `small`: a quarter of a server, read three ways: `distributed` with `readiness: readThrough` (the
  pod starts at once and reads what is not cached through the filer), a per-node copy (`cache:
  node`, the agent on node b stages it on first use), and straight from the source (wget of
  presigned URLs, through the link).
- `big` straight from the source too.

Each epoch is a pod of its own (busybox `cat` of every file, timed with /proc/uptime), after the
host drops its page cache (`drop_caches`), so that no epoch reads memory a former one filled. The
bytes the source sent during an epoch are those the link counted between the pod's two uptimes.

    PHALANX_NODEKIT=../shared/k8s/node PHALANX_HELM=... PHALANX_K8S_ASSETS=... \\
        python benchmarks/bench_distcache_nodes.py [--nodes 4] [--times 3] [--source-mibs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from distcache_kit import DistKit, distcache_cluster, kit_root
from nodes_kube import phase
from phalanx.k8s import keys
from slowlink import SlowLink, uptime

NS = "bench"
FILE_MB = 4
MIB = 1 << 20
# each epoch: uptimes before and after, and the bytes read (every file, in one pass)
EPOCH = (
    'cd "$PHALANX_DATASET_DIR" && t0=$(cut -d" " -f1 /proc/uptime) && n=$(cat * | wc -c) '
    '&& t1=$(cut -d" " -f1 /proc/uptime) && echo "epoch $t0 $t1 $n"'
)


def direct(urls: list[str]) -> str:
    """An epoch straight from the source: each file fetched by its presigned URL."""
    gets = " ".join(f"'{u}'" for u in urls)
    return (
        f't0=$(cut -d" " -f1 /proc/uptime) '
        f'&& n=$(for u in {gets}; do wget -q -O - "$u" || exit 1; done | wc -c) '
        '&& t1=$(cut -d" " -f1 /proc/uptime) && echo "epoch $t0 $t1 $n"'
    )


def reader(name: str, node: str, script: str, dataset: str = "") -> dict[str, Any]:
    notes = {keys.DATASET: dataset} if dataset else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": notes},
        "spec": {
            "schedulerName": "phalanx",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "read",
                    "image": "phalanx.local/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
        },
    }


def epoch(
    kit: DistKit, link: SlowLink, name: str, node: str, script: str, dataset: str = ""
) -> dict[str, Any]:
    """One epoch as a pod of its own, after the page cache is dropped; its MiB/s and source bytes."""
    print(f"{time.strftime('%H:%M:%S')} {name}", file=sys.stderr, flush=True)
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    created = uptime()
    kit.k.kube.create(reader(name, node, script, dataset))
    kit.k.wait(
        f"{name} ended", lambda: phase(kit.k.api.get_pod(NS, name) or {}) in ("Succeeded", "Failed"), NS, 600
    )
    out = kit.k.kubectl("logs", "-n", NS, name)
    if phase(kit.k.api.get_pod(NS, name) or {}) != "Succeeded" or "epoch " not in out:
        raise SystemExit(f"{name} failed: {out[-2000:]}")
    f = out.rsplit("epoch ", 1)[1].split()
    t0, t1, n = float(f[0]), float(f[1]), int(f[2])
    return {
        "pod": name,
        "waited_s": round(t0 - created, 1),  # from the pod's creation to its first read
        "read_s": round(t1 - t0, 2),
        "mib": round(n / MIB, 1),
        "mib_s": round(n / MIB / max(t1 - t0, 0.01), 1),
        "source_mib": round(link.bytes_between(t0, t1) / MIB, 1),
        "source_mib_before": round(link.bytes_between(created, t0) / MIB, 1),
    }


def put(kit: DistKit, name: str, files: int) -> None:
    fs = kit.s3.filesystem()
    for i in range(files):
        fs.pipe_file(f"{kit.s3.bucket}/{name}/shard-{i:03d}.tar", os.urandom(FILE_MB * MIB))


def wait_cached(kit: DistKit, link: SlowLink, name: str) -> dict[str, Any]:
    t0 = uptime()
    st = kit.k.wait(
        f"{name} cached",
        lambda: kit.status(name, NS).get("state") == "ready" and kit.status(name, NS),
        NS,
        900,
    )
    t1 = uptime()
    return {
        "cached_s": round(t1 - t0, 1),
        "source_mib": round(link.bytes_between(t0, t1) / MIB, 1),
        "servers_mib": sorted(round(v / MIB, 1) for v in st["servers"].values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--volume-mb", type=int, default=20)
    ap.add_argument("--max-volumes", type=int, default=10)
    ap.add_argument("--times", type=float, default=2.5, help="the big dataset, in volume servers' capacities")
    ap.add_argument("--source-mibs", type=float, default=20.0)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    # a SIGTERM unwinds like an error: the nodes, the control plane and the mounts are taken down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server_mib = a.volume_mb * a.max_volumes
    big_files = int(a.times * server_mib / FILE_MB)
    small_files = max(1, server_mib // 4 // FILE_MB)
    report: dict[str, Any] = {
        "nodes": a.nodes,
        "server_mib": server_mib,
        "big_mib": big_files * FILE_MB,
        "small_mib": small_files * FILE_MB,
        "source_mibs": a.source_mibs,
    }
    cache = {"root": str(kit_root() / "node-cache"), "capacity": f"{server_mib}Mi"}
    values = {"cache": {"enabled": True, **cache, "resources": {"requests": {"cpu": "10m"}}}}
    t_start = time.monotonic()
    with distcache_cluster(a.nodes, a.nodes, a.volume_mb, a.max_volumes, values=values) as kit:
        k = kit.k
        na, nb = k.nodes[0].name, k.nodes[1].name
        # the per-node agent on node b only: its folder is this machine's, shared by every kit node
        k.kubectl("label", "node", nb, "nvidia.com/gpu.present=true")
        k.namespace_ready(NS)
        link = SlowLink(
            k.nodes[0].ip, (k.nodes[0].ip, int(kit.s3.endpoint.rsplit(":", 1)[1])), a.source_mibs * MIB
        )
        put(kit, "big", big_files)
        put(kit, "small", small_files)
        import s3fs

        opts = {**kit.s3.options(), "endpoint_url": link.endpoint}
        via = s3fs.S3FileSystem(**opts, skip_instance_cache=True)
        urls = {
            d: [via.url(p, expires=7200) for p in sorted(via.ls(f"{kit.s3.bucket}/{d}"))]
            for d in ("big", "small")
        }
        rows: dict[str, Any] = {}
        rows["big, from the source"] = [
            epoch(kit, link, f"direct-big-{e}", na, direct(urls["big"])) for e in (1, 2)
        ]
        rows["small, from the source"] = [
            epoch(kit, link, f"direct-small-{e}", na, direct(urls["small"])) for e in (1, 2)
        ]
        kit.dataset("big", NS, endpoint=link.endpoint, replicas=1)
        report["big_caching"] = wait_cached(kit, link, "big")
        rows["big, distributed"] = [epoch(kit, link, f"dist-big-{e}", na, EPOCH, "big") for e in (1, 2, 3)]
        small = f"s3://{kit.s3.bucket}/small"  # one source, two Datasets
        kit.dataset("small-rt", NS, endpoint=link.endpoint, source=small, replicas=1, readiness="readThrough")
        rows["small, distributed readThrough"] = [
            epoch(kit, link, f"rt-small-{e}", na, EPOCH, "small-rt") for e in (1, 2)
        ]
        kit.dataset("small-node", NS, endpoint=link.endpoint, source=small, cache="node")
        rows["small, per-node copy (node b)"] = [
            epoch(kit, link, f"node-small-{e}", nb, EPOCH, "small-node") for e in (1, 2)
        ]
        report["rows"] = rows
        report["source_total_mib"] = round(link.total / MIB, 1)
        link.close()
    report["wall_s"] = round(time.monotonic() - t_start, 1)
    text = json.dumps(report, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
