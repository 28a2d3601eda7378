"""Malformed input at scale: hypothesis breaks a Node, a Pod, a PodGroup, a Queue, a ResourceSlice
and a ResourceClaim (tests/hostile.py) beside a good cluster, and the adapter's read path
(build_world, as from the watch cache) and a cycle run over them. No exception escapes; each bad
object is either taken in or named in one problem line; the good pods are all placed.

A few hundred examples here; `PHALANX_HOSTILE_EXAMPLES=10000` for the long run (docs/benchmarks.md).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile
from dra_kube import device_classes
from kube_objects import node, pod, pod_group, queue
from phalanx.core.cycle import run_cycle
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.claims import DraObjects
from phalanx.k8s.read.contain import label
from phalanx.k8s.read.world import build_world
from phalanx.profiles import load_profile

EXAMPLES = int(os.environ.get("PHALANX_HOSTILE_EXAMPLES", "300"))
CFG = AdapterConfig()
PROFILE = load_profile("phalanx-queues")
GOOD_PODS = [f"default/good-{k}" for k in range(4)] + [f"default/good-g-{k}" for k in range(2)]


def _good() -> dict[str, list[dict[str, Any]]]:
    nodes = [node(f"good-{k}", gpus=8, labels={"topology.phalanx.io/rack": "r1"}) for k in range(2)]
    pods = [pod(f"good-{k}", gpus=1) for k in range(4)]
    pods += [pod(f"good-g-{k}", gpus=2, annotations={"phalanx.io/pod-group": "good-g"}) for k in range(2)]
    for o in (*nodes, *pods):
        o["metadata"] |= {"uid": f"uid-{o['metadata']['name']}", "resourceVersion": "1"}
    return {
        "nodes": nodes,
        "pods": pods,
        "groups": [pod_group("good-g", 2)],
        "queues": [queue("default", 16)],
    }


def _bad_sets(draw: st.DrawFn) -> tuple[dict[str, dict[str, Any]], list[str]]:
    objs = hostile.good_objects(0)
    done: list[str] = []
    for kind in list(objs):
        if draw(st.booleans()):
            objs[kind], what = draw(hostile.broken(objs[kind]))
            done += [f"{kind}: {w}" for w in what]
    return objs, done


@st.composite
def worlds(draw: st.DrawFn) -> tuple[dict[str, dict[str, Any]], list[str]]:
    return _bad_sets(draw)


def _where(w: Any, kind: str, obj: dict[str, Any]) -> bool:
    """Whether the world took this object in (it then needs no problem line)."""
    meta = obj.get("metadata") or {}
    name, ns = meta.get("name", ""), meta.get("namespace", "")
    if kind == "Node":
        return name in {n.name for n in w.snapshot.nodes}
    if kind == "Pod":
        spec = obj.get("spec")
        if not isinstance(spec, dict) or spec.get("schedulerName") != CFG.scheduler_name:
            return True  # not recognisably ours: another scheduler's pod, nobody to tell
        key = f"{ns}/{name}"
        return key in w.pods or any(key in {p.key for p in g.pods} for g in w.groups.values())
    return True  # the others are read into what they shape (queues, devices, claims): problems only


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 1000,  # CI: the same examples every run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(worlds())
def test_hostile_objects_are_named_once_and_the_good_ones_still_scheduled(
    case: tuple[dict[str, dict[str, Any]], list[str]],
) -> None:
    bad, done = case
    good = _good()
    dra = DraObjects(device_classes(), [bad["ResourceSlice"]], [bad["ResourceClaim"]])
    w = build_world(
        [*good["nodes"], bad["Node"]],
        [*good["pods"], bad["Pod"]],
        [*good["groups"], bad["PodGroup"]],
        [*good["queues"], bad["Queue"]],
        CFG,
        now=1.8e9,
        dra=dra,
    )
    result = run_cycle(w.snapshot, PROFILE, 1.8e9, np.random.default_rng(0))
    bound = {b.task for b in result.binds}
    assert set(GOOD_PODS) <= bound, (done, sorted(bound), w.problems, w.blocked)
    for lab, msg in w.problems.items():
        assert "good-" not in lab, (done, lab, msg)
        assert "\n" not in msg and msg.startswith(lab), (done, lab, msg)
    for kind, obj in bad.items():
        lab = label(kind, obj)
        if not _where(w, kind, obj):
            named = [m for m in w.problems.values() if m.startswith(lab)]
            assert len(named) == 1 or (kind == "Pod" and w.blocked), (done, kind, w.problems, w.blocked)
