"""The GPU-share admission mutation (the webhook's logic; the real webhook runs in test_e2e_shares)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kube_objects import pod
from phalanx.core.errors import SpecError
from phalanx.core.model import GpuKind
from phalanx.k8s import keys
from phalanx.k8s.admission.mutation import mutate, review
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.pods import parse_pod

CFG = AdapterConfig()
SHARES = AdapterConfig(gpu_shares="reservation")


def _refs(obj: dict[str, Any], i: int = 0) -> list[dict[str, Any]]:
    return obj["spec"]["containers"][i].get("envFrom") or []


def test_kai_fraction_gets_a_required_configmap_reference() -> None:
    p = pod("a", annotations={"gpu-fraction": "0.5"})
    out = mutate(p, "default", CFG)
    assert out is not None
    name = out["metadata"]["annotations"][keys.GPU_CONFIGMAP]
    assert name.startswith("a-") and name.endswith("-gpu") and len(name) <= 63
    assert _refs(out) == [{"configMapRef": {"name": name, "optional": False}}]
    assert p["metadata"]["annotations"] == {"gpu-fraction": "0.5"}  # the input is not changed
    # admitted, it parses as the same share, and reservation mode accepts it
    assert parse_pod(out, SHARES).request.gpu == parse_pod(p, CFG).request.gpu


def test_reinvocation_keeps_one_name_and_one_reference() -> None:
    once = mutate(pod("a", annotations={"gpu-memory": "10240"}), "default", CFG)
    assert once is not None
    twice = mutate(once, "default", CFG)
    assert twice is not None
    assert (
        twice["metadata"]["annotations"][keys.GPU_CONFIGMAP]
        == once["metadata"]["annotations"][keys.GPU_CONFIGMAP]
    )
    assert len(_refs(twice)) == 1


def test_named_container_gets_the_share() -> None:
    p = pod("a", annotations={"gpu-fraction": "0.25", keys.KAI_FRACTION_CONTAINER: "worker"})
    p["spec"]["containers"].append({"name": "worker", "image": "busybox"})
    out = mutate(p, "default", CFG)
    assert out is not None
    assert _refs(out, 0) == [] and len(_refs(out, 1)) == 1
    p["metadata"]["annotations"][keys.KAI_FRACTION_CONTAINER] = "nope"
    with pytest.raises(SpecError, match="no container named 'nope'"):
        mutate(p, "default", CFG)


@pytest.mark.parametrize(
    ("resources", "notes", "kind"),
    [
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000"}, {"gpu-memory": "10000"}, GpuKind.MEMORY),
        (
            {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "30", "nvidia.com/gpucores": "30"},
            {"gpu-fraction": "0.3", "gpu-fraction-num-devices": "2"},
            GpuKind.FRACTION,
        ),
    ],
)
def test_hami_requests_move_to_kai_annotations(
    resources: dict[str, str], notes: dict[str, str], kind: GpuKind
) -> None:
    p = pod("h", resources=resources)
    before = parse_pod(p, CFG).request.gpu
    out = mutate(p, "default", CFG)
    assert out is not None
    limits = out["spec"]["containers"][0]["resources"]["limits"]
    assert not any(k.startswith("nvidia.com/") for k in limits), limits  # kubelet would refuse them
    got = out["metadata"]["annotations"]
    assert {k: got[k] for k in notes} == notes
    after = parse_pod(out, CFG).request.gpu
    assert after == before and after.kind is kind


@pytest.mark.parametrize(
    "p",
    [
        pod("whole", gpus=2),
        pod("cpu"),
        pod("mig", resources={"nvidia.com/mig-3g.40gb": "1"}),
        pod("other", scheduler="default-scheduler", annotations={"gpu-fraction": "0.5"}),
    ],
)
def test_pods_that_are_not_shares_are_left_alone(p: dict[str, Any]) -> None:
    assert mutate(p, "default", CFG) is None


def test_share_without_the_webhook_annotation_waits_with_a_reason() -> None:
    p = pod("late", annotations={"gpu-fraction": "0.5"})
    with pytest.raises(SpecError, match=r"phalanx\.io/gpu-configmap annotation"):
        parse_pod(p, SHARES)
    p["spec"]["nodeName"] = "n0"  # bound before the webhook: it runs, we count it
    assert parse_pod(p, SHARES).node == "n0"


def _review(obj: dict[str, Any], operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"kind": kind},
            "operation": operation,
            "namespace": "team",
            "object": obj,
        },
    }
    return review(body, CFG)["response"]  # type: ignore[no-any-return]


def test_review_answers_with_a_json_patch() -> None:
    resp = _review(pod("a", annotations={"gpu-fraction": "0.5"}))
    assert resp["uid"] == "u1" and resp["allowed"] and resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert [o["path"] for o in ops] == ["/metadata/annotations", "/spec/containers"]


def test_review_denies_a_request_phalanx_cannot_read_naming_the_field() -> None:
    resp = _review(pod("bad", annotations={"gpu-fraction": "half"}))
    assert resp["allowed"] is False
    assert "annotation gpu-fraction" in resp["status"]["message"] and "half" in resp["status"]["message"]


def test_review_lets_other_operations_through() -> None:
    assert _review(pod("a", annotations={"gpu-fraction": "0.5"}), operation="UPDATE") == {
        "uid": "u1",
        "allowed": True,
    }
    assert _review({"metadata": {}}, kind="ConfigMap") == {"uid": "u1", "allowed": True}
