"""The twin places by the distributed cache as the Kubernetes driver does: the cache group's members
carry the driver's label and run the mount, a job reading a dataset is a pod with the cache's
mount, and the core is told the bytes each member holds. The same core filter, score and gang
planner then decide; the driver's reader fed the equivalent Nodes, Dataset and pods decides alike.

Nodes of 4 GPUs, gangs of 4-GPU tasks; racks r1 (sorts first) and r2.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from builders import make_node
from kube_objects import node as kube_node
from kube_objects import pod, pod_group
from phalanx.core.cycle import run_cycle
from phalanx.core.errors import SpecError
from phalanx.core.model import Node
from phalanx.core.snapshot import Snapshot
from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.nodes import parse_node
from phalanx.k8s.read.world import build_world
from phalanx.plugins.locality import facts, set_distcache_bytes
from phalanx.profiles import load_profile
from phalanx.sim.datacache import DataCache, dataset_sizes
from phalanx.sim.distcache import MOUNT_LABEL, with_mount
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import ReplayResult, replay
from phalanx.sim.runtime import default_runtime

DS = "team-a/laion"
GB = 10**9
CFG = AdapterConfig()


def cluster(racks: dict[str, list[str]], labels: dict[str, dict[str, str]] | None = None) -> list[Node]:
    labels = labels or {}
    out = []
    for rack, names in racks.items():
        for n in names:
            b = make_node(n).cpu(64).memory("512Gi").gpus(4).rack(rack, "s0")
            for k, v in labels.get(n, {}).items():
                b = b.label(k, v)
            out.append(b.build())
    return out


def gang(name: str, submit: float, ds: str = DS, tasks: int = 2, gb: float = 40.0) -> JobSpec:
    return JobSpec(name, submit, 100.0, 4 * tasks, tasks=tasks, dataset=ds, dataset_bytes=int(gb * GB))


def run(nodes: list[Node], jobs: list[JobSpec], mode: str, group: str = "all") -> tuple[ReplayResult, str]:
    spec = default_runtime()
    spec.io.distributed.group = group
    sizes = dataset_sizes(jobs, spec.io)
    log = io.StringIO()
    res = replay(
        nodes,
        jobs,
        load_profile("phalanx"),
        topology_levels=[level for level, _ in CFG.levels],  # as the driver's snapshot has them
        datasets={k: int(v) for k, v in sizes.items()},
        data_cache=DataCache(spec.io, sizes, mode),
        log=log,
    )
    return res, log.getvalue()


def placed(log: str, workload: str) -> set[str]:
    """The nodes `workload`'s tasks were bound to, over the replay."""
    binds = (json.loads(line) for line in log.splitlines())
    return {str(d["node"]) for d in binds if d["kind"] == "bind" and d["workload"] == workload}


def test_a_reader_goes_only_to_the_members_a_job_without_a_dataset_anywhere() -> None:
    # r1 sorts first and is as good: without placement by the cache the reader went there
    nodes = cluster({"r1": ["a", "b"], "r2": ["c", "d"]}, {"c": {"cache": "nvme"}, "d": {"cache": "nvme"}})
    plain = JobSpec("plain", 1, 100.0, 8, tasks=2)  # after the reader: r1 is free for it
    _, log = run(nodes, [gang("reader", 0), plain], "distributed", group="cache=nvme")
    assert placed(log, "reader") == {"c", "d"}
    assert placed(log, "plain") == {"a", "b"}
    # the per-node copies are placed as before
    _, log = run(nodes, [gang("reader", 0)], "first-use")
    assert placed(log, "reader") == {"a", "b"}


def test_a_reader_waits_for_a_member_and_is_told_why() -> None:
    nodes = cluster({"r1": ["a", "b"], "r2": ["c"]}, {"c": {"cache": "nvme"}})
    hold = JobSpec("hold", 0, 1_000.0, 4, dataset=DS, dataset_bytes=40 * GB)
    res, log = run(nodes, [hold, gang("late", 10, tasks=1)], "distributed", group="cache=nvme")
    late = next(j for j in res.jobs if j.spec.name == "late")
    assert placed(log, "late") == {"c"} and late.start is not None and late.start >= 1_000.0
    told = [json.loads(line) for line in log.splitlines() if '"pending"' in line and '"late"' in line]
    assert told and "no room on the 1 node(s) that run its mount" in json.dumps(told[0])


def test_stripes_spread_evenly_leave_the_gang_to_tight_packing() -> None:
    # group: every node; the first reader's fetch stripes the dataset evenly over the 5 members,
    # 3/5 of it in r2 for its 3 members: as much per member in either rack, so no rack is nearer
    # the data and the gang packs as the topology planner packs it, into r1 (the tighter, 2 nodes).
    # Ordering by bytes here cost 7-8 % of the average JCT on the Gavel replay.
    nodes = cluster({"r1": ["a", "b"], "r2": ["c", "d", "e"]})
    first = JobSpec("first", 0, 10.0, 1, dataset=DS, dataset_bytes=40 * GB)
    res, log = run(nodes, [first, gang("g", 10_000)], "distributed")
    assert placed(log, "g") == {"a", "b"}
    assert res.data is not None and res.data.group is not None
    assert res.data.group.bytes_per_node(DS, 5) == [8 * GB] * 5
    # the same as a gang on a dataset nothing holds yet, and with per-node copies
    _, log = run(nodes, [first, gang("g", 10_000, ds="team-a/other")], "distributed")
    assert placed(log, "g") == {"a", "b"}
    _, log = run(nodes, [first, gang("g", 10_000)], "first-use")
    assert placed(log, "g") == {"a", "b"}


def test_members_carry_the_drivers_label_and_a_stray_label_is_refused() -> None:
    assert MOUNT_LABEL == keys.DISTCACHE_NODE
    nodes = cluster({"r1": ["a", "b"]}, {"b": {"cache": "nvme"}})
    a, b = with_mount(nodes, "cache=nvme")
    assert not a.distcache_mount and MOUNT_LABEL not in a.labels
    assert b.distcache_mount and b.labels[MOUNT_LABEL] == "true" and b.labels["cache"] == "nvme"
    stray = cluster({"r1": ["a", "b"]}, {"a": {MOUNT_LABEL: "true"}, "b": {"cache": "nvme"}})
    with pytest.raises(SpecError, match=r"node a is labelled phalanx.io/distcache=true but is not in"):
        with_mount(stray, "cache=nvme")
    # named by the label itself, the group is the labelled nodes
    assert [n.distcache_mount for n in with_mount(stray, f"{MOUNT_LABEL}=true")] == [True, False]


def test_bytes_set_by_a_driver_are_checked_and_replace_the_nodes() -> None:
    s = Snapshot(cluster({"r1": ["a"], "r2": ["b"]}))
    with pytest.raises(
        SpecError, match=r"distributed cache bytes of dataset 'x': expected one number per node"
    ):
        set_distcache_bytes(s, "x", [1.0])
    with pytest.raises(SpecError, match=r"bytes must be finite and >= 0"):
        set_distcache_bytes(s, "x", [1.0, -1.0])
    set_distcache_bytes(s, "x", [0.0, 3.0])
    # rack and spine shares: b's rack holds all of it, the spine both share holds all of it
    assert facts(s).near("x").tolist() == [0.5, 1.0]
    set_distcache_bytes(s, "x", [3.0, 0.0])  # moved: the score follows
    assert facts(s).near("x").tolist() == [1.0, 0.5]


# ---------------------------------------------------------------------------- parity with the driver


def kube_nodes(racks: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Cache nodes as the driver reads them: the label, a rack, and an address."""
    out = []
    for rack, names in racks.items():
        for n in names:
            labels = {
                keys.DISTCACHE_NODE: "true",
                "topology.phalanx.io/rack": rack,
                "topology.phalanx.io/spine": "s0",
            }
            obj = kube_node(n, gpus=4, labels=labels)
            obj["status"]["addresses"] = [{"type": "InternalIP", "address": f"10.0.0.{len(out) + 1}"}]
            out.append(obj)
    return out


def reader(name: str, group: str) -> dict[str, Any]:
    """A pod reading Dataset team-a/laion as the webhook leaves it: the cache's volume."""
    p = pod(name, ns="team-a", gpus=4, annotations={keys.DATASET: "laion", keys.POD_GROUP: group})
    p["spec"]["volumes"] = [
        {"name": keys.DISTCACHE_VOLUME, "hostPath": {"path": "/var/lib/phalanx/distcache/fs/team-a/laion"}}
    ]
    return p


def test_the_twin_and_the_driver_see_the_same_and_place_alike() -> None:
    racks = {"r1": ["a", "b"], "r2": ["c", "d", "e"]}
    objs = kube_nodes(racks)
    # the twin replays the same Nodes (as the driver parses them, less the label: the group adds it)
    bare = [
        replace(
            n, labels={k: v for k, v in n.labels.items() if k != keys.DISTCACHE_NODE}, distcache_mount=False
        )
        for n in (parse_node(o, CFG) for o in objs)
    ]
    first = JobSpec("first", 0, 10.0, 1, dataset=DS, dataset_bytes=40 * GB)
    res, log = run(bare, [first, gang("g", 10_000)], "distributed")
    twin = placed(log, "g")
    assert res.data is not None and res.data.group is not None
    held = res.data.group.bytes_per_node(DS, len(objs))
    # the driver: a Dataset whose status says the same bytes per volume server, and the gang's pods
    ips = {o["metadata"]["name"]: o["status"]["addresses"][0]["address"] for o in objs}
    names = sorted(ips)
    dataset = {
        "apiVersion": f"{keys.GROUP}/{keys.VERSION}",
        "kind": "Dataset",
        "metadata": {"name": "laion", "namespace": "team-a"},
        "spec": {"source": "s3://b/laion", "cache": "distributed"},
        "status": {
            "distributed": {
                "state": "ready",
                "servers": {f"{ips[n]}:8080": held[i] for i, n in enumerate(names)},
            }
        },
    }
    w = build_world(
        objs,
        [reader("g-0", "g"), reader("g-1", "g")],
        [pod_group("g", 2, ns="team-a")],
        [],
        CFG,
        0.0,
        datasets=[dataset],
    )
    s = w.snapshot
    # the same inputs: mount, bytes per node, the request's flag
    twin_nodes = with_mount(bare, "all")
    assert [n.distcache_mount for n in s.nodes] == [n.distcache_mount for n in twin_nodes]
    assert [n.distcache_bytes.get(DS, 0) for n in s.nodes] == held
    assert np.array_equal(facts(s).held(DS), np.array(held, dtype=np.float64))
    (entry,) = s.workloads.values()
    assert all(ps.request.dataset == DS and ps.request.dataset_distributed for ps in entry.workload.podsets)
    # the same placement
    result = run_cycle(s, load_profile("phalanx"), 0.0, np.random.default_rng(0))
    assert {b.node for b in result.binds} == twin
    assert len(twin) == 2
