"""Least privilege, proven: each component runs as its own service account with the chart's RBAC on
a real kube-apiserver that audits every request; then each account's roles must grant exactly
what it called (no '*', no rule unused but those listed below with the reason), each rule with a
comment saying why.

One tour covers every component: the scheduler (gang, preemption, DRA claim, GPU shares with
reservation pods, a staging request, PodGroup and Queue status, Events, its Lease and attained
service, a reviewed caller of /metrics), the webhook (its certificate Secret and the caBundle of
its configuration; with the chart's --distcache-root, the Dataset of a pod it gates), discovery on
a node, the device plugin's pod marks, the dataset cache agent, a reservation pod reporting its
GPU, and `phalanx distcache` (one look over a distributed Dataset behind S3 credentials, cached in
a real SeaweedFS of one volume server: Datasets listed, the Secret read, the status patched, the
held pod told why it waits, its gate lifted and told it may start). The chart is rendered with
distcache.enabled; only its service accounts and RBAC are applied, not the SeaweedFS workloads.
Without a `weed` binary the tour skips (fails with PHALANX_REQUIRE_S3=1).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import rbac_audit
from e2e_kube import ROOT, Kube
from helm_chart import CHART, render
from phalanx.k8s.lab.localcluster import ControlPlane, Unavailable
from phalanx.node.objectstore import Unavailable as NoWeed
from rbac_tour import NS, Engine, Hook, distcache_tour, node_side, scheduler_tour, shadow_tour, token
from test_e2e_native import GATES

pytestmark = pytest.mark.e2e
# Kubernetes' own PodGroups served, so that the scheduler's watch of them is audited too
NATIVE_GANGS = (f"--feature-gates={GATES}", "--runtime-config=scheduling.k8s.io/v1alpha2=true")
VALUES = {
    "scheduler": {"gpuShares": "reservation"},
    "devicePlugin": {"enabled": True},
    "cache": {"enabled": True},
    "shadow": {"enabled": True},
    "distcache": {"enabled": True},  # its RBAC objects only: the SeaweedFS workloads are not run
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
# Kubernetes 1.37's CompositePodGroup (scheduling.k8s.io/v1alpha3): the v1.36 server here does not serve
# it, so nothing lists it; its reading is tested in tests/test_k8s_native_v1beta1.py.
_CPG = "1.37's CompositePodGroup, not served by this v1.36 server"
UNUSED_HERE |= {
    (account, "scheduling.k8s.io", "compositepodgroups", verb): _CPG
    for account in ("phalanx-scheduler", "phalanx-shadow")
    for verb in ("list", "watch")
}
UNUSED_HERE[("phalanx-scheduler", "scheduling.k8s.io", "compositepodgroups/status", "patch")] = _CPG
# The cache agent tells a pod whose dataset cannot be cached; the tour's dataset stages fine
UNUSED_HERE[("phalanx-cache", "", "events", "create")] = (
    "a pod whose dataset cannot be cached (tests/test_e2e_datasets.py, bad credentials)"
)
# A PodGroup looked up when its pods came first on the watches (tests/test_e2e_group_race.py); the
# tour makes its PodGroups before their pods, so it asks for none of them
_LOOKUP = "a PodGroup its watch had not delivered when its pods came (tests/test_e2e_group_race.py)"
UNUSED_HERE |= {
    ("phalanx-scheduler", g, "podgroups", "get"): _LOOKUP
    for g in ("scheduling.phalanx.io", "scheduling.run.ai", "scheduling.volcano.sh", "scheduling.x-k8s.io")
}
# A pod's extended resources served by DRA (KEP-5004): the tour's pod "extended" has its claim made
# and named in its status; patch only removes the finalizer of a claim whose bind then failed
UNUSED_HERE[("phalanx-scheduler", "resource.k8s.io", "resourceclaims", "patch")] = (
    "a claim made for extended resources whose bind failed (tests/test_k8s_extended.py)"
)
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
        n: str(kube.cp.kubeconfig_for_token(token(kube, f"phalanx-{n}"), n))
        for n in (
            "scheduler",
            "webhook",
            "node",
            "device-plugin",
            "cache",
            "gpu-reservation",
            "shadow",
            "distcache",
        )
    }
    tmp = tmp_path_factory.mktemp("tour")
    with Engine() as engine:  # SeaweedFS starts while the scheduler's leg runs
        with Hook(kube, docs, cfgs["webhook"]):
            scheduler_tour(kube, cfgs, tmp)
            try:
                engine.ready()
            except NoWeed as e:
                if os.environ.get("PHALANX_REQUIRE_S3") == "1":
                    pytest.fail(f"PHALANX_REQUIRE_S3=1 but {e}")
                pytest.skip(f"no SeaweedFS for phalanx distcache: {e}")
            distcache_tour(kube, cfgs["distcache"], engine)  # the webhook gates its pod
            engine.close()  # and it stops while the other legs run
        node_side(kube, cfgs, tmp)
        shadow_tour(kube, cfgs["shadow"])
    return rbac_audit.uses(log, NS)


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
