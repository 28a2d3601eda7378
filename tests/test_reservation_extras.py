"""What a cluster adds to the GPU reservation pods: `phalanx scheduler --reservation-pod FILE`, and
the chart's `reservations.*` values that write that file; and the other chart settings that running
the node side under real kubelets asked for (tests/test_nodes_side.py): `devicePlugin.kubeletDir`,
the cache agent's user."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from phalanx.cli.main import app
from phalanx.core.errors import SpecError
from phalanx.k8s.act.shares import parse_reservation_extras, reservation_pod
from phalanx.k8s.config import AdapterConfig, ReservationPodExtras

EXTRAS = {
    "runtimeClassName": "nvidia",
    "env": [{"name": "PHALANX_FAKE_NVML", "value": "/fake/nvml.json"}],
    "volumes": [{"name": "fake", "hostPath": {"path": "/srv/fake", "type": "Directory"}}],
    "volumeMounts": [{"name": "fake", "mountPath": "/fake", "readOnly": True}],
}


def test_extras_reach_the_reservation_pod() -> None:
    extras = parse_reservation_extras(EXTRAS, "f.yaml")
    pod = reservation_pod("n0", 2, AdapterConfig(reservation_extras=extras))
    spec = pod["spec"]
    c = spec["containers"][0]
    assert spec["runtimeClassName"] == "nvidia"
    assert [e["name"] for e in c["env"]] == ["POD_NAME", "POD_NAMESPACE", "PHALANX_FAKE_NVML"]
    assert c["env"][2] == {"name": "PHALANX_FAKE_NVML", "value": "/fake/nvml.json"}
    assert spec["volumes"] == EXTRAS["volumes"]
    assert c["volumeMounts"] == EXTRAS["volumeMounts"]
    # a valid Pod, as the API server's schema has it
    from lightkube.models.core_v1 import Pod

    assert Pod.from_dict(pod).spec.runtimeClassName == "nvidia"  # type: ignore[union-attr]


def test_no_extras_change_nothing() -> None:
    plain = reservation_pod("n0", 0, AdapterConfig())
    assert plain == reservation_pod(
        "n0", 0, AdapterConfig(reservation_extras=parse_reservation_extras(None, "f"))
    )
    assert "runtimeClassName" not in plain["spec"] and "volumes" not in plain["spec"]
    assert parse_reservation_extras({}, "f") == ReservationPodExtras()


@pytest.mark.parametrize(
    ("data", "where", "says"),
    [
        ({"image": "x"}, "f.yaml: image", "unknown field"),
        ({"runtimeClassName": "NVIDIA"}, "f.yaml: runtimeClassName", "not a DNS subdomain"),
        ({"env": [{"name": "POD_NAME", "value": "x"}]}, "f.yaml: env[0]", "set by Phalanx"),
        ({"env": [{"name": "A B", "value": "x"}]}, "f.yaml: env[0]", "not a valid variable name"),
        ({"env": [{"value": "x"}]}, "f.yaml: env[0].name", "required"),
        ({"env": [{"name": "A", "value": 6443}]}, "f.yaml: env[0].value", "string"),
        (
            {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
            "f.yaml: env[0]",
            "not both",
        ),
        ({"volumes": [{"name": "v"}]}, "f.yaml: volumes[0]", "exactly one volume source"),
        ({"volumes": [{"name": "Big", "emptyDir": {}}]}, "f.yaml: volumes[0]", "not a DNS label"),
        (
            {"volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}]},
            "f.yaml: volumes[1]",
            "listed twice",
        ),
        ({"volumeMounts": [{"name": "v", "mountPath": "/v"}]}, "f.yaml: volumeMounts[0]", "does not list"),
        (
            {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "v"}]},
            "f.yaml: volumeMounts[0]",
            "not an absolute path",
        ),
        ([1, 2], "f.yaml", "must be a mapping"),
    ],
)
def test_bad_extras_name_the_field(data: Any, where: str, says: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_reservation_extras(data, "f.yaml")
    assert e.value.where == where and says in e.value.message, str(e.value)


def test_scheduler_flag_reports_a_bad_file_in_one_line(tmp_path: Path) -> None:
    f = tmp_path / "pod.yaml"
    f.write_text(yaml.safe_dump({"env": [{"name": "POD_NAMESPACE", "value": "x"}]}))
    res = CliRunner().invoke(app, ["scheduler", "--reservation-pod", str(f), "--kubeconfig", str(f)])
    assert res.exit_code == 2, res.output
    assert f"--reservation-pod {f}: env[0]: POD_NAMESPACE is set by Phalanx" in res.output
    res = CliRunner().invoke(app, ["scheduler", "--reservation-pod", str(tmp_path / "none.yaml")])
    assert res.exit_code == 2 and "cannot read file" in res.output, res.output


def test_chart_values_become_the_file_the_scheduler_reads() -> None:
    from helm_chart import find, render
    from test_helm_chart import container, parse_cli

    values = {
        "scheduler": {"gpuShares": "reservation"},
        "extraEnv": [{"name": "KUBERNETES_SERVICE_PORT", "value": 6443}],
        "reservations": EXTRAS,
    }
    docs = render(values)
    c = container(docs, "Deployment", "phalanx-scheduler")
    args = parse_cli(c["args"])
    assert str(args["reservation_pod"]) == "/etc/phalanx/reservation/pod.yaml"
    assert {"name": "reservation-pod", "mountPath": "/etc/phalanx/reservation", "readOnly": True} in c[
        "volumeMounts"
    ]
    text = find(docs, "ConfigMap", "phalanx-reservation-pod")["data"]["pod.yaml"]
    extras = parse_reservation_extras(yaml.safe_load(text), "pod.yaml")
    assert extras.runtime_class_name == "nvidia"
    # the global extraEnv too (the reservation pods are API clients), as strings
    assert [(e["name"], e["value"]) for e in extras.env] == [
        ("PHALANX_FAKE_NVML", "/fake/nvml.json"),
        ("KUBERNETES_SERVICE_PORT", "6443"),
    ]
    assert list(extras.volumes) == EXTRAS["volumes"]
    # nothing set: no file, no flag; shares off: no file either
    for plain in ({"scheduler": {"gpuShares": "reservation"}}, {"reservations": EXTRAS}):
        docs = render(plain)
        assert "reservation_pod" not in {
            k for k, v in parse_cli(container(docs, "Deployment", "phalanx-scheduler")["args"]).items() if v
        }
        assert not [d for d in docs if d["metadata"]["name"] == "phalanx-reservation-pod"]


def test_device_plugin_folder_follows_kubelet_dir() -> None:
    from helm_chart import find, render

    for kubelet, want in (
        (None, "/var/lib/kubelet/device-plugins"),
        (
            "/var/snap/microk8s/common/var/lib/kubelet/",
            "/var/snap/microk8s/common/var/lib/kubelet/device-plugins",
        ),
    ):
        values: dict[str, Any] = {"devicePlugin": {"enabled": True}}
        if kubelet:
            values["devicePlugin"]["kubeletDir"] = kubelet
        ds = find(render(values), "DaemonSet", "phalanx-device-plugin")
        vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        assert vols["device-plugins"]["hostPath"] == {"path": want, "type": "Directory"}
        mounts = ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"} in mounts


def test_cache_agent_can_write_the_folder_kubelet_makes() -> None:
    """The cache's hostPath is DirectoryOrCreate: kubelet makes it as root's, 0755. The image's
    user could not write there (found on a real kubelet: the agent crash-looped on EACCES)."""
    from helm_chart import find, render

    ds = find(render({"cache": {"enabled": True}}), "DaemonSet", "phalanx-cache")
    spec = ds["spec"]["template"]["spec"]
    assert spec["volumes"][0]["hostPath"]["type"] == "DirectoryOrCreate"
    ctx = spec["containers"][0]["securityContext"]
    assert ctx == {"runAsUser": 0, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_scheduler_has_a_writable_tmp_under_its_read_only_root() -> None:
    """The scheduler writes its self-made serving certificate to a temporary folder; its root
    filesystem is read-only (found on a real kubelet: it crash-looped, 'No usable temporary
    directory found')."""
    from helm_chart import find, render

    for values in ({}, {"scheduler": {"gpuShares": "reservation", "customProfile": "name: x\n"}}):
        dep = find(render(values), "Deployment", "phalanx-scheduler")
        spec = dep["spec"]["template"]["spec"]
        c = spec["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
        assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"]
