"""Phalanx on real kubelets, as users install it: `helm install` to the first gang Running, and how
together a gang's pods start, next to kube-scheduler placing the same pods one by one.

A control plane, kube-scheduler (it places Phalanx's own pods, as in any cluster) and two real
nodes of shared/k8s/node, each advertising 4 `nvidia.com/gpu`; Phalanx's image from
deploy/image/build.sh imported into both. Needs root, the node kit, runc, the CNI plugins,
mmdebstrap, buildah and helm (as the `nodes` tests do):

    PHALANX_NODEKIT=../shared/k8s/node PHALANX_HELM=... PHALANX_K8S_ASSETS=... \\
        python benchmarks/bench_nodes.py [--rounds 3] [--gangs 6]

1. install: `helm install` (no --wait) starts the clock; once it returns, a 2-pod gang of 4 GPUs per
   pod is created, retried while the webhook still refuses Phalanx's pods (it fails closed for
   them until it serves); stop when both pods are Running.
2. rounds: `--gangs` gangs of 2 pods x 1 GPU (12 GPUs asked of 8 by default) that run 4 s, created
   interleaved (every gang's first pod, then every second pod), once for Phalanx (PodGroups) and
   once for kube-scheduler (the same pods, `schedulerName: default-scheduler`). Per gang: the
   spread of its pods' Running times and of their binds (sampled every 0.1 s), whether it ever ran
   partially (a pod Running while another of its gang is not even bound), and the makespan.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import pytest
import yaml

from e2e_kube import wait_for
from nodes_kube import CHART, KitCluster, Watch, helm_bin, kit_cluster, kit_values, merge
from phalanx.k8s.client.api import ApiError, Conflict

NS = "bench"
GPUS = 4


def pod(name: str, gang: str, scheduler: str, gpus: int, secs: float) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": {"gang": gang}}
    if scheduler == "phalanx":
        meta["annotations"] = {"phalanx.io/pod-group": gang}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": scheduler,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "w",
                    "image": "phalanx.local/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": ["sleep", str(secs)],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def create(k: KitCluster, obj: dict[str, Any]) -> None:
    with suppress(Conflict):
        k.kube.create(obj)


def create_gangs(
    k: KitCluster, prefix: str, n: int, size: int, gpus: int, secs: float, scheduler: str
) -> None:
    """PodGroups (for Phalanx), then pods, interleaved; what exists already is kept (for retries)."""
    if scheduler == "phalanx":
        for g in range(n):
            create(
                k,
                {
                    "apiVersion": "scheduling.phalanx.io/v1alpha1",
                    "kind": "PodGroup",
                    "metadata": {"name": f"{prefix}{g}", "namespace": NS},
                    "spec": {"minMember": size},
                },
            )
    for r in range(size):
        for g in range(n):
            create(k, pod(f"{prefix}{g}-{r}", f"{prefix}{g}", scheduler, gpus, secs))


def clear(k: KitCluster) -> None:
    k.kubectl("delete", "pods,podgroups", "--all", "-n", NS, "--grace-period=0", "--force", check=False)
    wait_for("no pods left", lambda: not k.pods(NS), timeout=120)


def first_gang(k: KitCluster) -> dict[str, float]:
    """`helm install` (no --wait) starts the clock; a gang is created at once; stop when it runs."""
    k.namespace_ready(k.namespace)
    values = k.cp.dir / "bench-values.yaml"
    values.write_text(yaml.safe_dump(merge(kit_values(), {"discover": {"enabled": False}})))
    cmd = [helm_bin(), f"--kubeconfig={k.cp.kubeconfig}", "install", k.release, str(CHART)]
    t0 = time.monotonic()
    helm = subprocess.Popen(
        [*cmd, "-n", k.namespace, "-f", str(values)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    w = Watch(k, NS, GPUS)
    try:
        _, err = helm.communicate(timeout=120)
        assert helm.returncode == 0, err
        t_helm = time.monotonic() - t0
        # as a Job controller would: the webhook refuses Phalanx's pods until it serves (fail closed)
        refused = 0
        while True:
            try:
                create_gangs(k, "first", 1, 2, GPUS, 8, "phalanx")
                break
            except ApiError as e:
                if "webhook" not in e.message:
                    raise
                refused += 1
                time.sleep(0.2)
        t_created = time.monotonic() - t0
        wait_for("the first gang Running", lambda: {"first0-0", "first0-1"} <= set(w.running), timeout=180)
        t_run = max(w.running["first0-0"], w.running["first0-1"]) - t0
        # what a user sees while it runs
        print("$ kubectl get pods -n bench -o wide")
        print(k.kubectl("get", "pods", "-n", NS, "-o", "wide"))
        print("$ phalanx status")
        st = subprocess.run(
            [str(Path(sys.executable).parent / "phalanx"), "status", "--kubeconfig", str(k.cp.kubeconfig)],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "110"},
        )
        print(st.stdout + st.stderr)
    finally:
        w.stop()
    k.kubectl("rollout", "status", "-n", k.namespace, "deployment", "--timeout=180s")
    return {
        "helm_returns_s": t_helm,
        "gang_created_s": t_created,
        "refused": float(refused),
        "first_gang_running_s": t_run,
    }


def round_(k: KitCluster, scheduler: str, gangs: int, tag: str) -> dict[str, float]:
    prefix = f"{tag}g"
    t0 = time.monotonic()
    w = Watch(k, NS, GPUS)
    names = {f"{prefix}{g}": [f"{prefix}{g}-0", f"{prefix}{g}-1"] for g in range(gangs)}
    partial: set[str] = set()
    try:
        create_gangs(k, prefix, gangs, 2, 1, 4, scheduler)

        def done() -> bool:
            for g, pods in names.items():
                # partial: a member runs while another is not even bound (it may wait for long)
                if any(p in w.running for p in pods) and any(p not in w.bound for p in pods):
                    partial.add(g)
            return all(p in w.ended for pods in names.values() for p in pods)

        wait_for(f"{scheduler}: every gang ended", done, timeout=300, every=0.1)
    finally:
        w.stop()
    spreads = [abs(w.running[p[0]] - w.running[p[1]]) for p in names.values()]
    binds = [abs(w.bound[p[0]] - w.bound[p[1]]) for p in names.values()]
    return {
        "bind_spread_max_s": max(binds),
        "spread_p50_s": statistics.median(spreads),
        "spread_max_s": max(spreads),
        "partial_gangs": float(len(partial)),
        "makespan_s": max(w.ended.values()) - t0,
        "over_capacity": float(len(w.over)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gangs", type=int, default=6)
    a = ap.parse_args()
    try:
        with kit_cluster(nodes=2) as k:
            k.gpus(GPUS)
            k.namespace_ready(NS)
            first = first_gang(k)
            print(
                f"install: helm install returned after {first['helm_returns_s']:.1f} s; the gang's pods"
                f" were admitted {first['gang_created_s']:.1f} s after the start"
                f" (webhook refused {first['refused']:.0f} tries); "
                f"first gang Running {first['first_gang_running_s']:.1f} s after helm install started"
            )
            clear(k)
            rows: dict[str, list[dict[str, float]]] = {"phalanx": [], "default-scheduler": []}
            for r in range(a.rounds):
                for sched in rows:
                    rows[sched].append(round_(k, sched, a.gangs, f"r{r}{sched[0]}"))
                    clear(k)
            print(
                f"\n{a.gangs} gangs of 2 pods x 1 GPU on 2 nodes x {GPUS} GPUs,"
                f" {a.rounds} rounds (median of rounds)"
            )
            print(
                f"{'scheduler':20} {'start spread p50':>17} {'spread max':>11}"
                f" {'bind spread max':>16} {'partial gangs':>14} {'makespan':>9}"
            )
            for sched, rs in rows.items():
                med = {key: statistics.median(x[key] for x in rs) for key in rs[0]}
                print(
                    f"{sched:20} {med['spread_p50_s']:>15.2f} s {med['spread_max_s']:>9.2f} s "
                    f"{med['bind_spread_max_s']:>14.2f} s {med['partial_gangs']:>14.0f}"
                    f" {med['makespan_s']:>7.1f} s"
                    + (f"  OVER CAPACITY {med['over_capacity']:.0f}" if med["over_capacity"] else "")
                )
    except pytest.skip.Exception as e:
        sys.exit(f"bench_nodes: cannot run here: {e}")


if __name__ == "__main__":
    main()
