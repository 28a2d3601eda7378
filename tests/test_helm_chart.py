"""The Helm chart (deploy/helm/phalanx): lint-clean, valid objects with every switch, values that
reach the pods they name, flags the real CLI accepts, names the code expects, no clashes between
releases. Rendered with `helm template` (tests/helm_chart.py: skipped without helm)."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonschema
import pytest
import typer
import yaml

from helm_chart import CHART, CRDS, ROOT, component, find, render, run_helm
from test_k8s_manifests import as_json_schema, check_object, crd_schemas

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
ALL_ON: dict[str, Any] = {
    "scheduler": {
        "gpuShares": "reservation",
        "customProfile": "name: mine\nactions: [allocate]\n",
        "mps": {"allShares": True},
    },
    "webhook": {"certificate": {"mode": "certManager"}},
    "discover": {"migRecut": True},
    "devicePlugin": {"enabled": True, "migStrategy": "mixed"},
    "cache": {"enabled": True},
    "queues": [
        {"name": "research", "spec": {"resources": {"gpu": {"quota": 32}}}},
        {"name": "vision", "spec": {"parent": "research", "resources": {"gpu": {"quota": 16}}}},
    ],
    "imagePullSecrets": [{"name": "registry"}],
    "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"}],
}
PROVIDED = {"webhook": {"certificate": {"mode": "provided", "secretName": "my-tls", "caBundle": CA}}}
CASES = {
    "defaults": {},
    "all-on": ALL_ON,
    "provided": PROVIDED,
    "webhook-off": {"webhook": {"enabled": False}},
}
# (component label, values key, kind, name for release "phalanx")
WORKLOADS = [
    ("scheduler", "scheduler", "Deployment", "phalanx-scheduler"),
    ("webhook", "webhook", "Deployment", "phalanx-webhook"),
    ("node-discover", "discover", "DaemonSet", "phalanx-node-discover"),
    ("device-plugin", "devicePlugin", "DaemonSet", "phalanx-device-plugin"),
    ("cache", "cache", "DaemonSet", "phalanx-cache"),
]
CLUSTER_KINDS = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "MutatingWebhookConfiguration",
    "PriorityClass",
    "Queue",
}


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """kind/name -> pod spec of every workload."""
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
    }


def container(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (c,) = find(docs, kind, name)["spec"]["template"]["spec"]["containers"]
    return c


def parse_cli(args: list[str]) -> dict[str, Any]:
    """Parse a container's args with the real `phalanx` command (nothing runs): unknown flags or
    bad values raise."""
    from phalanx.cli.main import app

    cmd: Any = typer.main.get_command(app)
    ctx = cmd.make_context("phalanx", list(args))
    rest = list(args)
    while hasattr(cmd, "get_command"):  # a group: descend to the subcommand
        cmd = cmd.get_command(ctx, rest.pop(0))
        assert cmd is not None, args
    return dict(cmd.make_context("phalanx", rest, parent=ctx).params)


# ------------------------------------------------------------------ the chart as a whole


@pytest.mark.parametrize("values", [{}, ALL_ON, PROVIDED], ids=["defaults", "all-on", "provided"])
def test_helm_lint_strict_is_clean(values, tmp_path):
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    res = run_helm("lint", "--strict", str(CHART), "-f", str(f))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_every_rendered_object_is_valid(case):
    docs = render(CASES[case])
    schemas = crd_schemas()
    for d in docs:
        name = f"{case}:{d['kind']}/{d['metadata']['name']}"
        if d["apiVersion"] == "cert-manager.io/v1":  # not a built-in kind, and not ours
            assert set(d["spec"]) <= {
                "selfSigned",
                "secretName",
                "duration",
                "renewBefore",
                "dnsNames",
                "issuerRef",
            }
            continue
        check_object(name, d, schemas)
        if d["kind"] != "CustomResourceDefinition":
            labels = d["metadata"]["labels"]
            assert labels["app.kubernetes.io/instance"] == "phalanx", name
            assert labels["app.kubernetes.io/managed-by"] == "Helm", name
            assert labels["app.kubernetes.io/version"] == APP_VERSION, name
            assert labels["helm.sh/chart"] == f"phalanx-{APP_VERSION}", name
            assert {"app.kubernetes.io/name", "app.kubernetes.io/component"} <= set(labels), name


def test_the_crds_come_from_the_charts_crds_folder_only():
    docs = render()
    crds = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition")
    files = sorted(yaml.safe_load(f.read_text())["metadata"]["name"] for f in CRDS.glob("*.yaml"))
    assert (
        crds
        == files
        == [
            "datasets.scheduling.phalanx.io",
            "podgroups.scheduling.phalanx.io",
            "queues.scheduling.phalanx.io",
        ]
    )
    assert not list((CHART / "templates").glob("*crd*"))


def test_defaults_render_the_scheduler_webhook_and_discovery_only():
    docs = render()
    workloads = {
        f"{d['kind']}/{d['metadata']['name']}" for d in docs if d["kind"] in ("Deployment", "DaemonSet")
    }
    assert workloads == {
        "Deployment/phalanx-scheduler",
        "Deployment/phalanx-webhook",
        "DaemonSet/phalanx-node-discover",
    }
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert services == {"phalanx-scheduler-metrics", "phalanx-webhook"}
    assert {d["kind"] for d in docs}.isdisjoint(
        {"Namespace", "PriorityClass", "Queue", "Certificate", "Issuer"}
    )
    assert find(docs, "Deployment", "phalanx-scheduler")["spec"]["replicas"] == 2
    assert find(docs, "Deployment", "phalanx-webhook")["spec"]["replicas"] == 2


def test_every_switch_adds_its_component():
    docs = render(ALL_ON)
    for _, _, kind, name in WORKLOADS:
        find(docs, kind, name)
    assert not component(render({"webhook": {"enabled": False}}), "webhook")
    assert not component(render({"discover": {"enabled": False}}), "node-discover")


def test_shards_render_one_scheduler_each_and_the_file_the_twin_reads_with_their_profiles():
    from phalanx.spec.shards import parse_shards

    docs = render(
        {"shards": [{"name": "h100", "pools": ["h100"], "profile": "fgd"}, {"name": "rest", "default": True}]}
    )
    every = parse_shards(
        yaml.safe_load(find(docs, "ConfigMap", "phalanx-shards")["data"]["shards.yaml"]), "cm"
    )
    assert [(s.name, s.pools, s.default, s.profile) for s in every.shards] == [
        ("h100", ("h100",), False, "fgd"),
        ("rest", (), True, ""),
    ]
    h100 = container(docs, "Deployment", "phalanx-scheduler-h100")["args"]
    rest = container(docs, "Deployment", "phalanx-scheduler-rest")["args"]
    assert "--shard=h100" in h100 and "--profile=fgd" in h100
    assert "--shard=rest" in rest and "--profile=fgd" not in rest


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"scheduler": {"gpuShares": "reservation"}, "webhook": {"enabled": False}}, "needs webhook.enabled"),
        ({"scheduler": {"gpuShares": "yes"}}, "scheduler.gpuShares must be"),
        ({"webhook": {"certificate": {"mode": "vault"}}}, "webhook.certificate.mode must be"),
        ({"webhook": {"certificate": {"mode": "provided"}}}, "needs webhook.certificate.secretName"),
        ({"queues": [{"spec": {}}]}, "needs a name"),
        (
            {"shards": [{"name": "a", "pools": ["x"]}, {"name": "b", "pools": ["y", "x"]}]},
            'shards: pool "x" is in shards "a" and "b": a node has one owner',
        ),
        (
            {"shards": [{"name": "a", "default": True}, {"name": "b", "default": True}]},
            "a, b are all default",
        ),
        ({"shards": [{"name": "A_1", "pools": ["x"]}]}, "shards[0].name must be a DNS label"),
        ({"shards": [{"name": "a"}]}, "shards[0] (a) owns nothing"),
        ({"devicePlugin": {"enabled": True, "migStrategy": "single"}}, "devicePlugin.migStrategy: expected"),
    ],
)
def test_values_that_cannot_work_stop_the_render(values, message, tmp_path):
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    res = run_helm("template", "phalanx", str(CHART), "-f", str(f))
    assert res.returncode != 0 and message in res.stderr, res.stderr


# ------------------------------------------------------------------ images and pod settings


def test_every_container_runs_the_values_image():
    for values, image in (({}, f"phalanx:{APP_VERSION}"), ({"image": {"tag": "1.2.3"}}, "phalanx:1.2.3")):
        docs = render({**ALL_ON, **values})
        for where, spec in pod_specs(docs).items():
            for c in spec["containers"] + spec.get("initContainers", []):
                assert c["image"] == image and c["imagePullPolicy"] == "IfNotPresent", where
    docs = render(
        {**ALL_ON, "image": {"repository": "registry.example/ml/phalanx", "tag": "9", "pullPolicy": "Always"}}
    )
    for where, spec in pod_specs(docs).items():
        assert spec["imagePullSecrets"] == [{"name": "registry"}], where
        for c in spec["containers"]:
            assert (c["image"], c["imagePullPolicy"]) == ("registry.example/ml/phalanx:9", "Always"), where
    args = container(docs, "Deployment", "phalanx-scheduler")["args"]
    assert "--reservation-image=registry.example/ml/phalanx:9" in args  # the reservation pods' image
    # the reservation pods are made by the scheduler: their pull secrets come through their account
    assert find(docs, "ServiceAccount", "phalanx-gpu-reservation")["imagePullSecrets"] == [
        {"name": "registry"}
    ]


def test_pod_settings_reach_their_own_pods_only():
    values: dict[str, Any] = json.loads(json.dumps(ALL_ON))
    wanted = {}
    for label, key, kind, name in WORKLOADS:
        settings = {
            "nodeSelector": {"pool": label},
            "tolerations": [{"key": f"{label}-taint", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": label, "operator": "Exists"}]}]
                    }
                }
            },
            # both parts: Helm merges maps into the defaults (a part is dropped with null)
            "resources": {
                "requests": {"cpu": "7m", "memory": f"{len(label)}Mi"},
                "limits": {"memory": "1Gi"},
            },
            "priorityClassName": f"{label}-priority",
            "podAnnotations": {"example.com/who": label},
            "hostNetwork": True,
            "env": [{"name": "WHO", "value": label}],
        }
        values[key] = {**values.get(key, {}), **settings}
        wanted[f"{kind}/{name}"] = settings
    docs = render(values)
    specs = pod_specs(docs)
    assert set(specs) == set(wanted)
    for where, s in wanted.items():
        spec = specs[where]
        kind, name = where.split("/")
        meta = find(docs, kind, name)["spec"]["template"]["metadata"]
        (c,) = spec["containers"]
        assert s["nodeSelector"].items() <= spec["nodeSelector"].items(), where  # merged into the defaults
        assert spec["tolerations"] == s["tolerations"], where
        assert spec["affinity"] == s["affinity"], where
        assert spec["priorityClassName"] == s["priorityClassName"], where
        assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet", where
        assert c["resources"] == s["resources"], where
        assert meta["annotations"]["example.com/who"] == s["podAnnotations"]["example.com/who"], where
        env = [(e["name"], e.get("value")) for e in c["env"]]
        # the component's env, and the global extraEnv in every container, after the fixed variables
        assert env[-2:] == [("WHO", s["env"][0]["value"]), ("KUBERNETES_SERVICE_HOST", "10.0.0.1")], where


def test_env_values_are_strings():
    """`--set extraEnv[0].value=6443` gives helm a number; an EnvVar's value must be a string."""
    env = [{"name": "KUBERNETES_SERVICE_PORT", "value": 6443}, {"name": "B", "value": True}]
    docs = render({"extraEnv": env, "scheduler": {"env": [{"name": "C", "value": 1.5}]}})
    c = container(docs, "Deployment", "phalanx-scheduler")
    assert c["env"][1:] == [
        {"name": "C", "value": "1.5"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
        {"name": "B", "value": "true"},
    ]


def test_default_pod_settings_are_todays():
    docs = render(ALL_ON)
    specs = pod_specs(docs)
    assert specs["Deployment/phalanx-scheduler"]["priorityClassName"] == "system-cluster-critical"
    assert specs["Deployment/phalanx-webhook"]["priorityClassName"] == "system-cluster-critical"
    for ds in ("DaemonSet/phalanx-node-discover", "DaemonSet/phalanx-device-plugin"):
        assert specs[ds]["priorityClassName"] == "system-node-critical"
        assert specs[ds]["tolerations"] == [{"operator": "Exists"}]
    for ds in ("DaemonSet/phalanx-device-plugin", "DaemonSet/phalanx-cache"):
        assert specs[ds]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert not any(s.get("hostNetwork") for s in specs.values())
    sched = container(docs, "Deployment", "phalanx-scheduler")
    assert sched["resources"] == {
        "requests": {"cpu": "500m", "memory": "512Mi"},
        "limits": {"memory": "3Gi"},
    }
    assert sched["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container(docs, "DaemonSet", "phalanx-device-plugin")["securityContext"]["runAsUser"] == 0


# ------------------------------------------------------------------ flags and the names the code fixes


def test_every_container_s_args_parse_with_the_real_cli():
    for values in CASES.values():
        docs = render(values)
        for d in docs:
            if d["kind"] in ("Deployment", "DaemonSet"):
                for c in d["spec"]["template"]["spec"]["containers"]:
                    parse_cli(c["args"])  # raises on an unknown flag or a bad value


def test_scheduler_flags_follow_the_values():
    docs = render(namespace="ml-sched")
    params = parse_cli(container(docs, "Deployment", "phalanx-scheduler")["args"])
    assert params["in_cluster"] and params["leader_elect"]
    assert (params["scheduler_name"], params["profile"], params["gpu_shares"]) == (
        "phalanx",
        "phalanx-queues",
        "off",
    )
    assert (params["lease_namespace"], params["lease_duration"], params["cycle_seconds"]) == (
        "ml-sched",
        15,
        1.0,
    )
    values = {
        "scheduler": {
            "name": "gpu-sched",
            "gpuShares": "reservation",
            "cycleSeconds": 0.5,
            "leaseDurationSeconds": 30,
            "customProfile": "name: mine\n",
            "extraArgs": ["--kueue=off", "--share-limit-env"],
        }
    }
    docs = render(values, namespace="ml-sched")
    c = container(docs, "Deployment", "phalanx-scheduler")
    p = parse_cli(c["args"])
    assert (p["scheduler_name"], p["gpu_shares"], p["cycle_seconds"], p["lease_duration"]) == (
        "gpu-sched",
        "reservation",
        0.5,
        30,
    )
    assert (p["reservation_namespace"], p["kueue"], p["share_limit_env"]) == ("ml-sched", "off", True)
    assert p["profile"] == "/etc/phalanx/profile/profile.yaml"
    profile = find(docs, "ConfigMap", "phalanx-scheduler-profile")
    assert profile["data"] == {"profile.yaml": "name: mine\n"}
    spec = find(docs, "Deployment", "phalanx-scheduler")["spec"]["template"]["spec"]
    assert {"name": "profile", "configMap": {"name": "phalanx-scheduler-profile"}} in spec["volumes"]
    assert {"name": "profile", "mountPath": "/etc/phalanx/profile", "readOnly": True} in c["volumeMounts"]
    # the webhook serves the same scheduler's pods
    hook = parse_cli(container(docs, "Deployment", "phalanx-webhook")["args"])
    assert hook["scheduler_name"] == "gpu-sched"
    (wh,) = find(docs, "MutatingWebhookConfiguration", "phalanx-gpu-shares")["webhooks"]
    assert wh["matchConditions"][0]["expression"].endswith("== 'gpu-sched'")


def test_scheduler_probes_metrics_and_service():
    docs = render()
    dep = find(docs, "Deployment", "phalanx-scheduler")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["ports"] == [{"name": "https", "containerPort": 8080}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert not any(a.startswith(("--insecure-metrics", "--tls-")) for a in c["args"])  # self-made cert
    notes = dep["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/port"] == "8080"
    assert notes["prometheus.io/scheme"] == "https"
    svc = find(docs, "Service", "phalanx-scheduler-metrics")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [{"name": "https", "port": 8080, "targetPort": "https"}]
    # the viewers: get on the two non-resource URLs, bound to the phalanx-viewer group
    viewer = find(docs, "ClusterRole", "phalanx-metrics-viewer")
    assert viewer["rules"] == [
        {"nonResourceURLs": ["/metrics", "/dashboard", "/dashboard/*"], "verbs": ["get"]}
    ]
    binding = find(docs, "ClusterRoleBinding", "phalanx-metrics-viewer")
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "phalanx-viewer"}
    ]
    # plain HTTP only when asked; a provided certificate from a Secret
    plain = find(render({"scheduler": {"insecureMetrics": True}}), "Deployment", "phalanx-scheduler")
    pc = plain["spec"]["template"]["spec"]["containers"][0]
    assert "--insecure-metrics" in pc["args"] and pc["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    given = find(render({"scheduler": {"tlsSecret": "sched-tls"}}), "Deployment", "phalanx-scheduler")
    gs = given["spec"]["template"]["spec"]
    assert "--tls-cert-file=/etc/phalanx/tls/tls.crt" in gs["containers"][0]["args"]
    assert {"name": "tls", "secret": {"secretName": "sched-tls"}} in gs["volumes"]
    hook_svc = find(docs, "Service", "phalanx-webhook")
    assert (
        hook_svc["spec"]["selector"]
        == find(docs, "Deployment", "phalanx-webhook")["spec"]["selector"]["matchLabels"]
    )


def test_names_the_code_fixes_are_the_charts():
    """The Lease, the webhook's Secret and configuration, the reservation pods' account and
    PriorityClass: no flag names them, so the chart must use the code's own names."""
    import inspect

    from phalanx.k8s.act.shares import reservation_pod
    from phalanx.k8s.admission.webhook import SECRET, WEBHOOK_CONFIG
    from phalanx.k8s.config import AdapterConfig
    from phalanx.k8s.loop.leader import LeaderElector
    from phalanx.k8s.loop.service import CONFIGMAP

    lease = inspect.signature(LeaderElector).parameters["name"].default
    for release in ("phalanx", "team-b"):
        docs = render({"scheduler": {"gpuShares": "reservation"}}, release=release)
        full = "phalanx" if release == "phalanx" else "team-b-phalanx"
        role = find(docs, "Role", f"{full}-leader-election")
        assert [r["resourceNames"] for r in role["rules"] if "resourceNames" in r] == [[lease], [CONFIGMAP]]
        secret = find(docs, "Role", f"{full}-webhook")
        assert [r["resourceNames"] for r in secret["rules"] if "resourceNames" in r] == [[SECRET]]
        find(docs, "MutatingWebhookConfiguration", WEBHOOK_CONFIG)
        hook = find(docs, "ClusterRole", f"{full}-webhook")
        assert hook["rules"][0]["resourceNames"] == [WEBHOOK_CONFIG]
        pod = reservation_pod("n", 0, AdapterConfig())
        find(docs, "PriorityClass", pod["spec"]["priorityClassName"])
        find(docs, "ServiceAccount", pod["spec"]["serviceAccountName"])
        binding = find(docs, "RoleBinding", f"{full}-gpu-reservation")
        assert binding["subjects"][0]["name"] == pod["spec"]["serviceAccountName"]
        args = parse_cli(container(docs, "Deployment", f"{full}-webhook")["args"])
        assert args["service"] == f"{full}-webhook" and args["cert_dir"] is None
        find(docs, "Service", args["service"])


# ------------------------------------------------------------------ webhook certificates


def test_webhook_self_certificate():
    docs = render()
    (wh,) = find(docs, "MutatingWebhookConfiguration", "phalanx-gpu-shares")["webhooks"]
    assert "caBundle" not in wh["clientConfig"]  # the webhook writes it; Helm never resets it
    assert (wh["failurePolicy"], wh["timeoutSeconds"], wh["sideEffects"]) == ("Fail", 5, "None")
    assert wh["clientConfig"]["service"] == {
        "name": "phalanx-webhook",
        "namespace": "phalanx-system",
        "path": "/mutate",
        "port": 443,
    }
    assert wh["matchConditions"] == [
        {
            "name": "phalanx-pods",
            "expression": "has(object.spec.schedulerName) && object.spec.schedulerName == 'phalanx'",
        }
    ]
    # an upgrade that changes the configuration restarts the webhook, which re-patches the caBundle
    a = find(docs, "Deployment", "phalanx-webhook")["spec"]["template"]["metadata"]["annotations"]
    b = find(render({"scheduler": {"name": "other"}}), "Deployment", "phalanx-webhook")
    assert (
        a["checksum/webhook-configuration"]
        != b["spec"]["template"]["metadata"]["annotations"]["checksum/webhook-configuration"]
    )


def test_webhook_cert_manager_certificate():
    docs = render({"webhook": {"certificate": {"mode": "certManager"}}}, release="ml", namespace="ml-sched")
    cert = find(docs, "Certificate", "ml-phalanx-webhook")
    assert cert["metadata"]["namespace"] == "ml-sched"
    assert cert["spec"]["dnsNames"] == [
        "ml-phalanx-webhook.ml-sched.svc",
        "ml-phalanx-webhook.ml-sched.svc.cluster.local",
    ]
    issuer = find(docs, "Issuer", "ml-phalanx-webhook-selfsigned")
    assert issuer["spec"] == {"selfSigned": {}}
    assert cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": "ml-phalanx-webhook-selfsigned"}
    mwc = find(docs, "MutatingWebhookConfiguration", "ml-phalanx-gpu-shares")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "ml-sched/ml-phalanx-webhook"
    dep = find(docs, "Deployment", "ml-phalanx-webhook")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert parse_cli(c["args"])["cert_dir"] is not None and "--cert-dir=/certs" in c["args"]
    assert c["volumeMounts"] == [{"name": "certs", "mountPath": "/certs", "readOnly": True}]
    (vol,) = dep["spec"]["template"]["spec"]["volumes"]
    assert vol["secret"]["secretName"] == cert["spec"]["secretName"]
    # no ca.crt in the folder: the webhook never reads or writes the configuration, so no RBAC at all
    assert [i["key"] for i in vol["secret"]["items"]] == ["tls.crt", "tls.key"]
    assert [d["kind"] for d in component(docs, "webhook") if "Role" in d["kind"]] == []
    ref = {"kind": "ClusterIssuer", "name": "corp-ca", "group": "cert-manager.io"}
    docs = render({"webhook": {"certificate": {"mode": "certManager", "certManager": {"issuerRef": ref}}}})
    assert find(docs, "Certificate", "phalanx-webhook")["spec"]["issuerRef"] == ref
    assert not [d for d in docs if d["kind"] == "Issuer"]


def test_webhook_provided_certificate():
    docs = render(PROVIDED)
    (wh,) = find(docs, "MutatingWebhookConfiguration", "phalanx-gpu-shares")["webhooks"]
    assert wh["clientConfig"]["caBundle"] == CA
    dep = find(docs, "Deployment", "phalanx-webhook")
    (vol,) = dep["spec"]["template"]["spec"]["volumes"]
    assert vol["secret"]["secretName"] == "my-tls"
    assert [d["kind"] for d in component(docs, "webhook") if "Role" in d["kind"]] == []
    assert not [d for d in docs if d["apiVersion"].startswith("cert-manager.io")]


# ------------------------------------------------------------------ RBAC, namespaces, releases


def test_no_role_grants_a_wildcard():
    for values in CASES.values():
        for d in render(values):
            if d["kind"] in ("ClusterRole", "Role"):
                for rule in d["rules"]:
                    for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                        assert "*" not in rule.get(field, []), (d["metadata"]["name"], rule)


def test_bindings_name_accounts_and_roles_the_chart_makes():
    docs = render(ALL_ON, namespace="ml-sched")
    accounts = {
        (d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs if d["kind"] == "ServiceAccount"
    }
    roles = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in ("Role", "ClusterRole")}
    for d in docs:
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert (d["roleRef"]["kind"], d["roleRef"]["name"]) in roles, d["metadata"]["name"]
            for s in d["subjects"]:
                if s["kind"] == "Group":  # the viewers (scheduler.viewerGroup): people, not our accounts
                    continue
                assert (s["namespace"], s["name"]) in accounts, d["metadata"]["name"]
    for spec in pod_specs(docs).values():
        assert ("ml-sched", spec["serviceAccountName"]) in accounts


def test_every_namespaced_object_is_in_the_release_namespace():
    for values in CASES.values():
        docs = render(values, namespace="ml-sched")
        for d in docs:
            ns = d["metadata"].get("namespace")
            if d["kind"] in CLUSTER_KINDS:
                assert ns is None, d["metadata"]["name"]
            else:
                assert ns == "ml-sched", f"{d['kind']}/{d['metadata']['name']}"
        assert "phalanx-system" not in json.dumps(docs), "a namespace the release did not choose"


def _cluster_names(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    # CRDs are shared by every release by design; Queues are named by the user
    skip = {"CustomResourceDefinition", "Queue"}
    return {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in CLUSTER_KINDS - skip}


def test_two_releases_have_no_clashing_cluster_scoped_names():
    cm = {**ALL_ON, "webhook": {"certificate": {"mode": "certManager"}}}
    a = render(cm, release="phalanx", namespace="phalanx-system")
    b = render({**cm, "reservations": {"createPriorityClass": False}}, release="team-b", namespace="team-b")
    assert _cluster_names(a) and not _cluster_names(a) & _cluster_names(b)
    # mode self: the webhook patches the caBundle of one configuration whose name the code fixes,
    # so that configuration (documented: one such release per cluster) is the only clash
    a, b = render(release="phalanx"), render(release="team-b", namespace="team-b")
    assert _cluster_names(a) & _cluster_names(b) == {("MutatingWebhookConfiguration", "phalanx-gpu-shares")}


def test_two_releases_in_one_namespace_differ_except_where_the_code_fixes_names():
    a = render(ALL_ON, release="phalanx")
    b = render({**ALL_ON, "reservations": {"createPriorityClass": False}}, release="team-b")
    names = {(d["kind"], d["metadata"]["name"]) for d in a if d["kind"] not in CLUSTER_KINDS}
    other = {(d["kind"], d["metadata"]["name"]) for d in b if d["kind"] not in CLUSTER_KINDS}
    # the reservation pods' account: named by the scheduler (and the Lease and the webhook's Secret,
    # which the chart does not make, are shared too: one release per namespace, as values.yaml says)
    assert names & other == {("ServiceAccount", "phalanx-gpu-reservation")}


# ------------------------------------------------------------------ queues, NOTES


def test_queues_from_values_are_valid_queue_objects():
    """deploy/examples/queues.yaml given as values renders the same Queues, valid for our CRD."""
    example = [d for d in yaml.safe_load_all((ROOT / "deploy" / "examples" / "queues.yaml").read_text()) if d]
    values = {"queues": [{"name": d["metadata"]["name"], "spec": d["spec"]} for d in example]}
    docs = {d["metadata"]["name"]: d for d in render(values) if d["kind"] == "Queue"}
    assert {n: d["spec"] for n, d in docs.items()} == {d["metadata"]["name"]: d["spec"] for d in example}
    schema = as_json_schema(crd_schemas()[("scheduling.phalanx.io/v1alpha1", "Queue")])
    for d in docs.values():
        jsonschema.validate(d, schema)


def test_notes_say_what_was_installed_and_how_to_use_it():
    res = run_helm("install", "phalanx", str(CHART), "-n", "phalanx-system", "--dry-run=client")
    assert res.returncode == 0, res.stderr
    notes = res.stdout[res.stdout.index("NOTES:") :]
    for text in (
        "phalanx-scheduler",
        "phalanx-webhook",
        "phalanx-node-discover",
        "schedulerName: phalanx",
        "phalanx status",
    ):
        assert text in notes, text


def test_discovery_reads_the_kubelet_config_file_only_when_named():
    def spec(values: dict) -> dict:
        return find(render(values), "DaemonSet", "phalanx-node-discover")["spec"]["template"]["spec"]

    plain = spec({})
    assert not any(a.startswith("--kubelet-config") for a in plain["containers"][0]["args"])
    assert [v["name"] for v in plain["volumes"]] == ["sys"]
    named = spec({"discover": {"kubeletConfig": "/var/lib/kubelet/config.yaml"}})
    (c,) = named["containers"]
    assert "--kubelet-config=/host/kubelet-config.yaml" in c["args"]
    assert {"name": "kubelet-config", "mountPath": "/host/kubelet-config.yaml", "readOnly": True} in c[
        "volumeMounts"
    ]
    assert {
        "name": "kubelet-config",
        "hostPath": {"path": "/var/lib/kubelet/config.yaml", "type": "File"},
    } in named["volumes"]


def test_mig_recuts_and_mig_devices_get_what_they_need_and_only_when_asked():
    """The agent that cuts MIG GPUs runs privileged (NVML's MIG calls) with kubelet's PodResources
    socket, may list pods and write Events; the MIG device plugin reads PodResources. Off by default."""
    docs = render(ALL_ON)
    agent = container(docs, "DaemonSet", "phalanx-node-discover")
    params = parse_cli(agent["args"])
    assert params["mig_recut"] and str(params["pod_resources_socket"]) == "/host/pod-resources/kubelet.sock"
    assert agent["securityContext"] == {"privileged": True}
    rules = find(docs, "ClusterRole", "phalanx-node")["rules"]
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in rules
    plugin = container(docs, "DaemonSet", "phalanx-device-plugin")
    assert parse_cli(plugin["args"])["mig_strategy"] == "mixed"
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    assert mounts["pod-resources"] == "/var/lib/kubelet/pod-resources"
    assert parse_cli(container(docs, "Deployment", "phalanx-webhook")["args"])["mps_shares"]
    plain = render({"devicePlugin": {"enabled": True}})
    agent = container(plain, "DaemonSet", "phalanx-node-discover")
    assert (
        not parse_cli(agent["args"])["mig_recut"]
        and agent["securityContext"]["allowPrivilegeEscalation"] is False
    )
    assert [r["resources"] for r in find(plain, "ClusterRole", "phalanx-node")["rules"]] == [["nodes"]]
    assert parse_cli(container(plain, "DaemonSet", "phalanx-device-plugin")["args"])["mig_strategy"] == "none"
