"""The Helm chart installed, upgraded and uninstalled by helm itself, on a real kube-apiserver.

No kubelet runs here, so no pod of the release runs (the replicas are 0: nothing is left behind
for the next test); what is checked is what Helm and the API server do with the chart's objects:
they are accepted, Queues from the values exist, and the caBundle the webhook writes into its
configuration (mode self) survives `helm upgrade`, server-side apply or not.
"""

from __future__ import annotations

import base64

import pytest

from e2e_kube import Kube, wait_for
from helm_chart import CHART, run_helm
from phalanx.k8s.admission.webhook import WEBHOOK_CONFIG
from phalanx.k8s.client.kinds import NAMESPACES, OUR_QUEUES, WEBHOOK_CONFIGS

pytestmark = pytest.mark.e2e
NS = "phalanx-helm-e2e"
RELEASE = "helm-e2e"


def test_install_upgrade_uninstall_keep_the_webhook_ca_bundle(kube: Kube) -> None:
    def helm(*args: str) -> str:
        res = run_helm("--kubeconfig", str(kube.cp.kubeconfig), *args)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    values = [
        "--set",
        "scheduler.replicas=0,webhook.replicas=0,discover.enabled=false",
        "--set",
        "queues[0].name=helm-e2e-q,queues[0].spec.resources.gpu.quota=8",
    ]
    out = helm("install", RELEASE, str(CHART), "-n", NS, "--create-namespace", *values)
    try:
        assert "schedulerName: phalanx" in out and "phalanx status" in out  # the NOTES
        assert (kube.get(OUR_QUEUES, "helm-e2e-q") or {}).get("spec") == {"resources": {"gpu": {"quota": 8}}}
        cfg = kube.get(WEBHOOK_CONFIGS, WEBHOOK_CONFIG)
        assert cfg is not None and "caBundle" not in cfg["webhooks"][0]["clientConfig"]
        # what the webhook does at start (phalanx.k8s.admission.webhook.CertSource.publish_ca): a PUT
        bundle = base64.b64encode(b"a CA the webhook made").decode()
        for h in cfg["webhooks"]:
            h["clientConfig"]["caBundle"] = bundle
        kube.api.replace(WEBHOOK_CONFIGS, cfg)
        for name, apply in (("other", []), ("third", ["--server-side=false"])):
            helm(
                "upgrade",
                RELEASE,
                str(CHART),
                "-n",
                NS,
                "--reuse-values",
                "--set",
                f"scheduler.name={name}",
                *apply,
            )
            (hook,) = (kube.get(WEBHOOK_CONFIGS, WEBHOOK_CONFIG) or {})["webhooks"]
            assert hook["matchConditions"][0]["expression"].endswith(f"== '{name}'"), apply  # upgraded
            assert hook["clientConfig"].get("caBundle") == bundle, apply  # and the CA kept
    finally:
        helm("uninstall", RELEASE, "-n", NS)
        wait_for(
            "the webhook configuration removed", lambda: kube.get(WEBHOOK_CONFIGS, WEBHOOK_CONFIG) is None
        )
        kube.api.delete(NAMESPACES, NS)
    assert kube.get(OUR_QUEUES, "helm-e2e-q") is None
