"""Shadow verdicts, redaction and capture files, without a cluster (the store is filled by hand).

The e2e tests (test_e2e_shadow.py, test_e2e_capture.py) run the same code on a real API server.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from kube_objects import node, pod
from phalanx.core.errors import SpecError
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.loop.shadow import AGREE, DISAGREE, FULLER, SAME_NODE, Shadow
from phalanx.k8s.trial import capture as cap
from phalanx.k8s.trial.redact import redact
from phalanx.profiles import load_profile

NOW = 1796132018.0 + 600


def _shadow() -> Shadow:
    cfg = AdapterConfig(scheduler_name="default-scheduler")
    return Shadow(None, cfg, load_profile("binpack"), clock=lambda: NOW)  # type: ignore[arg-type]


def _bound(p: dict[str, Any], where: str) -> dict[str, Any]:
    q = json.loads(json.dumps(p))
    q["spec"]["nodeName"] = where
    q["metadata"]["resourceVersion"] = "2"
    return q


def test_a_spread_placement_is_judged_against_phalanx_packing_it() -> None:
    s = _shadow()
    s.store.replace("nodes", [node("n0", gpus=4), node("n1", gpus=4)])
    running = pod("old", gpus=2, scheduler="default-scheduler", node="n0")  # there before the shadow
    s.store.replace("pods", [_bound(running, "n0")])
    new = pod("new", gpus=1, scheduler="default-scheduler")
    s.store.apply("pods", "ADDED", new)
    assert s.step() == [] and s.placeable == ["default/new"]  # waiting: Phalanx would place it now
    s.store.apply("pods", "MODIFIED", _bound(new, "n1"))  # its scheduler spreads it onto the empty node
    [v] = s.step()
    assert (v.verdict, v.reason, v.real, v.ours) == (DISAGREE, FULLER, "n1", "n0")
    assert s.step() == [] and s.tally == {(DISAGREE, FULLER): 1}  # judged once
    same = pod("same", gpus=1, scheduler="default-scheduler")
    s.store.apply("pods", "ADDED", same)
    s.store.apply("pods", "MODIFIED", _bound(same, "n0"))
    [v] = s.step()
    assert (v.verdict, v.reason) == (AGREE, SAME_NODE)
    assert s.summary()["judged"] == 2 and s.summary()["agreed"] == 1
    assert "phalanx_shadow_decisions_total" in s.metrics.render().decode()


def test_other_schedulers_pods_and_pods_placed_before_the_shadow_are_not_judged() -> None:
    s = _shadow()
    s.store.replace("nodes", [node("n0", gpus=4)])
    mine = pod("ours", gpus=1, scheduler="phalanx")
    s.store.apply("pods", "ADDED", mine)
    s.store.apply("pods", "MODIFIED", _bound(mine, "n0"))
    s.store.apply("pods", "ADDED", _bound(pod("early", gpus=1, scheduler="default-scheduler"), "n0"))
    assert s.step() == [] and not s.tally


def _capture() -> cap.Capture:
    nodes = [node("kestrel-7", gpus=8, labels={"pool": "quokka", "kubernetes.io/arch": "amd64"})]
    notes = {"phalanx.io/pod-group": "gang-x"}
    pods = [
        pod("train-0", ns="team-owl", gpus=4, annotations=notes, node="kestrel-7"),
        pod("train-1", ns="team-owl", gpus=4, annotations=notes | {"note": "GPU-kestrel-7-0003 true"}),
    ]
    why = 'jobs.batch is forbidden: User "system:serviceaccount:owls:reader" cannot list resource "jobs"'
    return cap.Capture({"nodes": nodes, "pods": pods}, NOW, ["nodes", "pods"], {"batch/v1/jobs": why})


def test_redaction_hides_names_inside_longer_strings_and_keeps_hardware_and_plain_values() -> None:
    r = redact(_capture())
    text = json.dumps(r.to_dict())
    for name in ("kestrel-7", "quokka", "train-0", "team-owl", "gang-x", "busybox", "owls:reader"):
        assert name not in text
    n = r.objects["nodes"][0]["metadata"]["labels"]
    assert n["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and n["kubernetes.io/arch"] == "amd64"
    assert r.objects["pods"][0]["spec"]["containers"][0]["image"].startswith("r")  # busybox: hashed
    note = r.objects["pods"][1]["metadata"]["annotations"]["note"]
    assert note.startswith("GPU-r") and note.endswith("-0003 true")
    # stable: the node's name and the pod's nodeName meet, in this capture and the next
    assert r.objects["pods"][0]["spec"]["nodeName"] == r.objects["nodes"][0]["metadata"]["name"]
    assert redact(_capture()).to_dict() == r.to_dict() != redact(_capture(), salt="s").to_dict()


def test_a_capture_file_round_trips_and_a_bad_one_is_one_clear_error(tmp_path: Path) -> None:
    c = _capture()
    cap.write(c, tmp_path / "c.json.gz")
    back = cap.load(tmp_path / "c.json.gz")
    assert back.objects == c.objects and back.time == NOW
    bad = tmp_path / "bad.json"
    for body, says in (
        (b"{", "not a capture file (JSON"),
        (json.dumps({"kind": "Pod"}).encode(), "kind must be 'Capture'"),
        (
            json.dumps({"kind": "Capture", "apiVersion": cap.API_VERSION, "objects": {"pods": 1}}).encode(),
            "objects",
        ),
        (gzip.compress(b"[]"), "not a capture file"),
        (bytes(range(128, 256)), "not a text file; expected a capture file"),  # binary, not gzip
    ):
        bad.write_bytes(body)
        with pytest.raises(SpecError, match="--capture") as e:
            cap.load(bad)
        assert says in str(e.value)
        assert "codec" not in str(e.value)
    with pytest.raises(SpecError, match="cannot read the file"):
        cap.load(tmp_path / "missing.json")
