"""Scheduling shards (issue 35): the shards file, what a shard's watch cache keeps, and its read.

Each shard sees only its pools' nodes, the pods waiting for it and the pods bound to its nodes (a
node that joins is read with the pods already on it); a pod of another shard running on a node of
this one is capacity held there, never a workload of this one. What one
shard cannot place whole (a gang or a queue tree across shards, a pool no shard owns) is said.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kube_objects import node, pod, pod_group, queue
from phalanx.cli.main import app
from phalanx.core.decisions import Bind
from phalanx.core.errors import SpecError
from phalanx.k8s.act.executor import Executor, Outcome, Scene
from phalanx.k8s.client.cache import Store
from phalanx.k8s.client.kinds import OUR_POD_GROUPS, OUR_QUEUES
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.gather import gather
from phalanx.k8s.read.shard import ELSEWHERE, ShardFilter
from phalanx.spec.shards import ShardOf, parse_shards

NOW = 1.8e9
FILE = {
    "shards": [
        {"name": "h100", "pools": ["h100"]},
        {"name": "a100", "pools": ["a100", "a100-spot"]},
        {"name": "rest", "default": True},
    ]
}


def _shard(name: str) -> ShardOf:
    every = parse_shards(FILE, "shards.yaml")
    return ShardOf(every, every.get(name))


def _labelled(obj: dict[str, Any], pool: str, key: str = "phalanx.io/node-pool") -> dict[str, Any]:
    obj["metadata"].setdefault("labels", {})[key] = pool
    return obj


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"shards": [{"name": "a", "pools": ["x"]}, {"name": "b", "pools": ["y", "x"]}]},
         "shards.yaml: shards[1].pools: pool 'x' is in shards 'a' and 'b'"),
        ({"shards": [{"name": "a", "default": True}, {"name": "b", "default": True}]},
         "shards 'a' and 'b' are both default"),
        ({"shards": [{"name": "a", "pools": ["x"]}, {"name": "a", "pools": ["y"]}]}, "'a' is named twice"),
        ({"shards": [{"name": "A_1", "pools": ["x"]}]}, "shards[0].name: 'A_1' is not a DNS label"),
        ({"shards": [{"name": "a"}]}, "shard 'a' owns nothing"),
        ({"shards": [{"name": "a", "pool": ["x"]}]}, "shards[0].pool: unknown field"),
        ({"shards": []}, "lists no shard"),
        ({"labels": [], "shards": [{"name": "a", "pools": ["x"]}]}, "labels: needs at least one"),
    ],
)  # fmt: skip
def test_a_shards_file_that_gives_a_node_two_owners_or_is_malformed_is_refused_naming_where(
    doc: dict[str, Any], said: str
) -> None:
    with pytest.raises(SpecError) as e:
        parse_shards(doc, "shards.yaml")
    assert said in str(e.value)


def test_a_pool_is_read_from_our_label_then_kais_and_owned_by_one_shard() -> None:
    every = parse_shards(FILE, "shards.yaml")
    assert every.pool_of({"kai.scheduler/node-pool": "a100-spot"}) == "a100-spot"
    both = {"phalanx.io/node-pool": "h100", "kai.scheduler/node-pool": "a100"}
    assert every.pool_of(both) == "h100"  # the first label of the file's list wins
    assert every.owner("a100-spot") is every.get("a100")
    assert every.owner("") is every.get("rest")
    assert every.owner("t4") is None
    with pytest.raises(SpecError, match="no shard named 'b200'"):
        every.get("b200")


def test_the_scheduler_refuses_an_overlap_at_start_with_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "shards.yaml"
    bad.write_text("shards:\n  - {name: a, pools: [x]}\n  - {name: b, pools: [x]}\n")
    r = CliRunner().invoke(app, ["scheduler", "--shards", str(bad), "--shard", "a", "--kubeconfig", "/nope"])
    assert r.exit_code == 2, r.output
    assert "pool 'x' is in shards 'a' and 'b'" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["scheduler", "--shard", "a", "--kubeconfig", "/nope"])
    assert r.exit_code == 2 and "give both" in r.output


class Cache:
    """A shard's watch cache: a real Store behind the shard's gate, fed events as an informer does;
    `cluster` is what the API server holds now (a joining node's pods are listed from it)."""

    def __init__(self, shard: str) -> None:
        self.cluster: dict[str, dict[str, Any]] = {}
        self.failing = False
        self.gate = ShardFilter(_shard(shard), "phalanx", pods_on=self.pods_on)
        self.store = Store(gate=self.gate)
        for kind in ("nodes", "pods"):  # listed once, empty, the pods after the nodes
            self.store.replace(kind, [])

    def pods_on(self, node_name: str) -> list[dict[str, Any]]:
        if self.failing:
            raise ConnectionError("connection refused")
        return [copy.deepcopy(p) for p in self.cluster.values() if p["spec"].get("nodeName") == node_name]

    def add(self, kind: str, *objs: dict[str, Any]) -> None:
        for o in objs:
            if kind == "pods":
                self.cluster[o["metadata"]["name"]] = o
            self.store.apply(kind, "ADDED", copy.deepcopy(o))

    def world(self, cfg: AdapterConfig) -> Any:
        return gather(self.store.items, False, cfg, split=self.gate.split()).world(cfg, NOW)


def _names(c: Cache, kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in c.store.items(kind)}


def test_a_shard_keeps_its_nodes_the_pods_waiting_for_it_and_the_pods_on_its_nodes() -> None:
    c = Cache("h100")
    c.add("nodes", _labelled(node("h1", gpus=8), "h100"), _labelled(node("a1", gpus=8), "a100"), node("x1"))
    mine = _labelled(pod("mine", gpus=1), "h100")
    theirs = _labelled(pod("theirs", gpus=1), "a100")
    running_here = _labelled(pod("running-here", gpus=1, node="h1"), "a100")
    running_there = _labelled(pod("running-there", gpus=1, node="a1"), "a100")
    foreign_waiting = pod("foreign-waiting", scheduler="default-scheduler")
    c.add("pods", mine, theirs, running_here, running_there, foreign_waiting)
    assert _names(c, "nodes") == {"h1"}
    assert _names(c, "pods") == {"mine", "running-here"}
    c.store.changed.clear()
    before = c.store.generation
    c.store.apply("pods", "MODIFIED", _labelled(pod("theirs", gpus=1), "a100"))  # never kept: no change
    c.store.apply("pods", "MODIFIED", _labelled(pod("running-there", gpus=2, node="a1"), "a100"))
    assert c.store.changes(before) == {} and not c.store.changed.is_set()
    before = c.store.generation
    c.store.apply("nodes", "MODIFIED", _labelled(node("h1", gpus=8), "a100"))  # relabelled away
    assert c.store.items("nodes") == [] and _names(c, "pods") == {"mine"}  # its pods go with it
    assert c.store.changes(before) == {"nodes": {"h1"}, "pods": {"default/running-here"}}


def test_a_node_that_joins_is_kept_only_with_the_pods_already_on_it() -> None:
    """Relabelled into the shard, a node brings what runs there (listed from the API server), never
    a pod deleted while that list was in flight; a node whose pods cannot be read is not used yet."""
    c = Cache("h100")
    c.add("nodes", _labelled(node("a1", gpus=8), "a100"))
    c.add(
        "pods",
        _labelled(pod("busy", gpus=6, node="a1"), "a100"),
        _labelled(pod("gone", gpus=1, node="a1"), "a100"),
    )
    assert _names(c, "pods") == set()  # on another shard's node: not kept
    c.failing = True
    c.store.apply("nodes", "MODIFIED", _labelled(node("a1", gpus=8), "h100"))
    assert c.store.items("nodes") == [] and c.gate.nodes == set()  # not used before its pods are read
    c.failing = False

    def deleted_while_listed(node_name: str) -> list[dict[str, Any]]:
        listed = c.pods_on(node_name)  # the list's answer still has "gone"; its deletion arrives now
        c.store.apply("pods", "DELETED", copy.deepcopy(c.cluster.pop("gone")))
        return listed

    c.gate.pods_on = deleted_while_listed
    before = c.store.generation
    c.store.apply("nodes", "MODIFIED", _labelled(node("a1", gpus=8), "h100"))
    assert _names(c, "nodes") == {"a1"} and _names(c, "pods") == {"busy"}
    assert c.store.changes(before) == {"nodes": {"a1"}, "pods": {"default/busy"}}
    c.add("pods", _labelled(pod("wants-4", gpus=4), "h100"))
    w = c.world(AdapterConfig(shard=_shard("h100")))
    c0 = w.snapshot.cluster
    assert set(w.snapshot.workloads) == {"default/wants-4"}
    assert int((c0.gpu_milli_free[0, : int(c0.gpu_count[0])] >= 1000).sum()) == 2


def test_the_pods_list_after_the_nodes_and_a_relist_drops_nodes_gone_with_their_pods() -> None:
    c = Cache("h100")
    assert c.gate.lists_after("pods") == "nodes" and c.gate.lists_after("nodes") is None
    c.add("nodes", _labelled(node("h1", gpus=8), "h100"), _labelled(node("h2", gpus=8), "h100"))
    c.add(
        "pods",
        _labelled(pod("on-h1", gpus=1, node="h1"), "h100"),
        _labelled(pod("on-h2", gpus=1, node="h2"), "h100"),
    )
    c.store.replace("nodes", [_labelled(node("h1", gpus=8), "h100")])  # h2 deleted while the watch was down
    assert c.gate.nodes == {"h1"} and _names(c, "pods") == {"on-h1"}


def test_another_shards_pod_on_a_node_of_this_one_holds_capacity_and_is_never_its_workload() -> None:
    """A node relabelled into this shard while another shard's pod still runs there: the pod's GPUs
    count as used, and this shard does not take it for a workload of its own."""
    c = Cache("h100")
    c.add("nodes", _labelled(node("h1", gpus=8), "h100"))
    c.add("pods", _labelled(pod("left-behind", gpus=6, node="h1"), "a100"))
    c.add("pods", _labelled(pod("wants-4", gpus=4), "h100"))
    w = c.world(AdapterConfig(shard=_shard("h100")))
    assert set(w.snapshot.workloads) == {"default/wants-4"}
    c0 = w.snapshot.cluster
    assert int((c0.gpu_milli_free[0, : int(c0.gpu_count[0])] >= 1000).sum()) == 2


def test_the_default_shard_says_why_a_pod_naming_a_pool_no_shard_owns_waits() -> None:
    c = Cache("rest")
    c.add("nodes", node("n1", gpus=8))
    c.add("pods", _labelled(pod("lost", gpus=1), "t4"), pod("plain", gpus=1))
    w = c.world(AdapterConfig(shard=_shard("rest")))
    assert set(w.snapshot.workloads) == {"default/plain"}
    why = w.pod_problems["default/lost"]
    assert "names pool 't4', which no scheduling shard owns" in why and "h100 (h100)" in why
    only = Cache("h100")  # not the default shard: not its to say
    only.add("pods", _labelled(pod("lost", gpus=1), "t4"))
    assert only.store.items("pods") == []


def test_a_gang_whose_pods_name_two_shards_pools_waits_and_says_both() -> None:
    c = Cache("h100")
    c.add("nodes", _labelled(node("h1", gpus=8), "h100"))
    c.add(OUR_POD_GROUPS.key, pod_group("pair", 2))
    gang = {"phalanx.io/pod-group": "pair"}
    before = c.store.generation
    c.add("pods", _labelled(pod("p0", gpus=1, labels=dict(gang)), "h100"))
    c.add("pods", _labelled(pod("p1", gpus=1, labels=dict(gang)), "a100"))
    assert c.store.changes(before) == {"pods": {"default/p0"}, ELSEWHERE: {"default/pair"}}
    w = c.world(AdapterConfig(shard=_shard("h100")))
    (why,) = w.blocked["default/pair"]
    assert "also names pool 'a100' (shard a100)" in why and "one pool" in why
    c.store.apply("pods", "DELETED", _labelled(pod("p1", gpus=1, labels=dict(gang)), "a100"))
    assert c.gate.split() == {}


def test_a_podgroup_naming_another_shards_pool_keeps_its_gang_waiting() -> None:
    c = Cache("h100")
    c.add("nodes", _labelled(node("h1", gpus=8), "h100"))
    c.add(OUR_POD_GROUPS.key, _labelled(pod_group("pair", 1), "a100"))
    c.add("pods", _labelled(pod("p0", gpus=1, labels={"phalanx.io/pod-group": "pair"}), "h100"))
    w = c.world(AdapterConfig(shard=_shard("h100")))
    assert "pool 'a100' (shard a100) on its PodGroup" in w.blocked["default/pair"][0]


def test_a_shard_schedules_its_queues_and_a_tree_split_across_shards_is_refused_naming_both() -> None:
    c = Cache("h100")
    c.add("nodes", _labelled(node("h1", gpus=8), "h100"))
    c.add(
        OUR_QUEUES.key,
        _labelled(queue("research", 8), "a100"),
        _labelled(queue("vision", 8, parent="research"), "h100"),
        _labelled(queue("h100-team", 8), "h100"),
        queue("default", 8),
    )
    notes = {"phalanx.io/queue": "research"}
    c.add("pods", _labelled(pod("elsewhere", gpus=1, annotations=dict(notes)), "h100"))
    c.add("pods", _labelled(pod("split", gpus=1, annotations={"phalanx.io/queue": "vision"}), "h100"))
    c.add("pods", _labelled(pod("ok", gpus=1, annotations={"phalanx.io/queue": "h100-team"}), "h100"))
    w = c.world(AdapterConfig(shard=_shard("h100")))
    assert w.tree is not None and set(w.tree.queues) == {"h100-team", "default"}  # default: always there
    assert "queue 'research' belongs to pool 'a100' (shard a100)" in w.blocked["default/elsewhere"][0]
    assert "its parent 'research' belongs to pool 'a100' (shard a100)" in w.blocked["default/split"][0]
    assert "default/ok" in w.snapshot.workloads


def test_metrics_carry_the_shards_name() -> None:
    from prometheus_client import generate_latest

    from phalanx.k8s.view.server import Metrics

    m = Metrics("h100")
    m.skipped.inc()
    assert 'phalanx_cycles_skipped_total{shard="h100"} 1.0' in generate_latest(m.registry).decode()


class _NoApi:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API was called ({name}) for a gang that must not be bound")


def test_a_gang_placed_on_a_node_that_left_the_shard_is_not_bound() -> None:
    ex = Executor(_NoApi(), workers=1)  # type: ignore[arg-type]
    ex.node_check = lambda n: "" if n == "h1" else f"node {n} is no longer in shard h100"
    out = Outcome()
    binds = [Bind("default/p0", "default/pair", "h1", (0,)), Bind("default/p1", "default/pair", "h2", (0,))]
    ex.bind_gang("default/pair", binds, Scene(), out, write_intent=True)
    ex.close()
    assert out.broken == {"default/pair": "node h2 is no longer in shard h100"} and not out.bound


def test_a_shard_reads_nothing_of_the_pods_running_on_other_shards_nodes() -> None:
    """Neither its cache nor its read keeps them: its memory follows its share of the cluster."""
    from phalanx.k8s.read.translations import Translations

    c = Cache("h100")
    c.add("nodes", _labelled(node("h1", gpus=8), "h100"), _labelled(node("a1", gpus=8), "a100"))
    for name, at, pool in (("here", "h1", "h100"), ("there", "a1", "a100")):
        p = _labelled(pod(name, gpus=1, node=at), pool)
        p["metadata"]["resourceVersion"] = "1"  # translations are kept by version
        c.add("pods", p)
    assert _names(c, "pods") == {"here"}
    cfg = AdapterConfig(shard=_shard("h100"))
    memo = Translations()
    w = gather(c.store.items, False, cfg, split=c.gate.split()).world(cfg, NOW, memo)
    assert set(memo.pods) == {"uid-default-here"} and set(w.snapshot.workloads) == {"default/here"}


def test_the_twin_tries_a_split_on_a_captured_cluster_each_shard_with_its_own_profile(tmp_path: Path) -> None:
    """`phalanx schedule --capture FILE --shards FILE`: what each shard would do with its share. An
    8-GPU pod of pool h100 fits the cluster whole (r1 is free) but not shard h100 (h1 has 6 free)."""
    import json

    from phalanx.k8s.trial import capture as cap

    nodes = [_labelled(node("h1", gpus=8), "h100"), node("r1", gpus=8)]
    pods = [
        pod("running", gpus=2, node="h1", scheduler="default-scheduler"),
        _labelled(pod("big", gpus=8, scheduler="default-scheduler"), "h100"),
        pod("small", gpus=2, scheduler="default-scheduler"),
    ]
    path = tmp_path / "capture.json"
    cap.write(cap.Capture({"nodes": nodes, "pods": pods}, NOW, ["nodes", "pods"]), path)
    split = tmp_path / "shards.yaml"
    split.write_text(
        "shards:\n  - {name: h100, pools: [h100], profile: fgd}\n  - {name: rest, default: true}\n"
    )
    whole = CliRunner().invoke(app, ["schedule", "--capture", str(path), "--json"])
    assert whole.exit_code == 0, whole.output
    assert {b["task"]: b["node"] for b in json.loads(whole.output)["binds"]} == {
        "default/big": "r1",
        "default/small": "h1",
    }
    r = CliRunner().invoke(app, ["schedule", "--capture", str(path), "--shards", str(split), "--json"])
    assert r.exit_code == 0, r.output
    by = {s["shard"]: s for s in json.loads(r.output)["shards"]}
    assert by["h100"]["profile"] == "fgd" and by["rest"]["profile"] == "phalanx"
    assert by["h100"]["binds"] == [] and [p["workload"] for p in by["h100"]["pending"]] == ["default/big"]
    assert {b["task"]: b["node"] for b in by["rest"]["binds"]} == {"default/small": "r1"}
    assert by["h100"]["placed_pods"] == {"default/running": "h1"} and by["rest"]["placed_pods"] == {}
    shown = CliRunner().invoke(
        app, ["schedule", "--capture", str(path), "--shards", str(split)], env={"COLUMNS": "200"}
    )
    assert shown.exit_code == 0 and "Shard h100 (h100)" in shown.output and "Shard rest" in shown.output
    bad = CliRunner().invoke(app, ["schedule", "--shards", str(split)])
    assert bad.exit_code == 2 and "give --capture too" in bad.output


def test_a_shards_list_leaves_out_what_it_does_not_keep_page_by_page() -> None:
    """An informer passes each listed object through `Store.taken` as its page arrives: the list it
    hands the store holds only what the shard keeps (its peak memory follows its share too)."""
    gate = ShardFilter(_shard("h100"), "phalanx")
    store = Store(gate=gate)
    nodes = [_labelled(node("h1", gpus=8), "h100"), _labelled(node("a1", gpus=8), "a100")]
    kept = [o for o in (store.taken("nodes", n) for n in nodes) if o is not None]
    store.replace("nodes", kept, taken=True)
    pods = [_labelled(pod(f"p{k}", gpus=1, node=("h1", "a1")[k % 2]), "x") for k in range(6)]
    kept = [o for o in (store.taken("pods", p) for p in pods) if o is not None]
    assert [o["metadata"]["name"] for o in kept] == ["p0", "p2", "p4"]
    store.replace("pods", kept, taken=True)
    assert _names_of(store, "pods") == {"p0", "p2", "p4"} and _names_of(store, "nodes") == {"h1"}


def _names_of(store: Store, kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in store.items(kind)}
