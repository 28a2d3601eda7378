"""Least privilege, proven: each component runs as its own service account with the chart's RBAC on
a real kube-apiserver that audits every request; then each account's roles must grant exactly
what it called (no '*', no rule unused but those listed below with the reason), each rule with a
comment saying why.

One tour covers every component: the scheduler (gang, preemption, DRA claim, GPU shares with
reservation pods, a staging request, PodGroup and Queue status, Events, its Lease and attained
service, a reviewed caller of /metrics), the webhook (its certificate Secret and the caBundle of
its configuration), discovery on a node, the device plugin's pod marks, the dataset cache agent
and a reservation pod reporting its GPU.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig

import fake_nvml
import fake_sysfs
import rbac_audit
from dra_kube import device_classes, dgx_slices, pairs_template, with_claim
from e2e_kube import ROOT, SERVICE_ACCOUNTS, Kube, wait_for
from helm_chart import CHART, render
from kube_objects import node, pod, pod_group, queue
from phalanx.k8s import keys
from phalanx.k8s.api import Api
from phalanx.k8s.authn import Guard, tls_context
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.localcluster import ControlPlane, Unavailable
from phalanx.k8s.scheduler import Scheduler
from phalanx.k8s.server import serve
from phalanx.k8s.shadow import Shadow
from phalanx.k8s.webhook import CertSource, Webhook
from phalanx.profiles import load_profile
from test_e2e_native import GATES
from test_e2e_shares import _mutated

pytestmark = pytest.mark.e2e
# Kubernetes' own PodGroups served, so that the scheduler's watch of them is audited too
NATIVE_GANGS = (f"--feature-gates={GATES}", "--runtime-config=scheduling.k8s.io/v1alpha2=true")
NS = "phalanx-system"
VALUES = {
    "scheduler": {"gpuShares": "reservation"},
    "devicePlugin": {"enabled": True},
    "cache": {"enabled": True},
    "shadow": {"enabled": True},
}
# Granted, not (always) called in this tour, each with the reason it stays: (account, group,
# resource, verb) -> why.
UNUSED_HERE = {
    ("phalanx-scheduler", "", "pods", "get"): "a pod read afresh before a bind is retried (executor)",
    ("phalanx-scheduler", "resource.k8s.io", "resourceclaims", "get"): "a claim re-read after a conflict",
    ("phalanx-scheduler", "", "configmaps", "patch"): "a share's ConfigMap already there (a retried bind)",
    ("phalanx-webhook", "", "secrets", "update"): "the certificate renewed near its end (checkSeconds)",
    ("phalanx-scheduler", "scheduling.k8s.io", "podgroups/status", "patch"): "Kubernetes' own gangs' "
    "conditions: tests/test_e2e_native.py",
}
# Asked by the API server itself, inside another request: (account, group, resource, verb) -> the
# request that implies it.
IMPLIED = {
    ("phalanx-scheduler", "resource.k8s.io", "resourceclaims/binding", "patch"): (
        "resource.k8s.io",
        "resourceclaims/status",
        "patch",
    ),
}
# Refused (403) on purpose: the component reads the refusal as an answer.
REFUSED = {
    ("phalanx-scheduler", "", "namespaces", "get"): "the Lease namespace probe: 403 means 'ask the Lease'",
}


def _token(kube: Kube, name: str) -> str:
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    return str(kube.api.request("POST", SERVICE_ACCOUNTS.path(NS, name, "token"), body)["status"]["token"])


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kube, Path]]:
    """A control plane of its own that audits the release namespace's service accounts."""
    args, log = rbac_audit.audit_args(tmp_path_factory.mktemp("audit"), NS)
    try:
        cp = ControlPlane(apiserver_args=(*args, *NATIVE_GANGS)).start()
    except Unavailable as e:
        pytest.skip(f"no Kubernetes control plane: {e}")
    kube = Kube(cp)
    try:
        kube.install_crds(sorted((ROOT / "deploy" / "helm" / "phalanx" / "crds").glob("*.yaml")))
        kube.dialects("kai", "volcano", "scheduler-plugins", "kueue")
        yield kube, log
    finally:
        kube.close()
        cp.stop()


@pytest.fixture(scope="module")
def tour(audited: tuple[Kube, Path], tmp_path_factory: pytest.TempPathFactory) -> set[rbac_audit.Use]:
    """Runs every component through its calls; returns what the audit log recorded."""
    kube, log = audited
    docs = render(VALUES)
    kube.ensure_namespace(NS)
    for d in docs:
        if d["kind"] in ("ServiceAccount", "PriorityClass", *rbac_audit.ROLES, *rbac_audit.BINDINGS):
            kube.apply(d)
    cfgs = {
        n: str(kube.cp.kubeconfig_for_token(_token(kube, f"phalanx-{n}"), n))
        for n in ("scheduler", "webhook", "node", "device-plugin", "cache", "gpu-reservation", "shadow")
    }
    tmp = tmp_path_factory.mktemp("tour")
    with _Hook(kube, docs, cfgs["webhook"]):
        _scheduler_tour(kube, cfgs, tmp)
    _node_side(kube, cfgs, tmp)
    _shadow(kube, cfgs["shadow"])
    return rbac_audit.uses(log, NS)


class _Hook:
    def __init__(self, kube: Kube, docs: list[dict[str, Any]], cfg: str) -> None:
        self.kube = kube
        self.api = Api.connect(kubeconfig=cfg)
        self.hook = Webhook(
            CertSource(self.api, NS, "phalanx-webhook", extra_names=("127.0.0.1",)),
            AdapterConfig(),
            "127.0.0.1",
            0,
        )
        for d in docs:
            if d["kind"] == "MutatingWebhookConfiguration":
                for h in d["webhooks"]:
                    h["clientConfig"] = {"url": f"https://127.0.0.1:{self.hook.port}/mutate"}
                kube.apply(d)
        self.hook.refresh()  # the CA into the configuration just applied (get, update)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.hook.serve, args=(self.stop, 3600.0), daemon=True)

    def __enter__(self) -> _Hook:
        self.thread.start()
        probe = pod("probe", annotations={"gpu-fraction": "0.5"})
        wait_for("the API server to call the webhook", lambda: _mutated(self.kube, probe) is True, timeout=30)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.api.close()


def _classed(name: str, gpus: int, cls: str, where: str) -> dict[str, Any]:
    p = pod(name, gpus=gpus)
    del p["spec"]["priority"]
    p["spec"] |= {"priorityClassName": cls, "nodeSelector": {"pool": where}}
    return p


def _on(p: dict[str, Any], where: str) -> dict[str, Any]:
    p["spec"]["nodeSelector"] = {"pool": where}
    return p


def _scheduler_tour(kube: Kube, cfgs: dict[str, str], tmp: Path) -> None:
    for name, value in (("rbac-low", 0), ("rbac-high", 1000)):
        kube.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )
    for n, gpus in (("gang", 8), ("preempt", 4), ("share", 8), ("stage", 8)):
        kube.api.create("nodes", node(f"{n}-0", gpus=gpus, labels={"pool": n}))
    bare = node("dra-0", gpus=0)
    bare["metadata"]["labels"] = {"pool": "dra"}  # its GPUs only DRA publishes
    kube.api.create("nodes", bare)
    for c in device_classes():
        kube.create(c)
    for s in dgx_slices("dra-0"):
        kube.create(s)
    kube.create(pairs_template("pairs"))
    kube.create(queue("team", 8))
    kube.create(pod_group("g", 2, queue="team"))
    for k in range(2):
        kube.create(_on(pod(f"g-{k}", gpus=4, annotations={"phalanx.io/pod-group": "g"}), "gang"))
    kube.create(_classed("low", 4, "rbac-low", "preempt"))
    kube.create(_on(with_claim(pod("claims"), "pairs"), "dra"))
    kube.create(_on(pod("busy", gpus=8, annotations={keys.ESTIMATED_RUNTIME: "600"}), "stage"))
    _dataset(kube)
    api = Api.connect(kubeconfig=cfgs["scheduler"])
    settings = {
        "cycle_seconds": 0.2,
        "rediscover_seconds": 1.0,
        "gpu_shares": "reservation",
        "reservation_namespace": NS,
        "lease_namespace": NS,
        "service_save_s": 0.5,
    }
    s = Scheduler(api, AdapterConfig(profile="phalanx-queues", **settings), load_profile("phalanx-queues"))
    s.start()
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    try:
        _bound(kube, "g-0", "g-1", "low", "claims", "busy")
        kube.run_pod("low")
        kube.create(_classed("high", 4, "rbac-high", "preempt"))  # evicts low
        wait_for(
            "low evicted",
            lambda: (kube.pods().get("low") or {}).get("metadata", {}).get("deletionTimestamp"),
            timeout=30,
        )
        kube.force_delete_pod("low")
        kube.create(_on(pod("next", gpus=8, annotations={keys.DATASET: "imagenet"}), "stage"))
        wait_for(
            "a staging request",
            lambda: (
                keys.STAGE_DATASETS
                in ((kube.api.get("nodes", "stage-0") or {})["metadata"].get("annotations") or {})
            ),
            timeout=30,
        )
        _share(kube, cfgs["gpu-reservation"], tmp)
        _reviewed_caller(kube, s, api)
        wait_for(
            "attained service saved",
            lambda: kube.api.get("configmaps", "phalanx-attained-service", NS),
            timeout=20,
        )
        s.explainer.flush()
        wait_for("high bound", lambda: kube.node_of("high"), timeout=30)
    finally:
        s.close()
        t.join(timeout=10)
        api.close()


def _bound(kube: Kube, *names: str) -> None:
    try:
        wait_for(f"{', '.join(names)} bound", lambda: all(kube.node_of(p) for p in names), timeout=60)
    except AssertionError as e:
        why = {n: kube.events(n) for n in names if not kube.node_of(n)}
        raise AssertionError(f"{e}: {why}") from None


def _share(kube: Kube, reservation_cfg: str, tmp: Path) -> None:
    """A half-GPU pod: its reservation pod made, reporting its GPU, the share bound, then gone."""
    kube.create(_on(pod("half", annotations={"gpu-fraction": "0.5"}), "share"))

    def reservation() -> str:
        held = [
            n for n, p in kube.pods(NS).items() if keys.GPU_RESERVATION in p["metadata"].get("labels", {})
        ]
        return held[0] if held else ""

    try:
        name = wait_for("a reservation pod", reservation, timeout=30)
    except AssertionError as e:
        raise AssertionError(f"{e}: {kube.events('half')} {kube.pods()['half']['metadata']}") from None
    from phalanx.node import reserve

    fake_nvml.CONFIG = {
        "gpus": [{"uuid": "GPU-r0", "name": "NVIDIA H100", "memory_mib": 81559, "bus_id": "0000:01:00.0"}]
    }
    try:
        with Client(KubeConfig.from_file(reservation_cfg)) as c:
            reserve.run(c, NS, name, "fake_nvml", once=True)
    finally:
        fake_nvml.CONFIG = None
    kube.run_pod(name, NS)
    wait_for("the share bound", lambda: kube.node_of("half") == "share-0", timeout=30)
    kube.force_delete_pod("half")
    wait_for("its reservation pod deleted", lambda: not reservation(), timeout=30)


def _reviewed_caller(kube: Kube, s: Scheduler | Shadow, api: Api) -> None:
    """/metrics asked for with a token: a TokenReview and a SubjectAccessReview, sent as `api`'s account."""
    server = serve(
        0,
        s.metrics,
        s.ready,
        s.board,
        guard=Guard(api),
        tls=tls_context(None, None, ("127.0.0.1",)),
        address="127.0.0.1",
    )
    try:
        with httpx2.Client(verify=False, timeout=10) as c:
            r = c.get(
                f"https://127.0.0.1:{server.server_port}/metrics",
                headers={"Authorization": f"Bearer {_token(kube, 'phalanx-cache')}"},
            )
        assert r.status_code == 403  # a known account, not a viewer
    finally:
        server.shutdown()


def _shadow(kube: Kube, cfg: str) -> None:
    """Shadow mode beside another scheduler: it reads what a cycle reads, and reviews its callers."""
    api = Api.connect(kubeconfig=cfg)
    s = Shadow(
        api,
        AdapterConfig(scheduler_name="default-scheduler", rediscover_seconds=1.0),
        load_profile("phalanx"),
    )
    s.start()
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    try:
        assert s.wait_synced(30), "the shadow could not list and watch with its role"
        _reviewed_caller(kube, s, api)
    finally:
        s.close()
        t.join(timeout=10)
        api.close()


def _dataset(kube: Kube) -> None:
    """A Dataset behind S3 credentials; the endpoint answers nothing, so staging fails (after the
    Secret is read), which the agent writes in the Dataset's status."""
    creds = {k: base64.b64encode(b"x").decode() for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s3-creds", "namespace": "default"},
            "data": creds,
        }
    )
    spec = {
        "source": "s3://bucket/imagenet",
        "endpoint": "http://127.0.0.1:9",
        "secretRef": {"name": "s3-creds"},
    }
    kube.apply(
        {
            "apiVersion": "scheduling.phalanx.io/v1alpha1",
            "kind": "Dataset",
            "metadata": {"name": "imagenet", "namespace": "default"},
            "spec": spec,
        }
    )


def _node_side(kube: Kube, cfgs: dict[str, str], tmp: Path) -> None:
    from phalanx.node import agent
    from phalanx.node.cacheagent import CacheAgent, open_store
    from phalanx.node.deviceplugin import ApiPods, GpuDevice, Plugin

    fake_nvml.CONFIG = {"gpus": fake_sysfs.dgx(tmp / "sys")}
    try:
        with Client(KubeConfig.from_file(cfgs["node"])) as c:
            agent.run(c, "gang-0", tmp / "sys", "fake_nvml", 0, once=True)
    finally:
        fake_nvml.CONFIG = None
    with Client(KubeConfig.from_file(cfgs["device-plugin"])) as c:
        uuids = [f"GPU-{k}" for k in range(8)]
        plugin = Plugin([GpuDevice(k, uuids[k]) for k in range(8)], ApiPods(c, "gang-0"))
        chosen = plugin.prefer(uuids, [], 4)
        plugin.given_out(chosen)
    with Client(KubeConfig.from_file(cfgs["cache"])) as c:
        CacheAgent(c, "stage-0", open_store(tmp / "cache", 1 << 30)).look()


def _key(u: rbac_audit.Use) -> tuple[str, str, str, str]:
    return (u.account, u.group, u.resource, u.verb)


def test_no_rule_has_a_wildcard_and_every_rule_says_why() -> None:
    assert rbac_audit.wildcards(render(VALUES)) == []
    bad = {
        p.name: rbac_audit.unexplained_rules(p.read_text())
        for p in sorted((CHART / "templates").glob("*.yaml"))
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_every_call_was_granted_and_nothing_refused_but_the_probes(tour: set[rbac_audit.Use]) -> None:
    refused = sorted(u for u in tour if u.code == 403 and _key(u)[:4] not in REFUSED)
    assert refused == [], "\n".join(map(str, refused))
    assert {_key(u) for u in tour if u.code == 403} == set(REFUSED)
    grants = rbac_audit.grants(render(VALUES), NS)
    ungranted = sorted(u for u in tour if u.code != 403 and not any(g.allows(u) for g in grants))
    assert ungranted == [], "\n".join(map(str, ungranted))


def test_every_rule_of_every_account_is_used(tour: set[rbac_audit.Use]) -> None:
    grants = rbac_audit.grants(render(VALUES), NS)
    used = [u for u in tour if u.code != 403]
    unused = []
    for g in grants:
        for group, resource, verb in g.tuples():
            if (g.account, group, resource, verb) in UNUSED_HERE:
                continue
            implied = IMPLIED.get((g.account, group, resource, verb))
            if implied:
                probe = [
                    u for u in used if u.account == g.account and (u.group, u.resource, u.verb) == implied
                ]
            else:
                probe = [
                    u
                    for u in used
                    if (u.group, u.resource, u.verb) == (group, resource, verb) and g.allows(u)
                ]
            if not probe:
                unused.append(f"{g.account}: {verb} {group or 'core'}/{resource} ({g})")
    assert unused == [], "granted but never called:\n" + "\n".join(unused)
    granted = {(g.account, *t) for g in grants for t in g.tuples()}
    assert set(UNUSED_HERE) <= granted, f"listed, not granted: {sorted(set(UNUSED_HERE) - granted)}"
    print(json.dumps(sorted(str(u) for u in used), indent=1))
