"""The chart's distributed dataset cache (distcache.enabled): SeaweedFS's master, filer, volume
servers and FUSE mounts, `phalanx distcache`, and what the webhook is told, as `helm template`
renders them. The kit test (tests/test_e2e_distcache.py) installs the same on real kubelets."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from helm_chart import CHART, find, render, run_helm
from test_helm_chart import APP_VERSION, container, parse_cli
from test_k8s_manifests import check_object, crd_schemas

ON: dict[str, Any] = {"distcache": {"enabled": True}}
HOSTED: dict[str, Any] = {
    "distcache": {
        "enabled": True,
        "image": {"repository": "registry.example/seaweedfs", "tag": "9.9", "pullPolicy": "Always"},
        "master": {"address": "10.1.2.3:9333.19333", "hostNetwork": True},
        "filer": {"address": "10.1.2.3:8888.18888", "store": {"hostPath": "/srv/filer"}},
        "volume": {"hostPath": "/nvme/weed", "max": 7},
        "allowUntrustedRemoteEndpoints": True,
        "mount": {"hostPath": "/run/phalanx-fuse"},
    }
}
PARTS = {
    ("StatefulSet", "phalanx-distcache-master"),
    ("StatefulSet", "phalanx-distcache-filer"),
    ("DaemonSet", "phalanx-distcache-volume"),
    ("DaemonSet", "phalanx-distcache-mount"),
    ("Deployment", "phalanx-distcache"),
}


def _spec(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return find(docs, kind, name)["spec"]["template"]["spec"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("values", [ON, HOSTED], ids=["on", "hosted"])
def test_helm_lint_strict_is_clean_and_every_object_is_valid(values: dict[str, Any], tmp_path: Any) -> None:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    res = run_helm("lint", "--strict", str(CHART), "-f", str(f))
    assert res.returncode == 0 and "[WARNING]" not in res.stdout + res.stderr, res.stdout + res.stderr
    schemas = crd_schemas()
    for d in render(values):
        check_object(f"{d['kind']}/{d['metadata']['name']}", d, schemas)
        if d["kind"] != "CustomResourceDefinition":
            assert d["metadata"]["labels"]["app.kubernetes.io/version"] == APP_VERSION


def test_off_by_default_and_the_webhook_is_told_where_the_mount_is_only_when_on() -> None:
    off, on = render(), render(ON)
    assert not [d for d in off if "distcache" in d["metadata"]["name"]]
    assert not any(
        a.startswith("--distcache-root") for a in container(off, "Deployment", "phalanx-webhook")["args"]
    )
    assert {(d["kind"], d["metadata"]["name"]) for d in on} >= PARTS
    hook = container(on, "Deployment", "phalanx-webhook")["args"]
    assert "--distcache-root=/var/lib/phalanx/distcache/mount" in hook
    assert parse_cli(hook)["distcache_root"] == "/var/lib/phalanx/distcache/mount"


def test_the_engine_runs_its_own_image_and_the_controller_phalanx_s_with_weed_copied_in() -> None:
    docs = render(HOSTED)
    for kind, name in PARTS - {("Deployment", "phalanx-distcache")}:
        (c,) = _spec(docs, kind, name)["containers"]
        assert (c["image"], c["imagePullPolicy"]) == ("registry.example/seaweedfs:9.9", "Always"), name
        assert c["readinessProbe"] and c["livenessProbe"], name
        assert _spec(docs, kind, name)["automountServiceAccountToken"] is False, name  # no API access
    spec = _spec(docs, "Deployment", "phalanx-distcache")
    (init,) = spec["initContainers"]
    assert init["image"] == "registry.example/seaweedfs:9.9" and init["command"][0] == "cp"
    (c,) = spec["containers"]
    assert c["image"] == f"phalanx:{APP_VERSION}"
    args = parse_cli(c["args"])  # the real CLI accepts them
    assert (args["master"], args["filer"], args["weed"]) == (
        "10.1.2.3:9333.19333",
        "10.1.2.3:8888.18888",
        "/opt/weed/weed",
    )
    assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["runAsNonRoot"]


def test_addresses_default_to_the_stateful_pods_dns_names() -> None:
    docs = render(ON)
    args = parse_cli(container(docs, "Deployment", "phalanx-distcache")["args"])
    svc = "phalanx-system.svc"
    assert args["master"] == f"phalanx-distcache-master-0.phalanx-distcache-master.{svc}:9333.19333"
    assert args["filer"] == f"phalanx-distcache-filer-0.phalanx-distcache-filer.{svc}:8888.18888"
    assert find(docs, "Service", "phalanx-distcache-master")["spec"]["clusterIP"] == "None"


def test_volume_servers_sit_on_the_cache_nodes_nvme_one_folder_per_node() -> None:
    docs = render(HOSTED)
    spec = _spec(docs, "DaemonSet", "phalanx-distcache-volume")
    (c,) = spec["containers"]
    assert spec["nodeSelector"] == {"phalanx.io/distcache": "true"}
    assert {"-max=7", "-dir=/data", "-volume.allowUntrustedRemoteEndpoints"} <= set(c["command"])
    assert spec["volumes"] == [
        {"name": "nvme", "hostPath": {"path": "/nvme/weed", "type": "DirectoryOrCreate"}}
    ]
    assert c["volumeMounts"] == [{"name": "nvme", "mountPath": "/data", "subPathExpr": "$(NODE_NAME)"}]
    assert (
        "-volume.allowUntrustedRemoteEndpoints"
        not in container(render(ON), "DaemonSet", "phalanx-distcache-volume")["command"]
    )


def test_the_filer_reads_through_to_a_private_source_only_when_allowed() -> None:
    """A file the full cache cannot take is streamed from the source by the filer, which refuses
    private and in-cluster endpoints unless told (found with the cache full on real nodes)."""
    assert (
        "-allowUntrustedRemoteEndpoints"
        in container(render(HOSTED), "StatefulSet", "phalanx-distcache-filer")["command"]
    )
    assert (
        "-allowUntrustedRemoteEndpoints"
        not in container(render(ON), "StatefulSet", "phalanx-distcache-filer")["command"]
    )


def test_the_filer_store_is_a_claim_or_a_host_folder() -> None:
    claim = find(render(ON), "StatefulSet", "phalanx-distcache-filer")["spec"]
    assert claim["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    host = find(render(HOSTED), "StatefulSet", "phalanx-distcache-filer")["spec"]
    assert "volumeClaimTemplates" not in host
    assert host["template"]["spec"]["volumes"][0]["hostPath"]["path"] == "/srv/filer"


def test_the_mount_is_privileged_and_propagates_to_the_host_folder_the_webhook_names() -> None:
    docs = render(HOSTED)
    spec = _spec(docs, "DaemonSet", "phalanx-distcache-mount")
    (c,) = spec["containers"]
    assert c["securityContext"] == {"privileged": True}
    assert c["volumeMounts"] == [
        {"name": "mnt", "mountPath": "/mnt/phalanx", "mountPropagation": "Bidirectional"}
    ]
    assert spec["volumes"][0]["hostPath"]["path"] == "/run/phalanx-fuse"
    script = c["command"][2]
    assert "-filer=10.1.2.3:8888.18888" in script and "-readOnly" in script and 'umount -l "$mnt"' in script
    assert "--distcache-root=/run/phalanx-fuse" in container(docs, "Deployment", "phalanx-webhook")["args"]


def test_rbac_is_what_distcache_and_the_webhook_call() -> None:
    docs = render(ON)
    rules = {
        (g, r, v)
        for rule in find(docs, "ClusterRole", "phalanx-distcache")["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert rules == {
        ("scheduling.phalanx.io", "datasets", "list"),
        ("scheduling.phalanx.io", "datasets/status", "patch"),
        ("", "secrets", "get"),
        ("", "pods", "list"),
        ("", "pods", "patch"),
        ("", "events", "create"),
    }
    (hook,) = find(docs, "ClusterRole", "phalanx-webhook-datasets")["rules"]
    assert hook == {"apiGroups": ["scheduling.phalanx.io"], "resources": ["datasets"], "verbs": ["get"]}
    binding = find(docs, "ClusterRoleBinding", "phalanx-webhook-datasets")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "phalanx-webhook", "namespace": "phalanx-system"}
    ]
    assert not [
        d
        for d in render({**ON, "webhook": {"enabled": False}})
        if d["metadata"]["name"].endswith("webhook-datasets")
    ]
    assert json.dumps(docs).count('"*"') == 0
