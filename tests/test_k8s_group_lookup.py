"""PodGroups their watch has not delivered are looked up, at most AT_MOST a cycle, none forgotten.

A burst of more groups than one cycle looks up was cut at AT_MOST and the rest were never looked
up: the cache's feed had moved past their pods, so the next look did not see them again.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from phalanx.k8s.client.api import Api
from phalanx.k8s.client.cache import Store
from phalanx.k8s.client.kinds import OUR_POD_GROUPS, PODS
from phalanx.k8s.loop.group_lookup import AT_MOST, GroupLookup
from phalanx.k8s.read.groups import Group
from phalanx.k8s.read.world import World


class FakeApi:
    """Answers every PodGroup get with the PodGroup, and counts the gets."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def get(self, kind: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.asked.append(name)
        meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
        return {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "PodGroup", "metadata": meta}


def _world(store: Store, names: list[str]) -> World:
    """The cycle's groups as the read side makes them: a PodGroup where the cache holds one."""
    groups = {
        f"default/{n}": Group(
            f"default/{n}", "default", [], pod_group=store.get(OUR_POD_GROUPS.key, f"default/{n}")
        )
        for n in names
    }
    return cast(World, SimpleNamespace(groups=groups))


def test_groups_past_one_cycles_share_are_looked_up_in_the_next_cycles() -> None:
    store, api = Store(), FakeApi()
    names = [f"g{k:03d}" for k in range(AT_MOST * 2 + 5)]
    store.replace(PODS.key, [])
    for n in names:  # the pods came; their PodGroups did not (their watch is behind)
        notes = {"phalanx.io/pod-group": n}
        store.apply(
            PODS.key, "ADDED", {"metadata": {"name": f"{n}-0", "namespace": "default", "annotations": notes}}
        )
    lookup = GroupLookup(cast(Api, api), store, lambda: (OUR_POD_GROUPS.key, PODS.key))
    looks = 0
    while lookup.look(_world(store, names)):
        looks += 1
        assert looks <= 3
    assert looks == 3 and sorted(api.asked) == names  # each once, none left out
    assert all(store.get(OUR_POD_GROUPS.key, f"default/{n}") for n in names)
