"""Phalanx on a real kube-apiserver: manifests, gangs in every dialect, sharing, MIG, RDMA,
preemption through the Eviction API, restarts, leader hand-over, explanations, 410 Gone."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import yaml

from e2e_kube import PDBS, ROOT, Kube, phalanx, running, wait_for
from helm_chart import render
from kube_objects import node, pod, pod_group, queue, topology
from phalanx.k8s.client.api import Api, ApiError
from phalanx.k8s.client.cache import Informer, Store
from phalanx.k8s.client.kinds import LEASES, OUR_POD_GROUPS, OUR_QUEUES, Kind
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.loop.scheduler import Scheduler
from phalanx.profiles import load_profile

pytestmark = pytest.mark.e2e


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_our_crds_and_the_examples_are_accepted_and_bad_objects_rejected(kube: Kube) -> None:
    served = kube.api.served(())  # core only: the rest is asked per document below
    accepted, skipped = [], []
    for f in sorted((ROOT / "deploy" / "examples").rglob("*.yaml")):
        for d in _docs(f):
            group = d["apiVersion"].rpartition("/")[0]
            if group == "kubeflow.org":
                skipped.append(d["kind"])  # Kubeflow's CRD is not ours to install
                continue
            kube.apply(d, dry_run=True)  # server-side validation against the real schemas
            accepted.append(f"{f.name}:{d['kind']}/{d['metadata']['name']}")
    assert len(accepted) >= 10 and set(skipped) == {"PyTorchJob"}, (accepted, skipped, served)
    bad = [
        pod_group("no-min", 1) | {"spec": {}},
        pod_group("zero", 0),
        queue("neg", 1) | {"spec": {"resources": {"gpu": {"overQuotaWeight": -1}}}},
    ]
    for obj in bad:
        with pytest.raises(ApiError) as e:
            kube.create(obj)
        assert e.value.code == 422, e.value


@pytest.mark.parametrize("mode", ["self", "certManager"])
def test_the_helm_chart_s_objects_are_accepted(kube: Kube, mode: str) -> None:
    """Every object of the chart, every switch on, validated by the real server (dry run)."""
    values = {
        "scheduler": {"gpuShares": "reservation", "customProfile": "name: mine\n"},
        "webhook": {"certificate": {"mode": mode}},
        "devicePlugin": {"enabled": True},
        "cache": {"enabled": True},
        "queues": [{"name": "chart-q", "spec": {"resources": {"gpu": {"quota": 8}}}}],
    }
    docs = render(values)  # skips here without helm
    kube.ensure_namespace("phalanx-system")
    accepted, skipped = [], []
    for d in docs:
        if d["kind"] == "CustomResourceDefinition":
            continue  # the CRDs are installed by the session fixture, through the same server
        if d["apiVersion"].startswith("cert-manager.io/"):
            skipped.append(d["kind"])  # cert-manager's CRDs are not ours to install
            continue
        kube.apply(d, dry_run=True)
        accepted.append(f"{d['kind']}/{d['metadata']['name']}")
    assert len(accepted) >= 30, accepted
    assert set(skipped) == ({"Certificate", "Issuer"} if mode == "certManager" else set()), skipped


def _gpus(kube: Kube, names: list[str]) -> dict[str, tuple[str, str]]:
    pods = kube.pods()
    return {
        n: (
            pods[n]["spec"].get("nodeName", ""),
            pods[n]["metadata"]["annotations"].get("phalanx.io/gpu-devices", ""),
        )
        for n in names
    }


def test_gangs_in_every_dialect_are_bound_whole_or_not_at_all(kube: Kube) -> None:
    kube.dialects("kai", "volcano", "scheduler-plugins")
    for k in range(5):  # room for the four gangs and the Job, not for the big gang too
        kube.api.create("nodes", node(f"n{k}", gpus=8))
    groups = {
        "ours": (pod_group("ours", 2), {"annotations": {"phalanx.io/pod-group": "ours"}}),
        "kai": (
            pod_group("kai", 2, api="scheduling.run.ai/v2alpha2"),
            {"annotations": {"pod-group-name": "kai"}},
        ),
        "vc": (
            pod_group("vc", 2, api="scheduling.volcano.sh/v1beta1"),
            {"annotations": {"scheduling.k8s.io/group-name": "vc"}},
        ),
        "sp": (
            pod_group("sp", 2, api="scheduling.x-k8s.io/v1alpha1"),
            {"labels": {"scheduling.x-k8s.io/pod-group": "sp"}},
        ),
    }
    for name, (pg, keys) in groups.items():
        kube.create(pg)
        for k in range(2):
            kube.create(pod(f"{name}-{k}", gpus=4, **keys))
    # a Job's pods, made by the real job controller, form one gang by their owner
    template = pod("x", gpus=2)["spec"]
    template["restartPolicy"] = "Never"
    kube.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "job", "namespace": "default"},
            "spec": {"parallelism": 2, "completions": 2, "template": {"spec": template}},
        }
    )
    time.sleep(1.1)  # younger than the rest (timestamps have whole seconds): it comes last in order
    kube.create(pod_group("too-big", 3))
    for k in range(3):
        kube.create(pod(f"too-big-{k}", gpus=8, annotations={"phalanx.io/pod-group": "too-big"}))
    with running(kube) as s:
        want = [f"{g}-{k}" for g in ("ours", "kai", "vc", "sp") for k in range(2)]
        wait_for("four gangs bound", lambda: all(kube.node_of(n) for n in want), timeout=30)
        jobs = wait_for(
            "the Job's pods bound",
            lambda: [
                p
                for p in kube.pods().values()
                if p["metadata"].get("labels", {}).get("job-name") == "job" and p["spec"].get("nodeName")
            ],
        )
        time.sleep(1.0)  # a few more cycles: the big gang must stay whole-or-nothing
        assert len(jobs) == 2
        assert not any(kube.node_of(f"too-big-{k}") for k in range(3))  # 4 GPUs left: none of it placed
        # the cycles after the first read what the watch cache's change feed named, not every object
        assert s.metrics.reads.labels("patched")._value.get() > 0
    used: dict[tuple[str, str], int] = {}
    for nd, gpus in _gpus(kube, want).values():
        for g in gpus.split(","):
            used[(nd, g)] = used.get((nd, g), 0) + 1
    assert all(v == 1 for v in used.values())  # no GPU given twice


def test_fractions_share_a_gpu_mig_slices_and_rdma_nics_beside_the_gpus(kube: Kube) -> None:
    kube.api.create("nodes", node("share-0", gpus=1))
    mig = node(
        "mig-0",
        gpus=0,
        product="NVIDIA-A100-SXM4-80GB",
        memory=81920,
        labels={"nvidia.com/gpu.count": "1"},
        extra={"nvidia.com/mig-3g.40gb": "2"},
    )
    kube.api.create("nodes", mig)
    topo = topology(
        [{"index": j, "pcieSwitch": j // 2, "numa": j // 4} for j in range(8)],
        [{"index": k, "pcieSwitch": k, "numa": k // 2} for k in range(4)],
    )
    rdma = node("rdma-0", gpus=8, annotations={"phalanx.io/device-topology": topo}, extra={"rdma/hca": "4"})
    rdma["metadata"]["labels"]["phalanx.io/node-pool"] = "rdma"
    kube.api.create("nodes", rdma)
    kube.create(pod("half-a", annotations={"gpu-fraction": "0.5"}))
    kube.create(pod("half-b", annotations={"gpu-fraction": "0.5"}))
    kube.create(pod("notebook", resources={"nvidia.com/mig-3g.40gb": "1"}))
    trainer = pod(
        "trainer", gpus=2, resources={"rdma/hca": "1"}, annotations={"phalanx.io/rdma-same-pcie": "true"}
    )
    trainer["spec"]["nodeSelector"] = {"phalanx.io/node-pool": "rdma"}
    kube.create(trainer)
    with running(kube):
        wait_for(
            "all bound",
            lambda: all(kube.node_of(n) for n in ("half-a", "half-b", "notebook", "trainer")),
            timeout=20,
        )
    pods = kube.pods()
    a, b = (pods[n]["metadata"]["annotations"] for n in ("half-a", "half-b"))
    assert kube.node_of("half-a") == kube.node_of("half-b") == "share-0"
    assert a["phalanx.io/gpu-devices"] == b["phalanx.io/gpu-devices"] == "0"
    assert a["phalanx.io/gpu-fraction"] == b["phalanx.io/gpu-fraction"] == "0.5"
    nb = pods["notebook"]["metadata"]["annotations"]
    assert kube.node_of("notebook") == "mig-0" and nb["phalanx.io/mig-slice"].startswith("3g.40gb@")
    tr = pods["trainer"]["metadata"]["annotations"]
    gpus = [int(x) for x in tr["phalanx.io/gpu-devices"].split(",")]
    nic = int(tr["phalanx.io/rdma-nics"])
    assert kube.node_of("trainer") == "rdma-0" and nic in {g // 2 for g in gpus}  # the NIC on a GPU's switch


def test_preemption_goes_through_the_eviction_api_and_honours_a_pdb(kube: Kube) -> None:
    for name, value in (("e2e-low", 0), ("e2e-high", 1000)):
        kube.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )
    kube.api.create("nodes", node("n0", gpus=2))
    for k in range(2):
        kube.create(_classed(pod(f"low-{k}", gpus=1, labels={"app": "low"}), "e2e-low"))
    kube.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep-low", "namespace": "default"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "low"}}},
        }
    )
    with running(kube, profile="phalanx-queues") as s:
        wait_for("the low pods bound", lambda: all(kube.node_of(f"low-{k}") for k in range(2)), timeout=15)
        for k in range(
            2
        ):  # running and ready for an hour: the PDB protects them, the minimum runtime does not
            kube.run_pod(f"low-{k}")
        kube.create(_classed(pod("high", gpus=2), "e2e-high"))
        # the PDB refuses the eviction (429): nothing is deleted, the preemptor waits
        wait_for(
            "a refused eviction", lambda: s.metrics.evictions._value.get() == 0 and _refused(kube), timeout=20
        )
        time.sleep(1.0)
        assert all(kube.node_of(f"low-{k}") for k in range(2)) and not kube.node_of("high")
        assert not any(p["metadata"].get("deletionTimestamp") for p in kube.pods().values())
        kube.api.delete(PDBS, "keep-low", "default")
        # now the evictions go through; with no kubelet the victims stay Terminating: play the kubelet
        wait_for(
            "victims terminating",
            lambda: all(
                (kube.pods().get(f"low-{k}") or {}).get("metadata", {}).get("deletionTimestamp")
                for k in range(2)
            ),
        )
        assert not kube.node_of("high")  # terminating pods still hold their GPUs
        for k in range(2):
            kube.force_delete_pod(f"low-{k}")
        wait_for("the preemptor bound", lambda: kube.node_of("high") == "n0", timeout=20)
    assert any(r == "Preempted" for r, _ in kube.events("low-0"))


def _classed(p: dict, priority_class: str) -> dict:
    """The priority comes from the class: admission refuses a pod that also sets the number."""
    del p["spec"]["priority"]
    p["spec"]["priorityClassName"] = priority_class
    return p


def _refused(kube: Kube) -> bool:
    """The PDB's status counts no disruption allowed, and the pods are all there."""
    pdb = kube.get(PDBS, "keep-low", "default") or {}
    return (pdb.get("status") or {}).get("disruptionsAllowed") == 0 and len(kube.pods()) == 3


class Crash(BaseException):  # nothing in the scheduler catches it: the process would be gone
    pass


def test_a_restart_in_the_middle_of_a_gang_finishes_it_and_binds_nothing_twice(kube: Kube) -> None:
    for k in range(2):
        kube.api.create("nodes", node(f"n{k}", gpus=8))
    kube.create(pod_group("g", 3))
    for k in range(3):
        kube.create(pod(f"g-{k}", gpus=8 if k == 0 else 4, annotations={"phalanx.io/pod-group": "g"}))
    api = Api.connect(kubeconfig=str(kube.cp.kubeconfig))
    a = Scheduler(api, AdapterConfig(profile="phalanx", leader_elect=False), load_profile("phalanx"))
    a.start()
    assert a.wait_synced(10)
    wait_for("cache", lambda: len(a.store.items("pods")) == 3 and len(a.store.items("nodes")) == 2)
    real, calls = api.bind, []

    def crash_on_second(ns, name, uid, node_name, notes=None):
        calls.append(name)
        if len(calls) == 2:
            raise Crash("killed mid-gang")
        return real(ns, name, uid, node_name, notes)

    api.bind = crash_on_second  # type: ignore[method-assign]
    with pytest.raises(Crash):
        a.step()
    a.stop()
    pods = kube.pods()
    assert sum(bool(p["spec"].get("nodeName")) for p in pods.values()) == 1  # a third of a gang...
    holder = next(p for p in pods.values() if "phalanx.io/gang-plan" in p["metadata"]["annotations"])
    plan = json.loads(holder["metadata"]["annotations"]["phalanx.io/gang-plan"])["tasks"]
    with running(kube):
        wait_for("the gang finished", lambda: all(kube.node_of(f"g-{k}") for k in range(3)), timeout=20)
    pods = kube.pods()
    for task, entry in plan.items():
        p = pods[task.split("/")[1]]
        assert p["spec"]["nodeName"] == entry["phalanx.io/node"]  # ...finished as planned, bound once
        assert p["metadata"]["annotations"]["phalanx.io/gpu-devices"] == entry["phalanx.io/gpu-devices"]


def test_leader_hand_over_between_two_processes(kube: Kube) -> None:
    kube.api.create("nodes", node("n0", gpus=8))
    env = {**os.environ}
    ns = "phalanx-e2e-ha"
    args = (
        "scheduler",
        "--kubeconfig",
        str(kube.cp.kubeconfig),
        "--lease-namespace",
        ns,
        "--lease-duration",
        "2",
        "--port",
        "0",
        "--cycle-seconds",
        "0.2",
    )
    a = phalanx(*args, "--identity", "a", env=env)
    b = None
    try:
        wait_for("a leads", lambda: _holder(kube, ns) == "a", timeout=30)
        b = phalanx(*args, "--identity", "b", env=env)
        kube.create(pod("first", gpus=1))
        wait_for("first bound", lambda: kube.node_of("first"), timeout=20)
        assert _holder(kube, ns) == "a"
        a.kill()  # no goodbye: b must wait out the lease, then take over
        a.wait(timeout=10)
        wait_for("b leads", lambda: _holder(kube, ns) == "b", timeout=30)
        kube.create(pod("second", gpus=1))
        wait_for("second bound by b", lambda: kube.node_of("second"), timeout=20)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.terminate()
                p.communicate(timeout=20)
    lease = kube.get(LEASES, "phalanx-scheduler", ns) or {}
    assert lease["spec"]["leaseTransitions"] >= 1


def _holder(kube: Kube, ns: str) -> str:
    return str(
        ((kube.get(LEASES, "phalanx-scheduler", ns) or {}).get("spec") or {}).get("holderIdentity") or ""
    )


def test_events_podgroup_and_queue_status_and_phalanx_status(kube: Kube) -> None:
    kube.create(queue("team", 8))
    kube.api.create("nodes", node("n0", gpus=8))
    kube.create(pod_group("fits", 2, queue="team"))
    kube.create(pod_group("waits", 2, queue="team"))
    for k in range(2):
        kube.create(pod(f"fits-{k}", gpus=4, annotations={"phalanx.io/pod-group": "fits"}))
        kube.create(pod(f"waits-{k}", gpus=4, annotations={"phalanx.io/pod-group": "waits"}))
    with running(kube, profile="phalanx-queues") as s:
        wait_for("fits bound", lambda: all(kube.node_of(f"fits-{k}") for k in range(2)), timeout=15)
        s.explainer.flush()
        wait_for(
            "PodGroup conditions",
            lambda: _condition(kube, "fits") == "True" and _condition(kube, "waits") == "False",
        )
        wait_for(
            "queue status",
            lambda: (
                ((kube.get(OUR_QUEUES, "team") or {}).get("status") or {}).get("allocated", {}).get("gpu")
                == "8"
            ),
        )
        scheduled = dict(kube.events("fits-0")).get("Scheduled", "")
        waiting = dict(kube.events("waits-0")).get("FailedScheduling", "")
    assert scheduled.startswith("Bound to n0 GPUs "), scheduled
    assert "queue team cannot borrow gpu" in waiting, waiting  # all 8 GPUs of the cluster are its quota
    st = phalanx("status", "--kubeconfig", str(kube.cp.kubeconfig), env={**os.environ, "COLUMNS": "220"})
    out = st.communicate(timeout=60)[0]
    assert st.returncode == 0, out
    assert "default/fits-0" in out and "default/waits" in out and "cannot borrow" in out, out
    assert "team" in out


def _condition(kube: Kube, name: str) -> str:
    pg = kube.get(OUR_POD_GROUPS, name, "default") or {}
    conds = (pg.get("status") or {}).get("conditions") or [{}]
    return str(conds[0].get("status", ""))


def test_a_real_410_gone_makes_the_informer_list_again(kube: Kube) -> None:
    """ConfigMaps have no watch cache here (--watch-cache-sizes=configmaps#0): watches read etcd,
    so a resourceVersion compacted away in etcd is answered 410 Gone by the real server."""
    cm = Kind("", "v1", "configmaps", True, "ConfigMap")

    def make(name: str) -> None:
        kube.api.create(cm, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}, "default")

    make("before")
    api = Api.connect(kubeconfig=str(kube.cp.kubeconfig))
    store, stop = Store(), threading.Event()
    inf = Informer(api, cm, store, stop, backoff=0.05)
    inf.resource_version = api.list(cm)[1]  # where the watch was when it went away...
    for k in range(3):
        make(f"meanwhile-{k}")
    kube.cp.compact()  # ...and etcd forgot that version meanwhile
    with pytest.raises(ApiError) as gone:
        next(iter(api.watch(cm, inf.resource_version, timeout_s=5)))
    assert gone.value.code == 410
    inf.start()
    try:
        wait_for(
            "a relist after 410", lambda: store.relists == 1 and store.get(cm.key, "default/meanwhile-2")
        )
        make("after")
        wait_for("the watch resumed", lambda: store.get(cm.key, "default/after"), timeout=10)
    finally:
        stop.set()
        api.close()
