"""On the real API server: who may read the scheduler's /metrics and dashboard, and attained service
that survives a restart of the scheduler."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from e2e_kube import SERVICE_ACCOUNTS, Kube, running, wait_for
from helm_chart import component, render
from kube_objects import node, pod, queue
from phalanx.k8s.client.api import Api
from phalanx.k8s.client.kinds import CONFIG_MAPS
from phalanx.k8s.loop.service import CONFIGMAP, KEY
from phalanx.k8s.view.authn import Guard, tls_context
from phalanx.k8s.view.server import serve

pytestmark = pytest.mark.e2e
NS = "phalanx-e2e-auth"


def _token(kube: Kube, ns: str, name: str) -> str:
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    tok = kube.api.request("POST", SERVICE_ACCOUNTS.path(ns, name, "token"), body)
    return str(tok["status"]["token"])


def _account(kube: Kube, name: str) -> str:
    kube.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NS}})
    return _token(kube, NS, name)


def _rbac(kind: str, name: str, **rest: Any) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": {"name": name}, **rest}


def test_unauthenticated_401_no_role_403_viewer_200_and_the_dashboard_filters_namespaces(kube: Kube) -> None:
    for ns in (NS, "team-a", "team-b", "phalanx-system"):
        kube.ensure_namespace(ns)
    # the chart's scheduler RBAC (TokenReview, SubjectAccessReview) and its viewer ClusterRole
    for doc in component(render(), "scheduler"):
        if doc["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
            kube.apply(doc)
    sa = kube.cp.kubeconfig_for_token(_token(kube, "phalanx-system", "phalanx-scheduler"), "phalanx-sa")
    viewer, nobody = _account(kube, "viewer"), _account(kube, "nobody")
    subject = {"kind": "ServiceAccount", "name": "viewer", "namespace": NS}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole"}
    kube.apply(
        _rbac(
            "ClusterRoleBinding",
            "e2e-viewer",
            roleRef=ref | {"name": "phalanx-metrics-viewer"},
            subjects=[subject],
        )
    )
    reader = _rbac(
        "Role", "pod-reader", rules=[{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    )
    reader["metadata"]["namespace"] = "team-a"
    kube.apply(reader)
    binding = _rbac(
        "RoleBinding", "pod-reader", roleRef=ref | {"kind": "Role", "name": "pod-reader"}, subjects=[subject]
    )
    binding["metadata"]["namespace"] = "team-a"
    kube.apply(binding)
    kube.api.create("nodes", node("n0", gpus=8))
    kube.create(pod("a", ns="team-a", gpus=16))  # never fit: they wait, with a reason
    kube.create(pod("b", ns="team-b", gpus=16))
    guard_api = Api.connect(kubeconfig=str(sa))  # the reviews are sent with the chart's scheduler rights
    with running(kube) as s:
        tls = tls_context(None, None, ("localhost", "127.0.0.1"))
        server = serve(0, s.metrics, s.ready, s.board, guard=Guard(guard_api), tls=tls, address="127.0.0.1")
        base = f"https://127.0.0.1:{server.server_port}"
        try:
            with httpx2.Client(verify=False, timeout=10) as c:

                def get(path: str, token: str | None = None) -> httpx2.Response:
                    return c.get(base + path, headers={"Authorization": f"Bearer {token}"} if token else {})

                assert get("/healthz").status_code == 200
                wait_for("ready", lambda: get("/readyz").status_code == 200)
                for path in ("/metrics", "/dashboard/", "/dashboard/state.json"):
                    assert get(path).status_code == 401, path
                    assert get(path, "not-a-token").status_code == 401, path
                    assert get(path, nobody).status_code == 403, path
                    assert get(path, viewer).status_code == 200, path
                assert "phalanx_binds_total" in get("/metrics", viewer).text

                def pending() -> Any:
                    st = json.loads(get("/dashboard/state.json", viewer).text)
                    every = json.loads(s.board.state_json())  # unfiltered: both wait
                    both = {r["workload"] for r in every.get("pending", [])} >= {"team-a/a", "team-b/b"}
                    return both and [r["workload"] for r in st.get("pending", [])]

                assert wait_for("the waiting workloads", pending, timeout=30, every=0.5) == ["team-a/a"]
                assert get("/dashboard/api/workload/team-b%2Fb", viewer).status_code == 404
                assert get("/dashboard/api/workload/team-a%2Fa", viewer).status_code == 200
        finally:
            server.shutdown()
            guard_api.close()


def test_attained_service_and_fair_share_history_survive_a_restart(kube: Kube) -> None:
    ns = "phalanx-e2e-service"
    kube.ensure_namespace(ns)
    kube.api.create("nodes", node("n0", gpus=8))
    kube.create(queue("default", 8))  # the queues' usage history is what fair share decays
    kube.create(pod("a", gpus=4))
    kube.create(pod("b", gpus=4))
    cfg = {"profile": "phalanx-queues", "lease_namespace": ns, "service_save_s": 0.5}
    with running(kube, **cfg) as s1:
        wait_for("a and b bound", lambda: kube.node_of("a") and kube.node_of("b"), timeout=30)
        kube.run_pod("a", started_s_ago=7200)  # a has run 2 h in this run: 8 GPU-hours
        kube.run_pod("b", started_s_ago=600)
        wait_for("both running", lambda: len(s1.service.running_totals()) == 2, timeout=20)
        (wa,) = [w for w in s1.service.running_totals() if w.endswith("/a")]
        (wb,) = [w for w in s1.service.running_totals() if w.endswith("/b")]
        # b ran 10 GPU-hours before it was preempted (an earlier run that the pods no longer show)
        s1.service.served[wb] = 36000.0
        # and a was evicted once for a preemptor shaped like b: the repeat guard remembers it
        snap = s1.carry.snap
        assert snap is not None
        s1.evicted_for[wa] = {snap.workloads[wb].demand_key: 1.8e9}

        def saved() -> Any:
            cm = kube.get(CONFIG_MAPS, CONFIGMAP, ns)
            d = json.loads(cm["data"][KEY]) if cm else {}
            return (
                d
                if wb in d.get("served", {})
                and len(d.get("running", {})) == 2
                and d.get("history")
                and wa in d.get("evictions", {})
                else None
            )

        try:
            before = wait_for("the leader's record", saved, timeout=20)
        except AssertionError:
            raise AssertionError(
                f"record: {(kube.get(CONFIG_MAPS, CONFIGMAP, ns) or {}).get('data')}"
            ) from None
    las_before = sorted(before["running"], key=before["running"].get)
    assert las_before == [wa, wb]  # b has more attained service: a first under LAS
    with running(kube, **cfg) as s2:  # a new scheduler: nothing in memory
        wait_for("a cycle", lambda: s2.cycles > 1, timeout=20)
        assert s2.service.served[wb] == 36000.0
        run = s2.service.running_totals()
        assert sorted(run, key=run.get) == las_before  # without the record, b (2,400 s) would go first
        assert run[wb] >= 36000.0 + 4 * 600
        hist = s2.service.history
        assert set(hist) == set(before["history"])
        for q, v in before["history"].items():
            assert hist[q].tolist() == pytest.approx(v, rel=1e-3)
        snap2 = s2.carry.snap
        assert snap2 is not None
        assert s2.evicted_for.get(wa) == {snap2.workloads[wb].demand_key: 1.8e9}  # read back by shape
