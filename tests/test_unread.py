"""What no cycle reads is left out of the watch cache (managedFields, last-applied-configuration,
containers' command, args and environment), and nothing a cycle reads is lost with it."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from cluster_events import NOW, Cluster
from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod
from phalanx.core.snapshot_diff import differences
from phalanx.k8s.client.cache import Store
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.translations import Translations
from phalanx.k8s.read.unread import unread_left_out
from phalanx.k8s.read.world import build_world

NOTE = "kubectl.kubernetes.io/last-applied-configuration"


def _as_served(obj: dict) -> dict:
    """The object with what an API server and kubectl add that no cycle reads."""
    obj["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:x": {}}}]
    obj["metadata"].setdefault("annotations", {})[NOTE] = '{"huge": "json"}'
    for c in (obj.get("spec") or {}).get("containers") or []:
        c.update(command=["python", "train.py"], args=["--lr=1"], env=[{"name": "TOKEN", "value": "secret"}])
    return obj


def test_the_world_from_the_slimmed_objects_is_the_world_from_the_whole_ones() -> None:
    rng = random.Random(3)
    c = Cluster(rng, nodes=6, queues=True)
    for _ in range(60):
        c.event()
    full = [_as_served(o) for o in copy.deepcopy(c.pods)]
    nodes = [_as_served(o) for o in copy.deepcopy(c.nodes)]
    store = Store(transform=unread_left_out)
    store.replace("pods", copy.deepcopy(full))
    store.replace("nodes", copy.deepcopy(nodes))
    slim = store.items("pods")
    assert all(
        "managedFields" not in p["metadata"] and NOTE not in p["metadata"]["annotations"] for p in slim
    )
    assert all("env" not in ct and "command" not in ct for p in slim for ct in p["spec"]["containers"])
    cfg = AdapterConfig()
    a = build_world(nodes, full, [], c.queues, cfg, NOW, Translations())
    b = build_world(store.items("nodes"), slim, [], c.queues, cfg, NOW, Translations())
    assert not differences(a.snapshot, b.snapshot)
    assert a.pods.keys() == b.pods.keys() and a.blocked == b.blocked and a.problems == b.problems
    assert [p.request for p in a.pods.values()] == [p.request for p in b.pods.values()]


@pytest.mark.e2e
def test_the_schedulers_cache_holds_no_managed_fields_on_a_real_api_server(kube: Kube) -> None:
    kube.api.create("nodes", node("n0", gpus=8))
    p = pod("slim", gpus=1)
    p["spec"]["containers"][0]["env"] = [{"name": "TOKEN", "value": "secret"}]
    kube.create(p)
    assert kube.api.get_pod("default", "slim")["metadata"].get("managedFields")  # the server adds them
    with running(kube) as s:
        wait_for("the pod bound", lambda: kube.node_of("slim") == "n0", timeout=30)

        def bound_in_cache() -> dict[str, Any] | None:
            """The scheduler's cached pod once its watch has brought the bind (the API server shows
            it first: read at once, the cache can still hold the pod unbound, as a CI-like run did)."""
            got = s.store.get("pods", "default/slim")
            return got if got is not None and got["spec"].get("nodeName") == "n0" else None

        cached = wait_for("the bind in the scheduler's cache", bound_in_cache, timeout=10)
        assert "managedFields" not in cached["metadata"] and "env" not in cached["spec"]["containers"][0]
