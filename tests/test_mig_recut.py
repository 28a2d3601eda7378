"""The node side of dynamic MIG (issue 42): NVML recuts and the agent's answers.

NVML is the fake of tests/fake_nvml.py, with NVML's names and arities (checked against nvidia-ml-py
in test_node_discover); it keeps each GPU's instances and refuses what NVML refuses (an instance
with a compute instance left, overlapping placements, an instance a process runs on).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import fake_nvml
from phalanx.core.errors import SpecError
from phalanx.node import nvml, recut
from phalanx.spec import mig_layout
from phalanx.spec.mig_layout import Answer, Want

A100 = "NVIDIA A100-SXM4-80GB"
SEVEN = [f"1g.10gb@{k}" for k in range(7)]


def _gpu(k: int, instances: list[str], busy: list[str] | None = None) -> dict[str, Any]:
    return {
        "uuid": f"GPU-{k:08d}-0000-0000-0000-000000000000",
        "name": A100,
        "memory_mib": 81920,
        "bus_id": f"0000:{k + 5:02x}:00.0",
        "mig": True,
        "mig_instances": list(instances),
        "mig_busy": list(busy or []),
    }


@pytest.fixture
def nv() -> Iterator[Any]:
    fake_nvml.CALLS.clear()
    fake_nvml.CONFIG = {"gpus": [_gpu(0, ["7g.80gb@0"]), _gpu(1, ["3g.40gb@4"], busy=["3g.40gb@4"])]}
    yield nvml.load("fake_nvml")
    fake_nvml.CONFIG = None


def _info(nv: Any, k: int) -> nvml.GpuInfo:
    return nvml.gpus(nv)[k]


def test_an_idle_gpu_is_cut_compute_instances_first_and_shows_its_new_devices(nv: Any) -> None:
    nvml.recut(nv, _info(nv, 0), SEVEN)
    assert fake_nvml.CALLS[:2] == ["destroy ci 7g.80gb@0", "destroy gi 7g.80gb@0"]
    assert fake_nvml.CALLS[2:4] == ["create gi 1g.10gb@0", "create ci 1g.10gb@0"]
    assert _info(nv, 0).mig_instances == SEVEN
    devices = nvml.mig_devices(nv, _info(nv, 0))
    assert [d.slice for d in devices] == SEVEN
    assert len({d.uuid for d in devices}) == 7 and not any(d.busy for d in devices)


def test_a_gpu_with_a_process_on_an_instance_is_not_touched(nv: Any) -> None:
    with pytest.raises(nvml.MigBusy, match=r"a process runs on 3g\.40gb@4"):
        nvml.recut(nv, _info(nv, 1), SEVEN)
    assert fake_nvml.CALLS == []
    assert _info(nv, 1).mig_instances == ["3g.40gb@4"]


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        (["3g.40gb@0", "4g.40gb@0"], "NVML refused the recut of GPU 0: Insufficient Resources"),
        (["9g.90gb@0"], "'9g.90gb@0' is not a MIG instance"),
        (["1g.10gb@x"], "'1g.10gb@x' is not a MIG instance"),
    ],
)
def test_a_layout_nvml_cannot_make_fails_with_the_reason(nv: Any, layout: list[str], says: str) -> None:
    with pytest.raises(nvml.NvmlUnavailable, match=says.replace(".", r"\.").replace("(", r"\(")):
        nvml.recut(nv, _info(nv, 0), layout)


def _pod(name: str, gpu: str, phase: str = "Running", **notes: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "w", "annotations": {"phalanx.io/gpu-devices": gpu, **notes}},
        "status": {"phase": phase},
    }


def test_holders_are_pods_placed_on_a_slice_or_handed_a_device_that_have_not_ended() -> None:
    pods = [
        _pod("placed", "0", **{"phalanx.io/mig-slice": "1g.10gb@0"}),
        _pod("done", "0", phase="Succeeded", **{"phalanx.io/mig-slice": "1g.10gb@1"}),
        _pod("other-gpu", "1", **{"phalanx.io/mig-slice": "1g.10gb@1"}),
        _pod("handed", "", **{"phalanx.io/gpu-allocated": "MIG-a,MIG-b"}),
        _pod("whole", "0"),
    ]
    assert recut.holders(pods, 0, {"MIG-b"}) == ["w/handed", "w/placed"]
    assert recut.holders(pods, 0, set()) == ["w/placed"]


def test_answers_applied_refused_and_failed(nv: Any) -> None:
    want = Want(layout=SEVEN, at=10.0)
    a = recut.answer(want, _info(nv, 0), nv, [_pod("p", "0", **{"phalanx.io/mig-slice": "7g.80gb@0"})])
    assert (a.state, a.reason, a.at) == ("refused", "in use by pod(s) w/p", 10.0)
    assert _info(nv, 0).mig_instances == ["7g.80gb@0"]
    assert recut.answer(want, _info(nv, 1), nv, []).state == "refused"  # NVML sees a process
    assert recut.answer(want, None, nv, []).state == "failed"
    a = recut.answer(want, _info(nv, 0), nv, [])
    assert a.state == "applied" and _info(nv, 0).mig_instances == SEVEN
    again = recut.answer(want, _info(nv, 0), nv, [])
    assert again.reason == "the GPU already has this layout"


class Nodes:
    """The three calls `recut.look` makes, recorded (the real API server is in test_e2e_mig_recut)."""

    def __init__(self, notes: dict[str, str]) -> None:
        self.notes = notes
        self.events: list[Any] = []

    def get(self, kind: Any, name: str) -> Any:
        return SimpleNamespace(metadata=SimpleNamespace(annotations=dict(self.notes)))

    def list(self, kind: Any, **kw: Any) -> list[Any]:
        return []

    def patch(self, kind: Any, name: str, body: dict[str, Any]) -> None:
        self.notes.update(body["metadata"]["annotations"])

    def create(self, obj: Any) -> None:
        self.events.append(obj)


def test_look_answers_each_request_once_and_says_so_in_an_event(nv: Any) -> None:
    asked = {0: Want(layout=SEVEN, at=5.0), 1: Want(layout=SEVEN, at=5.0)}
    api = Nodes({mig_layout.LAYOUT: mig_layout.dump(asked)})
    given = recut.look(api, "n", nv)  # type: ignore[arg-type]
    assert {g: a.state for g, a in given.items()} == {0: "applied", 1: "refused"}
    status = mig_layout.answers(api.notes[mig_layout.STATUS], "status")
    assert status[0].answers(asked[0]) and status[1].state == "refused"
    assert sorted(e.reason for e in api.events) == ["MigRepartitionRefused", "MigRepartitioned"]
    assert recut.look(api, "n", nv) == {}  # answered: nothing more is done
    api.notes[mig_layout.LAYOUT] = mig_layout.dump({0: Want(layout=["7g.80gb@0"], at=6.0)})
    assert recut.look(api, "n", nv)[0].state == "applied"  # a new request is a new answer
    assert _info(nv, 0).mig_instances == ["7g.80gb@0"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not valid JSON"),
        ("[]", "expected a JSON object by GPU index"),
        ('{"x": {"layout": [], "at": 1}}', "x: expected a GPU index"),
        ('{"0": {"layout": []}}', "0: at: Field required"),
        ('{"0": {"layout": [], "at": 1, "why": 2}}', "0: why: unknown field"),
    ],
)
def test_a_malformed_layout_annotation_is_one_line_naming_it(text: str, says: str) -> None:
    with pytest.raises(SpecError) as e:
        mig_layout.wants(text, "node n: annotation phalanx.io/mig-layout")
    assert "node n: annotation phalanx.io/mig-layout" in str(e.value) and says in str(e.value)


# ------------------------------------------------------------------------------ the scheduler's reading
def _node(instances: list[str], asked: list[str] | None, answer: str = "", offered: int = 0) -> Any:
    from kube_objects import node
    from phalanx.k8s import keys
    from phalanx.k8s.config import AdapterConfig
    from phalanx.k8s.read.nodes import parse_node

    topo = {
        "gpus": [
            {"index": 0, "model": "A100", "memoryMiB": 81920, "mig": True, "migInstances": instances},
            {"index": 1, "model": "A100", "memoryMiB": 81920, "mig": True, "migInstances": ["7g.80gb@0"]},
        ]
    }
    notes = {keys.DEVICE_TOPOLOGY: json.dumps(topo)}
    if asked is not None:
        notes[keys.MIG_LAYOUT] = mig_layout.dump({0: Want(layout=asked, at=5.0)})
    if answer:
        notes[keys.MIG_LAYOUT_STATUS] = mig_layout.dump({0: Answer(at=5.0, state=answer)})  # type: ignore[arg-type]
    extra = {"nvidia.com/mig-1g.10gb": str(offered), "nvidia.com/mig-7g.80gb": "2"}
    return parse_node(
        node("n", gpus=0, product="NVIDIA-A100-SXM4-80GB", memory=81920, annotations=notes, extra=extra),
        AdapterConfig(),
    )


def _layout(n: Any, g: int) -> list[str]:
    return [f"{m.profile}@{m.start}" for m in n.mig_instances[g]]


def test_a_gpu_is_read_as_being_cut_from_the_request_until_kubelet_offers_its_new_instances() -> None:
    asked = _node(["7g.80gb@0"], SEVEN)  # asked, not answered
    assert asked.mig_recutting == {0} and _layout(asked, 0) == SEVEN and asked.mig_recut_at == {0: 5.0}
    cut = _node(SEVEN, SEVEN, "applied", offered=0)  # cut, the device plugin has not listed them yet
    assert cut.mig_recutting == {0}
    ready = _node(SEVEN, SEVEN, "applied", offered=7)
    assert ready.mig_recutting == frozenset() and _layout(ready, 0) == SEVEN
    refused = _node(["7g.80gb@0"], SEVEN, "refused")
    assert refused.mig_recutting == frozenset() and _layout(refused, 0) == ["7g.80gb@0"]
    assert refused.mig_recut_at == {0: 5.0}  # not asked again within the interval
    assert _node(["7g.80gb@0"], None).mig_recutting == frozenset()


def test_a_gpu_being_cut_serves_nothing_and_is_not_cut_again_until_the_node_says_it_is_done() -> None:
    from phalanx.core.cycle import run_cycle
    from phalanx.core.model import GpuRequest, PodSet, TaskRequest, Workload
    from phalanx.core.snapshot import Snapshot
    from phalanx.profiles import compile_profile

    profile = compile_profile(
        {
            "name": "mig",
            "actions": [{"name": "allocate"}, {"name": "repartition", "args": {"min_interval_s": 60}}],
            "order": [{"name": "priority"}],
        }
    )
    jobs = [
        Workload(f"w{k}", (PodSet("p", 1, TaskRequest(1000, 1024, GpuRequest.mig("1g.10gb"))),))
        for k in range(3)
    ]
    snap = Snapshot([_node(["7g.80gb@0"], SEVEN)], jobs)
    assert snap.recuts == {(0, 0): math.inf}
    result = run_cycle(snap, profile, 10.0, random.Random(0))
    assert result.binds == [] and result.repartitions == []  # what GPU 0 is cut into serves them
    snap = Snapshot([_node(SEVEN, SEVEN, "applied", offered=7)], jobs)
    binds = run_cycle(snap, profile, 11.0, random.Random(0)).binds
    assert sorted(b.workload for b in binds) == ["w0", "w1", "w2"]


# ------------------------------------------------------------------------------ the device plugin
class _Ctx:
    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active


def test_the_mig_plugin_hands_out_the_chosen_slice_and_lists_a_recut_without_a_restart() -> None:
    import threading

    from phalanx.node.migplugin import Inventory, MigPlugin, MigSlot

    inv = Inventory([MigSlot(0, "7g.80gb@0", "MIG-big")])
    chosen = {"phalanx.io/mig-slice": "1g.10gb@3", "phalanx.io/gpu-devices": "0"}
    waiting = {
        "metadata": {"name": "p", "uid": "u", "creationTimestamp": "1", "annotations": chosen},
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
        "status": {"phase": "Pending"},
    }
    marked: list[list[str]] = []
    source = SimpleNamespace(pods=lambda: [waiting], mark=lambda p, ids: marked.append(ids))
    plugin = MigPlugin([], source, resource="nvidia.com/mig-1g.10gb", inventory=inv, profile="1g.10gb")  # type: ignore[arg-type]
    ctx = _Ctx()
    stream = plugin._list_and_watch(None, ctx)
    assert [d.ID for d in next(stream).devices] == []  # no 1g.10gb instance yet
    inv.set([MigSlot(0, f"1g.10gb@{k}", f"MIG-{k}") for k in range(7)])  # the GPU was cut
    assert [d.ID for d in next(stream).devices] == [f"MIG-{k}" for k in range(7)]
    assert plugin.prefer([f"MIG-{k}" for k in range(7)], [], 1) == ["MIG-3"]
    plugin.given_out(["MIG-3"])
    assert marked == [["MIG-3"]]
    ctx.active = False
    threading.Timer(0.1, plugin.stop.set).start()
    assert list(stream) == []


def test_kubelets_record_counts_as_use_before_the_pods_annotations_catch_up(nv: Any) -> None:
    devices = nvml.mig_devices(nv, _info(nv, 0))
    want = Want(layout=SEVEN, at=10.0)
    a = recut.answer(want, _info(nv, 0), nv, [], {"w/new": [devices[0].uuid]})
    assert (a.state, a.reason) == ("refused", "in use by pod(s) w/new")
    assert _info(nv, 0).mig_instances == ["7g.80gb@0"]


def test_the_plugin_corrects_a_pods_slice_to_the_device_kubelet_gave_it() -> None:
    from phalanx.node.migplugin import Inventory, MigSlot, reconcile

    inv = Inventory([MigSlot(1, f"1g.10gb@{k}", f"MIG-{k}") for k in range(7)])
    chosen = {"phalanx.io/mig-slice": "1g.10gb@2", "phalanx.io/gpu-devices": "1"}
    pods = [
        {
            "metadata": {"name": "a", "namespace": "w", "annotations": dict(chosen)},
            "status": {"phase": "Running"},
        },
        {"metadata": {"name": "b", "namespace": "w", "annotations": {}}, "status": {"phase": "Running"}},
        {
            "metadata": {"name": "c", "namespace": "w", "annotations": dict(chosen)},
            "status": {"phase": "Failed"},
        },
    ]
    noted: dict[str, dict[str, str]] = {}
    source = SimpleNamespace(pods=lambda: pods, note=lambda p, n: noted.update({p["metadata"]["name"]: n}))
    got = {"w/a": ["MIG-6"], "w/b": ["MIG-3"], "w/c": ["MIG-5"]}
    assert reconcile(source, inv, got) == ["w/a", "w/b"]  # type: ignore[arg-type]
    assert noted["a"] == {
        "phalanx.io/gpu-allocated": "MIG-6",
        "phalanx.io/mig-slice": "1g.10gb@6",
        "phalanx.io/gpu-devices": "1",
    }
    assert noted["b"] == {"phalanx.io/gpu-allocated": "MIG-3"}  # not placed by us: only the device
    pods[0]["metadata"]["annotations"].update(noted["a"])
    pods[1]["metadata"]["annotations"].update(noted["b"])
    assert reconcile(source, inv, got) == []  # agreed: nothing to write


def test_the_node_side_and_the_adapter_agree_on_the_keys() -> None:
    from phalanx.k8s import keys
    from phalanx.node import deviceplugin, migplugin

    assert (deviceplugin.GPU_DEVICES, migplugin.MIG_SLICE, migplugin.MIG_PREFIX) == (
        keys.GPU_DEVICES,
        keys.MIG_SLICE,
        keys.MIG_PREFIX,
    )
    assert (mig_layout.LAYOUT, mig_layout.STATUS) == (keys.MIG_LAYOUT, keys.MIG_LAYOUT_STATUS)
