"""A gang's pods seen before its PodGroup (separate watches): the PodGroup is read directly before
the pods are placed, so they are never taken for a gang of the pods present (found on a CI-like run:
a gang member evicted one victim for "a gang of one"; docs/kubernetes.md)."""

from __future__ import annotations

import time

import pytest

from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod, pod_group
from phalanx.k8s.client.kinds import OUR_POD_GROUPS

pytestmark = pytest.mark.e2e


def test_a_podgroup_its_watch_has_not_delivered_is_read_before_its_pods_are_placed(kube: Kube) -> None:
    kube.api.create("nodes", node("n0", gpus=8))
    kube.create(pod_group("g", 3))
    key = OUR_POD_GROUPS.key
    with running(kube) as s:
        # cached with the status the scheduler writes on it first: taken out before that write came
        # back on the watch, the PodGroup would be put back by it, not looked up (a CI-like run
        # under load: found == 0)
        cached = wait_for(
            "the PodGroup cached with its first status",
            lambda: (
                (o := s.store.get(key, "default/g")) is not None
                and (o.get("status") or {}).get("phase")
                and o
            ),
        )
        s.explainer.flush()
        s.store.apply(key, "DELETED", cached)  # as if its watch were behind the pods' watch
        for k in range(2):
            kube.create(pod(f"g-{k}", gpus=2, annotations={"phalanx.io/pod-group": "g"}))
        wait_for(
            "told it waits for its third pod",
            lambda: any("1 more pod" in m for _, m in kube.events("g-0")),
            timeout=20,
        )
        time.sleep(0.5)
        assert not kube.node_of("g-0") and not kube.node_of("g-1")  # not a gang of the 2 present
        assert s.lookup.found == 1 and s.store.get(key, "default/g") is not None
        kube.create(pod("g-2", gpus=2, annotations={"phalanx.io/pod-group": "g"}))
        wait_for("all three bound", lambda: all(kube.node_of(f"g-{k}") for k in range(3)))


def test_a_group_with_no_podgroup_is_looked_up_once_and_stays_the_pods_present(kube: Kube) -> None:
    kube.api.create("nodes", node("n0", gpus=8))
    with running(kube) as s:
        for k in range(2):
            kube.create(pod(f"h-{k}", gpus=2, annotations={"phalanx.io/pod-group": "h"}))
        wait_for("both bound", lambda: all(kube.node_of(f"h-{k}") for k in range(2)))
        assert ("default", "h") in s.lookup.done and s.lookup.found == 0
