"""The chart's manifests, the CRDs and the examples are valid Kubernetes objects.

Built-in kinds are decoded by lightkube's models, generated from the Kubernetes OpenAPI
schema, and must encode back to the same document: a misspelled or misplaced field, which
the API server would prune or reject, shows up as a difference. CRDs must be structural
(every node typed, no additionalProperties beside properties), and every custom resource in
the examples must validate against its CRD's schema. The chart's own objects come from
`helm template` (tests/helm_chart.py; tests/test_helm_chart.py checks them all, with every switch).
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml
from lightkube.codecs import from_dict
from lightkube.models.core_v1 import PodTemplateSpec

from helm_chart import CRDS, ROOT, find, render

DEPLOY = ROOT / "deploy"
EXAMPLES = DEPLOY / "examples"
FILES = sorted(CRDS.glob("*.yaml")) + sorted(EXAMPLES.rglob("*.yaml"))
RESERVATION = {"scheduler": {"gpuShares": "reservation"}}


def docs() -> list[tuple[str, dict[str, Any]]]:
    """The CRDs and the examples, as files (no helm needed)."""
    out = []
    for f in FILES:
        for d in yaml.safe_load_all(f.read_text()):
            if d:
                name = (d.get("metadata") or {}).get("name", f.stem)
                out.append((f"{f.relative_to(DEPLOY)}:{d['kind']}/{name}", d))
    return out


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for _, d in docs():
        if d["kind"] == "CustomResourceDefinition":
            for v in d["spec"]["versions"]:
                out[(f"{d['spec']['group']}/{v['name']}", d["spec"]["names"]["kind"])] = v["schema"][
                    "openAPIV3Schema"
                ]
    return out


def prune(x: Any) -> Any:
    """Drop empty values the models leave out when encoding."""
    if isinstance(x, dict):
        return {k: prune(v) for k, v in x.items() if v not in (None, {}, [])}
    if isinstance(x, list):
        return [prune(v) for v in x]
    return x


def as_json_schema(s: Any) -> Any:
    """OpenAPI v3 (Kubernetes flavour) -> JSON Schema."""
    if isinstance(s, list):
        return [as_json_schema(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {k: as_json_schema(v) for k, v in s.items() if not k.startswith("x-kubernetes")}
    if s.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


def structural(s: dict[str, Any], where: str) -> None:
    typed = (
        "type" in s or s.get("x-kubernetes-int-or-string") or s.get("x-kubernetes-preserve-unknown-fields")
    )
    assert typed, f"{where}: every schema node needs a type"
    assert not ("properties" in s and "additionalProperties" in s), (
        f"{where}: properties and additionalProperties"
    )
    for k, sub in (s.get("properties") or {}).items():
        structural(sub, f"{where}.{k}")
    if isinstance(s.get("additionalProperties"), dict):
        structural(s["additionalProperties"], f"{where}.*")
    if "items" in s:
        structural(s["items"], f"{where}[]")


def test_the_manifests_exist():
    names = {n.split(":")[1] for n, _ in docs()}
    assert {
        "CustomResourceDefinition/queues.scheduling.phalanx.io",
        "CustomResourceDefinition/podgroups.scheduling.phalanx.io",
        "CustomResourceDefinition/datasets.scheduling.phalanx.io",
        "PyTorchJob/llm-pretrain",
        "Pod/notebook",
    } <= names
    assert not [p for p in DEPLOY.glob("*.yaml")], "manifests live in the chart (deploy/helm/phalanx)"


def check_object(name: str, doc: dict[str, Any], schemas: dict[tuple[str, str], dict[str, Any]]) -> None:
    """One manifest: a custom resource validates against its CRD, a built-in kind survives
    lightkube's models unchanged, a CRD is structural."""
    key = (doc["apiVersion"], doc["kind"])
    if key in schemas:
        jsonschema.validate(doc, as_json_schema(schemas[key]))
        return
    if doc["apiVersion"] == "kubeflow.org/v1":  # not a built-in: check its pod templates
        for role, spec in doc["spec"]["pytorchReplicaSpecs"].items():
            tmpl = spec["template"]
            assert prune(PodTemplateSpec.from_dict(tmpl).to_dict()) == prune(tmpl), role
            assert tmpl["spec"]["schedulerName"] == "phalanx"
        return
    obj = from_dict(doc)
    assert prune(obj.to_dict()) == prune(doc), f"{name}: fields the Kubernetes schema does not know"
    if doc["kind"] == "CustomResourceDefinition":
        for v in doc["spec"]["versions"]:
            structural(v["schema"]["openAPIV3Schema"], name)


@pytest.mark.parametrize(("name", "doc"), docs(), ids=[n for n, _ in docs()])
def test_manifest_is_valid(name, doc):
    check_object(name, doc, crd_schemas())


def test_crd_schemas_reject_bad_objects():
    schemas = {k[1]: as_json_schema(v) for k, v in crd_schemas().items()}
    bad_group = {
        "apiVersion": "scheduling.phalanx.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "x"},
    }
    with pytest.raises(jsonschema.ValidationError, match="minMember"):
        jsonschema.validate(bad_group | {"spec": {}}, schemas["PodGroup"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad_group | {"spec": {"minMember": 0}}, schemas["PodGroup"])
    bad_queue = {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": "q"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            bad_queue | {"spec": {"resources": {"gpu": {"overQuotaWeight": -1}}}}, schemas["Queue"]
        )


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_rbac_grants_what_the_adapter_calls_and_no_more():
    needed = {
        ("", "pods", "watch"),
        ("", "pods", "patch"),
        ("", "pods/binding", "create"),
        ("", "pods/eviction", "create"),
        ("", "nodes", "list"),
        ("", "events", "create"),
        ("scheduling.phalanx.io", "podgroups/status", "patch"),
        ("scheduling.phalanx.io", "queues/status", "patch"),
        ("authentication.k8s.io", "tokenreviews", "create"),  # who reads /metrics and /dashboard/
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    }
    shares = {("", "configmaps", "create"), ("", "configmaps", "patch")}
    plain = _grants(find(render(), "ClusterRole", "phalanx-scheduler"))
    with_shares = _grants(find(render(RESERVATION), "ClusterRole", "phalanx-scheduler"))
    assert needed <= plain and not shares & plain  # the ConfigMap rule only for reservation shares
    assert needed | shares <= with_shares
    for grants in (plain, with_shares):
        assert not any(v in ("delete", "deletecollection", "*") for _, _, v in grants)
        assert not any(r == "*" or g == "*" for g, r, _ in grants)


def _rules(chart: list[dict[str, Any]], kind: str, name: str) -> set[tuple[str, str, str, tuple[str, ...]]]:
    role = find(chart, kind, name)
    return {
        (g, r, v, tuple(rule.get("resourceNames") or ()))
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_gpu_share_rbac_is_confined():
    """Reservation pods are made and deleted in our namespace only; the webhook touches only its
    Secret and its own webhook configuration."""
    from phalanx.k8s.admission.webhook import SECRET, WEBHOOK_CONFIG

    chart = render(RESERVATION)
    assert _rules(chart, "Role", "phalanx-gpu-reservations") == {
        ("", "pods", "create", ()),
        ("", "pods", "delete", ()),
    }
    assert _rules(chart, "Role", "phalanx-gpu-reservation") == {("", "pods", "patch", ())}
    hook = _rules(chart, "ClusterRole", "phalanx-webhook")
    assert all(names == (WEBHOOK_CONFIG,) for *_, names in hook)
    secret = _rules(chart, "Role", "phalanx-webhook")
    assert all(names == (SECRET,) for _, _, verb, names in secret if verb != "create")


def test_reservation_pod_is_a_valid_pod():
    from lightkube.models.core_v1 import Pod

    from phalanx.k8s.act.shares import reservation_pod
    from phalanx.k8s.config import AdapterConfig

    doc = reservation_pod("gpu-node-1", 3, AdapterConfig())
    assert prune(Pod.from_dict(doc).to_dict()) == prune(doc)
    assert doc["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    chart = render(RESERVATION)
    prio = next(d for d in chart if d["kind"] == "PriorityClass")
    assert doc["spec"]["priorityClassName"] == prio["metadata"]["name"]
    accounts = {d["metadata"]["name"] for d in chart if d["kind"] == "ServiceAccount"}
    assert doc["spec"]["serviceAccountName"] in accounts
