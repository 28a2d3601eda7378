"""The chart's shadow Deployment on real kubelets (shared/k8s/node), beside kube-scheduler.

One kit node, the chart installed with only what the shadow needs (shadow.enabled, plain HTTP
metrics; the scheduler at one replica, the webhook and discovery off), then busybox pods of
default-scheduler that kube-scheduler places and the kubelet runs: a pod pinned by node selector
(Phalanx must agree) and a gang of 2 with a PodGroup of minMember 3 (Phalanx would wait). The
shadow's /metrics is read through the API server's pod proxy. A check, not a CI test (it needs
root, the kit, and the image built from this tree: about 2 minutes here).

    flock /tmp/kit.lock env PHALANX_K8S_ASSETS=... PHALANX_NODEKIT=... PHALANX_HELM=... \\
        python benchmarks/check_shadow_nodes.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from e2e_kube import wait_for
from kube_objects import pod, pod_group
from nodes_kube import KitCluster, kit_cluster
from phalanx.k8s.client.kinds import NODES

BUSYBOX = "phalanx.local/busybox:1"


def _pod(
    name: str, notes: dict[str, str] | None = None, selector: dict[str, str] | None = None
) -> dict[str, Any]:
    p = pod(
        name, ns="default", gpus=1, cpu="10m", mem="16Mi", scheduler="default-scheduler", annotations=notes
    )
    p["metadata"].pop("uid")
    c = p["spec"]["containers"][0]
    c.update({"image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sh", "-c", "sleep 300"]})
    p["spec"]["terminationGracePeriodSeconds"] = 0
    if selector:
        p["spec"]["nodeSelector"] = selector
    return p


def default_scheduler_work(k: KitCluster) -> tuple[str, ...]:
    """kube-scheduler's pods: one pinned to the first node, and 2 pods of a PodGroup of minMember 3
    (Phalanx would have waited for the whole gang); their names."""
    k.namespace_ready("default")
    host = k.kube.get(NODES, k.nodes[0].name)["metadata"]["labels"]["kubernetes.io/hostname"]  # type: ignore[index]
    k.kube.create(_pod("pinned", selector={"kubernetes.io/hostname": host}))
    k.kube.create(pod_group("pair", 3))
    for i in range(2):
        k.kube.create(_pod(f"pair-{i}", notes={"phalanx.io/pod-group": "pair"}))
    return ("pinned", "pair-0", "pair-1")


def _metrics(k: KitCluster, path: str) -> str:
    """The shadow's /metrics through the pod proxy (text, not JSON: around the Api's decoding)."""
    status, data = k.api.transport.send("GET", path, None, None, {"Accept": "text/plain"})
    text = bytes(data).decode()
    return text if status == 200 and "phalanx_shadow_decisions_total{" in text else ""


def main() -> None:
    t0 = time.monotonic()
    with kit_cluster(nodes=1) as k:
        k.gpus(4)
        k.install(
            {
                "scheduler": {"replicas": 1},
                "webhook": {"enabled": False},
                "discover": {"enabled": False},
                "shadow": {"enabled": True, "insecureMetrics": True, "cycleSeconds": 0.5},
            }
        )
        [shadow] = k.pods(k.namespace, "app.kubernetes.io/component=shadow")
        name, sa = shadow["metadata"]["name"], shadow["spec"]["serviceAccountName"]
        print(f"shadow pod {name} Ready under ServiceAccount {sa} after {time.monotonic() - t0:.0f} s")
        pods = default_scheduler_work(k)
        wait_for("kube-scheduler placed the pods", lambda: all(k.kube.node_of(n) for n in pods), timeout=60)
        path = f"/api/v1/namespaces/{k.namespace}/pods/{name}:8080/proxy/metrics"
        text = wait_for("the shadow's verdicts", lambda: _metrics(k, path), timeout=60)
        print("\n".join(line for line in text.splitlines() if line.startswith("phalanx_shadow")))
        phases = {n: (k.kube.pods().get(n) or {}).get("status", {}).get("phase") for n in pods}
        print("pods as the kubelet runs them:", phases)
        logs = k.kubectl("logs", "-n", k.namespace, name, check=False)
        print("'forbidden' in the shadow's log:", "forbidden" in logs.lower())
    print(f"done in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
