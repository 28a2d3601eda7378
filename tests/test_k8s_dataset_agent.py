"""A pod that mounts its dataset from the node's cache (the webhook's hostPath volume) goes only to a
node whose dataset cache agent runs (it publishes phalanx.io/cached-datasets): on a node without one
it would wait in FailedMount for a copy nothing makes (found trying it on two real kit nodes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kube_objects import node, pod
from phalanx.core.cycle import run_cycle
from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.world import build_world
from phalanx.profiles import load_profile


def mounting(name: str) -> dict[str, Any]:
    p = pod(name, gpus=1, annotations={keys.DATASET: "cold"})
    path = "/var/lib/phalanx/datasets/ready/default/cold"
    p["spec"]["volumes"] = [{"name": keys.DATASET_VOLUME, "hostPath": {"path": path, "type": "Directory"}}]
    return p


def cycle(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]):
    w = build_world(nodes, pods, [], [], AdapterConfig(), 0.0)
    return run_cycle(w.snapshot, load_profile("phalanx"), 0.0, np.random.default_rng(0))


def test_only_a_node_running_the_agent_takes_it_though_packing_prefers_the_other() -> None:
    fuller = node("b", gpus=8)
    busy = pod("busy", gpus=6, node="b")  # packing prefers b, which runs no agent
    agent = node("a", gpus=8, annotations={keys.CACHED_DATASETS: "{}"})
    (b,) = cycle([agent, fuller], [busy, mounting("p")]).binds
    assert b.node == "a"
    (b,) = cycle([agent, fuller], [busy, pod("plain", gpus=1)]).binds  # a pod without the mount: packed
    assert b.node == "b"


def test_with_no_agent_anywhere_it_waits_and_says_which_node_label_it_needs() -> None:
    r = cycle([node("b", gpus=8)], [mounting("p")])
    assert not r.binds
    (p,) = r.pending
    assert f"node selector ({keys.CACHE_AGENT}=true) or affinity does not match" in p.message, p.message
