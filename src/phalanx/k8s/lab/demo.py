"""The side-by-side demo: one real API server, the same workloads for kube-scheduler and for Phalanx.

Each scheduler gets its own copy of the cluster (nodes labelled with the copy's name, pods
with a node selector for it, a namespace each), so both run at once on one control plane:
- two training gangs of 3 pods x 2 GPUs (12 GPUs asked, 8 there), pods created interleaved;
- four inference pods at half a GPU each (KAI's `gpu-fraction` annotation).

kube-scheduler places pod by pod and knows nothing of gangs or fractions: partial gangs hold
GPUs they cannot use, and fractions land on GPUs already given away. The report counts both.
The gangs need no PodGroup object: Phalanx groups pods by `phalanx.io/pod-group` alone.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from phalanx.k8s.client.api import Api
from phalanx.k8s.client.kinds import NAMESPACES, PODS
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.lab.localcluster import ControlPlane
from phalanx.k8s.loop.scheduler import Scheduler
from phalanx.profiles import load_profile

COPY_LABEL = "demo.phalanx.io/copy"
GPUS_PER_NODE = 4
NODES = 2
GANGS = ("train-a", "train-b")
GANG_SIZE, GANG_GPUS = 3, 2
INFER, SHARE = 4, 0.5


@dataclass
class WorkloadRow:
    name: str
    pods: int
    bound: int
    gpus_held: float
    state: str


@dataclass
class CopyReport:
    scheduler: str
    rows: list[WorkloadRow] = field(default_factory=list)
    stuck_gpus: float = 0.0  # held by gangs that cannot start
    overpromised: float = 0.0  # GPU shares bound beyond the GPUs there
    idle_gpus: float = 0.0


def _node(name: str, copy: str) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                COPY_LABEL: copy,
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.memory": "81559",
            },
        },
        "status": {
            "allocatable": alloc,
            "capacity": alloc,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _pod(
    name: str, ns: str, scheduler: str, copy: str, gpus: int = 0, notes: dict[str, str] | None = None
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": notes or {}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {COPY_LABEL: copy},
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": limits},
                }
            ],
        },
    }


def populate(api: Api, copy: str, scheduler: str) -> None:
    ns = copy
    api.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for k in range(NODES):
        api.create("nodes", _node(f"{copy}-node-{k}", copy))
    for k in range(GANG_SIZE):  # interleaved, as two jobs submitted together arrive
        for g in GANGS:
            notes = {"phalanx.io/pod-group": g}
            api.create(PODS, _pod(f"{g}-{k}", ns, scheduler, copy, GANG_GPUS, notes), ns)
    for k in range(INFER):
        api.create(PODS, _pod(f"infer-{k}", ns, scheduler, copy, 0, {"gpu-fraction": f"{SHARE:g}"}), ns)


def report(api: Api, copy: str, scheduler: str) -> CopyReport:
    pods = [p for p in api.list(PODS)[0] if p["metadata"]["namespace"] == copy]
    out = CopyReport(scheduler)
    per_node: dict[str, float] = {}
    for g in GANGS:
        members = [p for p in pods if p["metadata"]["name"].startswith(g + "-")]
        bound = [p for p in members if p["spec"].get("nodeName")]
        held = float(GANG_GPUS * len(bound))
        for p in bound:
            per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0.0) + GANG_GPUS
        if len(bound) == len(members):
            state = "runs"
        elif bound:
            state = f"STUCK: {len(bound)} of {len(members)} pods hold {held:g} GPUs, the gang cannot start"
            out.stuck_gpus += held
        else:
            state = "waits whole (holds nothing)"
        out.rows.append(WorkloadRow(g, len(members), len(bound), held, state))
    infer = [p for p in pods if p["metadata"]["name"].startswith("infer-")]
    ib = [p for p in infer if p["spec"].get("nodeName")]
    for p in ib:
        per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0.0) + SHARE
    for used in per_node.values():
        out.overpromised += max(0.0, used - GPUS_PER_NODE)
    over = f"; {out.overpromised:g} GPUs promised twice" if out.overpromised else ""
    istate = "run" if len(ib) == len(infer) else f"{len(infer) - len(ib)} wait"
    out.rows.append(
        WorkloadRow(f"infer x{INFER} ({SHARE:g} GPU)", len(infer), len(ib), SHARE * len(ib), istate + over)
    )
    total = NODES * GPUS_PER_NODE
    out.idle_gpus = max(0.0, total - sum(min(v, GPUS_PER_NODE) for v in per_node.values()))
    return out


def _settled(api: Api, copies: tuple[str, ...], quiet_s: float, timeout_s: float) -> None:
    """Wait until nothing is bound for `quiet_s` (both schedulers have done what they will do)."""
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = sum(
            1 for p in api.list(PODS)[0] if p["metadata"]["namespace"] in copies and p["spec"].get("nodeName")
        )
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.25)


def run(quiet_s: float = 3.0, timeout_s: float = 60.0) -> tuple[CopyReport, CopyReport]:
    """Start a control plane, run both schedulers on their copies, and report what each did."""
    with ControlPlane(controller_manager=False) as cp:
        api = Api.connect(kubeconfig=str(cp.kubeconfig))
        try:
            populate(api, "kube-scheduler", "default-scheduler")
            populate(api, "phalanx", "phalanx")
            cp.start_scheduler(qps=200)
            sapi = Api.connect(kubeconfig=str(cp.kubeconfig))
            s = Scheduler(
                sapi, AdapterConfig(leader_elect=False, cycle_seconds=0.25), load_profile("phalanx-queues")
            )
            s.start()
            t = threading.Thread(target=s.run, daemon=True)
            t.start()
            _settled(api, ("kube-scheduler", "phalanx"), quiet_s, timeout_s)
            s.close()
            t.join(timeout=10)
            sapi.close()
            return report(api, "kube-scheduler", "kube-scheduler"), report(api, "phalanx", "Phalanx")
        finally:
            api.close()
