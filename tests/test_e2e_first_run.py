"""What broke on the first real API server (issue 8), each case on a real kube-apiserver.

1. no Lease namespace, 2. optional APIs absent, 3. a KAI queue as KAI documents it,
4. nodes without GPU Feature Discovery's memory label.
"""

from __future__ import annotations

import os
import socket

import pytest

from e2e_kube import CRDS, SERVICE_ACCOUNTS, Kube, phalanx, running, wait_for
from helm_chart import component, render
from kube_objects import node, pod, pod_group
from phalanx.k8s.client.kinds import LEASES, OUR_POD_GROUPS

DIALECT_CRDS = [
    "queues.scheduling.run.ai",
    "podgroups.scheduling.run.ai",
    "queues.scheduling.volcano.sh",
    "podgroups.scheduling.volcano.sh",
    "podgroups.scheduling.x-k8s.io",
]

pytestmark = pytest.mark.e2e


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200"}


def test_missing_lease_namespace_is_created_when_rbac_allows(kube: Kube) -> None:
    kube.api.create("nodes", node("n0"))
    kube.create(pod("p0", gpus=1))
    ns = "phalanx-e2e-leases"
    proc = phalanx(
        "scheduler",
        "--kubeconfig",
        str(kube.cp.kubeconfig),
        "--lease-namespace",
        ns,
        "--port",
        "0",
        "--identity",
        "solo",
        "--cycle-seconds",
        "0.2",
        env=_env(),
    )
    try:
        wait_for("the pod bound", lambda: kube.node_of("p0") == "n0", timeout=30)
        lease = kube.get(LEASES, "phalanx-scheduler", ns)
        assert lease is not None and lease["spec"]["holderIdentity"] == "solo"
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
    assert f"created the leader-election namespace {ns!r}" in out


def _service_account_kubeconfig(kube: Kube, without_groups: tuple[str, ...] = ()) -> str:
    """The scheduler's own service account with the Helm chart's RBAC for it (less the rules of
    `without_groups`)."""
    kube.ensure_namespace("phalanx-system")
    rbac = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    for doc in (d for d in component(render(), "scheduler") if d["kind"] in rbac):
        if doc.get("kind") == "ClusterRole":
            doc["rules"] = [r for r in doc["rules"] if not set(r.get("apiGroups", [])) & set(without_groups)]
        kube.apply(doc)
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    tok = kube.api.request(
        "POST", SERVICE_ACCOUNTS.path("phalanx-system", "phalanx-scheduler", "token"), body
    )
    return str(kube.cp.kubeconfig_for_token(tok["status"]["token"], "phalanx-sa"))


def test_missing_lease_namespace_without_rights_is_one_clear_error_and_exit_2(kube: Kube) -> None:
    cfg = _service_account_kubeconfig(kube)
    proc = phalanx(
        "scheduler", "--kubeconfig", cfg, "--lease-namespace", "no-such-namespace", "--port", "0", env=_env()
    )
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 2, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out
    assert (
        "may not use the Lease 'phalanx-scheduler' in the leader-election namespace 'no-such-namespace'"
        in errors[0]
    )
    assert "kubectl create namespace no-such-namespace" in errors[0] and "--no-leader-elect" in errors[0]
    assert "lease check failed" not in out  # no loop


@pytest.mark.parametrize("mode", [(), ("--shadow", "--insecure-metrics")], ids=["scheduler", "shadow"])
def test_a_port_already_taken_is_one_clear_error_and_exit_2(kube: Kube, mode: tuple[str, ...]) -> None:
    """A port held by another process (a port-forward left running, as walking try-it showed) was
    a 73-line traceback."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        proc = phalanx(
            "scheduler", "--kubeconfig", str(kube.cp.kubeconfig), "--no-leader-elect", *mode,
            "--bind-address", "127.0.0.1", "--port", port,
        )  # fmt: skip
        out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"--port: cannot listen on 127.0.0.1:{port}" in errors[0], out


def test_the_service_account_of_the_chart_can_schedule(kube: Kube) -> None:
    """The chart's scheduler RBAC grants what the scheduler calls on a real server (least privilege,
    for real)."""
    cfg = _service_account_kubeconfig(kube)
    kube.api.create("nodes", node("n0"))
    kube.create(pod_group("g", 2))
    for k in range(2):
        kube.create(pod(f"g-{k}", gpus=4, annotations={"scheduling.k8s.io/group-name": "g"}))
    proc = phalanx(
        "scheduler",
        "--kubeconfig",
        cfg,
        "--lease-namespace",
        "phalanx-system",
        "--port",
        "0",
        "--cycle-seconds",
        "0.2",
        env=_env(),
    )
    try:
        wait_for("the gang bound", lambda: all(kube.node_of(f"g-{k}") == "n0" for k in range(2)), timeout=30)
        wait_for(
            "the PodGroup status", lambda: (kube.get(OUR_POD_GROUPS, "g", "default") or {}).get("status")
        )
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
    assert "forbidden" not in out.lower(), out


def test_a_kind_rbac_denies_does_not_hold_scheduling(kube: Kube) -> None:
    """An older RBAC without the DRA rules: the DRA kinds are forbidden, plain pods are still placed."""
    cfg = _service_account_kubeconfig(kube, without_groups=("resource.k8s.io",))
    kube.api.create("nodes", node("n0"))
    kube.create(pod("plain", gpus=1))
    proc = phalanx(
        "scheduler", "--kubeconfig", cfg, "--lease-namespace", "phalanx-system", "--port", "0",
        "--cycle-seconds", "0.2", env=_env(),
    )  # fmt: skip
    try:
        wait_for("the pod bound", lambda: kube.node_of("plain") == "n0", timeout=30)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
        _service_account_kubeconfig(kube)  # put the full rules back for the other tests
    assert "resourceclaims failed (Forbidden" in out, out


def test_no_leader_election_needs_no_namespace(kube: Kube) -> None:
    kube.api.create("nodes", node("n0"))
    kube.create(pod("p0", gpus=1))
    proc = phalanx(
        "scheduler",
        "--kubeconfig",
        str(kube.cp.kubeconfig),
        "--no-leader-elect",
        "--lease-namespace",
        "never-made",
        "--port",
        "0",
        "--cycle-seconds",
        "0.2",
        env=_env(),
    )
    try:
        wait_for("the pod bound", lambda: kube.node_of("p0") == "n0", timeout=30)
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert kube.api.get_namespace("never-made") is None


def test_absent_optional_kinds_do_not_hold_scheduling_and_are_picked_up_when_installed(kube: Kube) -> None:
    kube.remove_crds([n for n in DIALECT_CRDS if kube.get(CRDS, n) is not None])
    kube.api.create("nodes", node("n0"))
    kube.create(pod("plain", gpus=1))
    with running(kube) as s:
        wait_for("the plain pod bound", lambda: kube.node_of("plain") == "n0", timeout=15)
        assert "scheduling.run.ai/v2/queues" in s.informers.absent
        kube.dialects("kai")  # the KAI CRDs appear while the scheduler runs
        kube.create(
            {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "team"}, "spec": {}}
        )
        kube.create(pod_group("kg", 2, api="scheduling.run.ai/v2alpha2", queue="team"))
        for k in range(2):
            kube.create(pod(f"kg-{k}", gpus=2, annotations={"pod-group-name": "kg"}))
        wait_for(
            "the KAI gang bound", lambda: all(kube.node_of(f"kg-{k}") == "n0" for k in range(2)), timeout=20
        )
        assert "scheduling.run.ai/v2/queues" in s.informers.watched()


def test_kai_queues_as_kai_documents_them_and_a_bad_queue_is_left_out_alone(kube: Kube) -> None:
    kube.dialects("kai")
    # KAI's quick start (docs/quickstart/default-queues.yaml): weights are plain numbers, -1 is "no limit"
    res = {r: {"quota": 0, "limit": -1, "overQuotaWeight": 1} for r in ("cpu", "gpu", "memory")}
    kube.create(
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": "default-parent-queue"},
            "spec": {"resources": res},
        }
    )
    kube.create(
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": "default-queue"},
            "spec": {"parentQueue": "default-parent-queue", "resources": res},
        }
    )
    kube.create(
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": "broken"},
            "spec": {"resources": {"gpu": {"quota": "lots"}}},
        }
    )
    kube.api.create("nodes", node("n0"))
    kube.create(pod("kai-pod", gpus=1, labels={"kai.scheduler/queue": "default-queue"}))
    kube.create(pod("victim", gpus=1, labels={"kai.scheduler/queue": "broken"}))
    with running(kube) as s:
        wait_for("the KAI pod bound", lambda: kube.node_of("kai-pod") == "n0", timeout=15)
        s.explainer.flush()
        wait_for(
            "an Event on the broken queue",
            lambda: [m for r, m in kube.events("broken") if r == "LeftOut" and "Queue broken" in m],
        )
        why = dict(kube.events("victim"))
        assert "Queue broken" in why.get("Unschedulable", ""), why
    st = phalanx("status", "--kubeconfig", str(kube.cp.kubeconfig), env=_env())
    out = st.communicate(timeout=60)[0]
    assert st.returncode == 0, out
    assert "problem: Queue broken: spec.resources.gpu.quota: must be a number, got 'lots'" in out, out


def test_nodes_without_the_gfd_memory_label_keep_their_gpus(kube: Kube) -> None:
    bare = node("plain-0")
    del bare["metadata"]["labels"]["nvidia.com/gpu.memory"]  # a device plugin without GPU Feature Discovery
    kube.api.create("nodes", bare)
    kube.create(pod("whole", gpus=2))
    kube.create(pod("share", annotations={"gpu-fraction": "0.5"}))
    kube.create(pod("by-memory", annotations={"gpu-memory": "20000"}))
    with running(kube) as s:
        wait_for("whole and share bound", lambda: kube.node_of("whole") and kube.node_of("share"), timeout=15)
        s.explainer.flush()
        msg = wait_for(
            "the memory pod's reason", lambda: dict(kube.events("by-memory")).get("FailedScheduling")
        )
    assert kube.node_of("by-memory") == ""
    assert "GPU memory unknown" in msg and "nvidia.com/gpu.memory" in msg, msg
    assert "whole-gpu-guard" not in msg and "reservation" not in msg


def test_problem_lines_name_the_object_and_a_cluster_without_gpus_says_so(kube: Kube) -> None:
    kube.api.create("nodes", node("cpu-0", gpus=0))
    bad = node("bad-0", annotations={"phalanx.io/device-topology": "{not json"})
    kube.api.create("nodes", bad)
    kube.create(pod("wants-gpu", gpus=1))
    with running(kube) as s:
        s.explainer.flush()
        msg = wait_for(
            "the reason", lambda: dict(kube.events("wants-gpu")).get("FailedScheduling"), timeout=15
        )
    assert "no GPUs on the node on 1 node(s)" in msg, msg
    st = phalanx("status", "--kubeconfig", str(kube.cp.kubeconfig), env=_env())
    out = st.communicate(timeout=60)[0]
    problems = [line for line in out.splitlines() if line.startswith("problem:")]
    assert problems and all(
        line.startswith(("problem: Node ", "problem: Pod ", "problem: Queue ")) for line in problems
    )
    assert any("Node bad-0: annotation phalanx.io/device-topology: not valid JSON" in p for p in problems), (
        out
    )
