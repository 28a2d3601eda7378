"""Phalanx deployed as users deploy it, on real kubelets: the image, `helm install`, gangs that run.

One control plane and two real nodes (shared/k8s/node) for the module; the chart is installed
once, with the image built by deploy/image/build.sh imported into each node's containerd. There is
no GPU: each node advertises 4 `nvidia.com/gpu` in its status (the kubelet admits against it), so
what is real here is everything but the device: the pods start, talk over the pod network, end, are
evicted with their grace period, and the kubelet's reports are what frees their GPUs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e_kube import wait_for
from helm_chart import CHART
from nodes_kube import KitCluster, Watch, kit_cluster, kit_values, merge, phase
from phalanx.k8s.client.kinds import Kind

pytestmark = [pytest.mark.e2e, pytest.mark.nodes]

GPUS_PER_NODE = 4
BUSYBOX = "phalanx.local/busybox:1"
NS = "train"
SCHEDULER = "app.kubernetes.io/component=scheduler"
WEBHOOK = "app.kubernetes.io/component=webhook"


@pytest.fixture(scope="module")
def kit() -> Iterator[KitCluster]:
    with kit_cluster(nodes=2) as k:
        k.gpus(GPUS_PER_NODE)
        t = k.install(
            {
                # the default profile (phalanx-queues), as users get it; a short lease for the hand-over
                "scheduler": {"leaseDurationSeconds": 6},
                "webhook": {"enabled": True},
                "discover": {"enabled": False},
            }
        )
        k.install_seconds = t  # type: ignore[attr-defined]
        k.namespace_ready(NS)
        # the rendezvous: each pod finds its peers' IPs through the API (read-only)
        k.kube.create(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rdv", "namespace": NS}}
        )
        k.kube.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "rdv-view", "namespace": NS},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "ServiceAccount", "name": "rdv", "namespace": NS}],
            }
        )
        for name, value in (("low", 100), ("high", 1000)):
            k.kube.create(
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": f"train-{name}"},
                    "value": value,
                }
            )
        yield k


@pytest.fixture
def clean(kit: KitCluster) -> Iterator[KitCluster]:
    yield kit
    kit.kubectl("delete", "pods,podgroups", "--all", "-n", NS, "--grace-period=0", "--force", check=False)
    wait_for("no training pods left", lambda: not kit.pods(NS), timeout=60)


# ---------------------------------------------------------------------------------------- objects
def gang(k: KitCluster, name: str, size: int, gpus: int, script: str, **pod: Any) -> None:
    """A PodGroup of `size` pods of `gpus` GPUs each, created as a Job controller would: group first."""
    k.kube.create(
        {
            "apiVersion": "scheduling.phalanx.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"minMember": size},
        }
    )
    for rank in range(size):
        k.kube.create(pod_manifest(k, f"{name}-{rank}", name, rank, gpus, script, **pod))


def pod_manifest(
    k: KitCluster,
    name: str,
    group: str,
    rank: int,
    gpus: int,
    script: str,
    priority_class: str = "",
    grace: int = 5,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "phalanx",
        "restartPolicy": "Never",
        "serviceAccountName": "rdv",
        "terminationGracePeriodSeconds": grace,
        "containers": [
            {
                "name": "worker",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "env": [
                    {"name": "RANK", "value": str(rank)},
                    {"name": "GROUP", "value": group},
                    {"name": "PATH", "value": "/kit:/bin:/usr/bin"},
                ],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                "volumeMounts": [{"name": "kubectl", "mountPath": "/kit", "readOnly": True}],
            }
        ],
        # the control-plane kit's static kubectl, for the rendezvous (no DNS, no kube-proxy here)
        "volumes": [{"name": "kubectl", "hostPath": {"path": str(k.cp.bins), "type": "Directory"}}],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"gang": group, "rank": str(rank)},
            "annotations": {"phalanx.io/pod-group": group},
        },
        "spec": spec,
    }


# rank 0 listens; rank 1 finds rank 0's IP through the API and connects: a stand-in for the
# rendezvous of a distributed training job. Both then "train" for HOLD seconds and end.
RENDEZVOUS = """
set -e
echo "rank $RANK up on $(hostname)"
if [ "$RANK" = 0 ]; then
  # The listener's stdin is held open (a FIFO this shell keeps), so that it never closes its side
  # first: busybox's nc exits at its peer's EOF, sent or not, with 0, and the sender would say
  # "sent" for a message never sent (5 in 400 on a loaded machine; 0 in 400 held open).
  mkfifo /tmp/hold && exec 3<>/tmp/hold
  # a sender that gave up mid-connect (a loaded machine) leaves an empty message: listen again
  until msg=$(nc -l -p 7777 <&3) && [ -n "$msg" ]; do :; done
  echo "rank 0 got: $msg"
else
  until ip=$(kubectl get pod "$GROUP-0" -o 'jsonpath={.status.podIP}') && [ -n "$ip" ]; do sleep 0.2; done
  until echo "hello from rank $RANK" | nc -w 10 "$ip" 7777; do sleep 0.2; done
  echo "rank $RANK sent to $ip"
fi
sleep ${HOLD:-2}
echo "rank $RANK done"
"""

# runs until evicted; on SIGTERM it takes 2 s to "checkpoint", then exits
CHECKPOINTS_ON_TERM = """
trap 'echo "TERM: checkpointing"; sleep 2; echo "checkpointed"; exit 0' TERM
echo "rank $RANK running"
while true; do sleep 0.2; done
"""


PODGROUPS = Kind("scheduling.phalanx.io", "v1alpha1", "podgroups", True, "PodGroup")


def logs(k: KitCluster, pod: str) -> str:
    return k.kubectl("logs", "-n", NS, pod, check=False)


# ---------------------------------------------------------------------------------------- tests
def test_install_makes_two_ready_schedulers_and_one_leads(kit: KitCluster) -> None:
    pods = kit.pods(kit.namespace, SCHEDULER)
    assert len(pods) == 2
    ready = [
        p
        for p in pods
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
    ]
    assert len(ready) == 2, [p["status"] for p in pods]
    names = {p["metadata"]["name"] for p in pods}
    holder = wait_for("a leader", kit.lease_holder, timeout=30)
    assert holder in names
    print(f"helm install --wait: {kit.install_seconds:.1f} s")  # type: ignore[attr-defined]


def test_gang_runs_whole_talks_over_the_pod_network_and_frees_its_gpus(clean: KitCluster) -> None:
    k = clean
    w = Watch(k, NS, GPUS_PER_NODE)
    try:
        gang(k, "first", 2, GPUS_PER_NODE, RENDEZVOUS)
        # the second gang does not fit while the first runs (2 x 4 GPUs on 2 x 4 GPUs)
        gang(k, "second", 2, GPUS_PER_NODE, RENDEZVOUS)
        k.wait("the first gang ends", lambda: {"first-0", "first-1"} <= set(w.ended), NS, timeout=90)
        k.wait("the second gang ends", lambda: {"second-0", "second-1"} <= set(w.ended), NS, timeout=90)
    finally:
        w.stop()
    for g in ("first", "second"):
        pods = {n: p for n, p in ((p["metadata"]["name"], p) for p in k.pods(NS)) if n.startswith(g)}
        assert {phase(p) for p in pods.values()} == {"Succeeded"}, {n: phase(p) for n, p in pods.items()}
        # started together: Running within 1 s of each other, as seen every 0.1 s
        t0, t1 = w.running[f"{g}-0"], w.running[f"{g}-1"]
        assert abs(t0 - t1) <= 1.0, (g, t0, t1)
        # one pod per node (4 GPUs each), and they talked over the pod network
        assert w.nodes[f"{g}-0"] != w.nodes[f"{g}-1"]
        assert "rank 0 got: hello from rank 1" in logs(k, f"{g}-0")
        assert "rank 1 sent to 10.244." in logs(k, f"{g}-1")
        # the gang's status followed its pods to the end
        pg = k.kube.get(PODGROUPS, g, NS) or {}
        assert (pg.get("status") or {}).get("phase") == "Succeeded", pg.get("status")
    # the second gang was bound only once the kubelets had reported the first one's pods ended
    first_end = min(w.ended["first-0"], w.ended["first-1"])
    assert min(w.bound["second-0"], w.bound["second-1"]) >= first_end
    assert not w.over, w.over


def test_preemption_waits_for_the_victims_to_terminate(clean: KitCluster) -> None:
    k = clean
    w = Watch(k, NS, GPUS_PER_NODE)
    try:
        gang(k, "low", 2, GPUS_PER_NODE, CHECKPOINTS_ON_TERM, priority_class="train-low", grace=20)
        k.wait("the low gang runs", lambda: {"low-0", "low-1"} <= set(w.running), NS, timeout=60)
        gang(k, "high", 2, GPUS_PER_NODE, RENDEZVOUS, priority_class="train-high")
        k.wait("the high gang ends", lambda: {"high-0", "high-1"} <= set(w.ended), NS, timeout=120)
    finally:
        w.stop()
    for v in ("low-0", "low-1"):
        assert v in w.deleting and v in w.gone, f"{v} was not evicted"
        # the grace period was honoured: the pod went after its 2 s checkpoint, well before 20 s
        took = w.gone[v] - w.deleting[v]
        assert 1.5 <= took <= 15, (v, took)
    # the preemptor was bound only after every victim had terminated (its kubelet reported it
    # ended, or it was gone), and no node ever held more GPUs in live pods than it has
    assert not w.over, w.over
    ended = [min(w.ended.get(v, w.gone[v]), w.gone[v]) for v in ("low-0", "low-1")]
    assert min(w.bound["high-0"], w.bound["high-1"]) >= max(ended), (w.bound, w.ended, w.gone)
    # the default profile preempts at once; what the preemptor was told never says it cannot fit
    fmt = "jsonpath={range .items[*]}{.involvedObject.name} {.reason} {.message}{'\\n'}{end}"
    events = k.kubectl("get", "events", "-n", NS, "-o", fmt).splitlines()
    told = [e for e in events if e.startswith("high-")]
    assert not [e for e in told if "does not fit even when everything running has ended" in e], told
    assert [e for e in events if e.startswith("low-") and "reempt" in e], events
    assert not w.over, w.over


def test_a_gang_with_a_finished_member_reads_as_running(clean: KitCluster) -> None:
    """A member that ran to completion counts as a member that ran: the gang is Running, not Pending."""
    k = clean
    w = Watch(k, NS, GPUS_PER_NODE)
    try:
        gang(k, "mixed", 2, 1, 'if [ "$RANK" = 1 ]; then echo done; else sleep 30; fi')
        wait_for(
            "rank 1 ends, rank 0 runs", lambda: "mixed-1" in w.ended and "mixed-0" in w.running, timeout=60
        )

        def status() -> dict[str, Any]:
            return dict(((k.kube.get(PODGROUPS, "mixed", NS) or {}).get("status")) or {})

        st = wait_for(
            "the PodGroup counts the ended member", lambda: (s := status()).get("succeeded") == 1 and s
        )
        assert st["phase"] == "Running" and st["running"] == 1, st
        running = [c for c in st["conditions"] if c["type"] == "Running"]
        assert running and running[0]["status"] == "True", st["conditions"]
        out = subprocess.run(
            [str(Path(sys.executable).parent / "phalanx"), "status", "--kubeconfig", str(k.cp.kubeconfig)],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        ).stdout
        pending = out.split("Pending workloads")[1] if "Pending workloads" in out else ""
        assert "mixed" not in pending, out
        # no Warning from the scheduler about this gang (the kubelets warn of the kit's missing DNS)
        fmt = "jsonpath={range .items[*]}{.involvedObject.name} {.source.component} {.reason}{'\\n'}{end}"
        warnings = k.kubectl("get", "events", "-n", NS, "--field-selector", "type=Warning", "-o", fmt)
        assert not [e for e in warnings.splitlines() if e.startswith("mixed") and "kubelet" not in e], (
            warnings
        )
    finally:
        w.stop()


def test_leader_killed_mid_burst_the_other_takes_over_without_partial_gangs(clean: KitCluster) -> None:
    k = clean
    leader = wait_for("a leader", k.lease_holder, timeout=30)
    w = Watch(k, NS, GPUS_PER_NODE)
    try:
        # 6 gangs of 2 x 1 GPU: 12 GPUs asked, 8 there
        for i in range(3):
            gang(k, f"b{i}", 2, 1, "sleep 20")
        k.kubectl("delete", "pod", "-n", k.namespace, leader, "--grace-period=0", "--force")
        for i in range(3, 6):
            gang(k, f"b{i}", 2, 1, "sleep 20")
        new = wait_for("a new leader", lambda: (h := k.lease_holder()) and h != leader and h, timeout=60)
        assert new in {p["metadata"]["name"] for p in k.pods(k.namespace, SCHEDULER)}
        k.wait("4 gangs bound", lambda: len(w.bound) >= 8, NS, timeout=60)
        time.sleep(3)  # a few more cycles: nothing else may be bound while they run
        bound_now = dict(w.bound)
    finally:
        w.stop()
    by_gang: dict[str, int] = {}
    for pod in bound_now:
        by_gang[pod.rsplit("-", 1)[0]] = by_gang.get(pod.rsplit("-", 1)[0], 0) + 1
    assert sorted(by_gang.values()) == [2, 2, 2, 2], by_gang  # whole gangs only, 8 GPUs
    assert not w.over, w.over


def test_webhook_down_ordinary_pods_are_admitted_at_once(clean: KitCluster) -> None:
    k = clean
    deploy = k.pods(k.namespace, WEBHOOK)[0]["metadata"]["ownerReferences"][0]["name"].rsplit("-", 1)[0]
    k.kubectl("scale", "deployment", "-n", k.namespace, deploy, "--replicas=0")
    try:
        wait_for("no webhook pod", lambda: not k.pods(k.namespace, WEBHOOK), timeout=60)
        t0 = time.monotonic()
        k.kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "ordinary", "namespace": NS},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeName": k.nodes[0].name,
                    "automountServiceAccountToken": False,
                    "containers": [
                        {"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["true"]}
                    ],
                },
            }
        )
        assert time.monotonic() - t0 < 1.0
        wait_for(
            "the ordinary pod ran", lambda: phase(k.kube.api.get_pod(NS, "ordinary") or {}) == "Succeeded"
        )
    finally:
        k.kubectl("scale", "deployment", "-n", k.namespace, deploy, "--replicas=2")
        wait_for("webhook back", lambda: len(k.pods(k.namespace, WEBHOOK)) == 2, timeout=60)


def test_two_shards_by_helm_upgrade_each_places_its_pool_on_the_kubelets(clean: KitCluster) -> None:
    """Last in this module (it changes the install): the release upgraded to two scheduling shards,
    one for the pool of the first node and a default one; each shard's replicas run, elect their own
    leader, and a pod of each pool runs on its pool's node."""
    k = clean
    first, second = (n.name for n in k.nodes[:2])
    k.kubectl("label", "node", first, "phalanx.io/node-pool=h100", "--overwrite")
    shards = {"shards": [{"name": "h100", "pools": ["h100"]}, {"name": "rest", "default": True}]}
    values = merge(
        kit_values(),
        {
            "scheduler": {"leaseDurationSeconds": 6},
            "webhook": {"enabled": True},
            "discover": {"enabled": False},
            **shards,
        },
    )
    path = k.cp.dir / "values-shards.yaml"
    path.write_text(yaml.safe_dump(values))
    k.helm(
        "upgrade", k.release, str(CHART), "-n", k.namespace, "-f", str(path), "--wait", "--timeout", "180s"
    )
    for name in ("h100", "rest"):
        pods = k.pods(k.namespace, f"{SCHEDULER},phalanx.io/shard={name}")
        assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
        holder = wait_for(
            f"{name}'s leader", lambda n=name: k.lease_holder(f"phalanx-scheduler-{n}"), timeout=60
        )
        assert holder in {p["metadata"]["name"] for p in pods}
        log = k.kubectl("logs", "-n", k.namespace, holder, check=False)
        assert f"scheduling shard {name}" in log, log[-2000:]
    # the single scheduler goes: helm deletes its Deployment, and the garbage collector its
    # ReplicaSet and pods, after helm returns (a CI-like run under load still listed its pod)
    wait_for(
        "the single scheduler's pods gone",
        lambda: not k.pods(k.namespace, f"{SCHEDULER},!phalanx.io/shard"),
        timeout=60,
    )
    for name, labels in (("in-h100", {"phalanx.io/node-pool": "h100"}), ("in-rest", {})):
        k.kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "labels": labels},
                "spec": {
                    "schedulerName": "phalanx",
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "c",
                            "image": BUSYBOX,
                            "imagePullPolicy": "Never",
                            "command": ["true"],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            }
        )
    for name, node_name in (("in-h100", first), ("in-rest", second)):
        done = k.wait(
            f"{name} ran", lambda n=name: phase(k.kube.api.get_pod(NS, n) or {}) == "Succeeded", NS, 120
        )
        assert done and (k.kube.api.get_pod(NS, name) or {})["spec"]["nodeName"] == node_name
