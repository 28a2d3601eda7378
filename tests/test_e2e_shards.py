"""Scheduling shards on a real kube-apiserver (issue 35): two shards as the chart installs them.

The chart is rendered with two shards; its RBAC is applied and each shard's scheduler runs as its
own process, with the arguments of its Deployment and the chart's service account, so what runs is
what `helm install` runs (the control plane here has no kubelets to run the pods themselves).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from e2e_kube import SERVICE_ACCOUNTS, Kube, phalanx, wait_for
from helm_chart import component, find, render
from kube_objects import node, pod, pod_group
from phalanx.k8s.client.kinds import LEASES, OUR_POD_GROUPS

pytestmark = pytest.mark.e2e

SHARDS = {"shards": [{"name": "h100", "pools": ["h100"]}, {"name": "rest", "default": True}]}
NS = "phalanx-system"


def _pooled(obj: dict[str, Any], pool: str) -> dict[str, Any]:
    obj["metadata"].setdefault("labels", {})["phalanx.io/node-pool"] = pool
    return obj


def _installed(kube: Kube, tmp: Path) -> dict[str, list[str]]:
    """The chart's RBAC for two shards applied; each shard's scheduler arguments, as its Deployment
    gives them, with the chart's service account's kubeconfig and the shards file it mounts."""
    docs = render(SHARDS)
    kube.ensure_namespace(NS)
    for doc in component(docs, "scheduler"):
        if doc["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
            kube.apply(doc)
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    tok = kube.api.request("POST", SERVICE_ACCOUNTS.path(NS, "phalanx-scheduler", "token"), body)
    cfg = str(kube.cp.kubeconfig_for_token(tok["status"]["token"], "phalanx-sa"))
    shards_file = tmp / "shards.yaml"
    shards_file.write_text(find(docs, "ConfigMap", "phalanx-shards")["data"]["shards.yaml"])
    out = {}
    for name in ("h100", "rest"):
        dep = find(docs, "Deployment", f"phalanx-scheduler-{name}")
        assert dep["spec"]["selector"]["matchLabels"]["phalanx.io/shard"] == name
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--shard={name}" in args and "--shards=/etc/phalanx/shards/shards.yaml" in args
        args = [a for a in args if a not in ("--in-cluster",) and not a.startswith(("--shards=", "--port="))]
        out[name] = [
            *args, "--kubeconfig", cfg, "--shards", str(shards_file), "--port", "0",
            "--identity", f"{name}-0", "--cycle-seconds", "0.2",
        ]  # fmt: skip
    return out


def _dashboard(kube: Kube, shards_file: str, env: dict[str, str]) -> dict[str, Any]:
    """`phalanx dashboard --shards`'s state, once it has read the cluster."""
    proc = phalanx(
        "dashboard", "--kubeconfig", str(kube.cp.kubeconfig), "--shards", shards_file, "--port", "0",
        "--interval", "0.5", env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        said = ""
        while "listening on" not in said and proc.poll() is None:
            said = proc.stdout.readline()
        port = re.search(r":(\d+), http", said)
        assert port, said

        def read() -> dict[str, Any] | None:
            got = httpx2.get(f"http://127.0.0.1:{port.group(1)}/dashboard/state.json", timeout=5).json()
            return got if got.get("shards") else None

        return wait_for("the dashboard of every shard", read, timeout=30)  # type: ignore[no-any-return]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _events(kube: Kube, name: str) -> str:
    return " | ".join(f"{r}: {m}" for r, m in kube.events(name))


def test_two_shards_from_the_chart_bind_only_their_pools_and_one_dying_leaves_the_other(
    kube: Kube, tmp_path: Path
) -> None:
    args = _installed(kube, tmp_path)
    kube.api.create("nodes", _pooled(node("h1", gpus=8), "h100"))
    kube.api.create("nodes", node("r1", gpus=8))
    for k in range(3):
        kube.create(_pooled(pod(f"h-{k}", gpus=1), "h100"))
    for k in range(2):
        kube.create(pod(f"r-{k}", gpus=1))
    kube.create(_pooled(pod("lost", gpus=1), "t4"))  # a pool no shard owns
    kube.create(pod_group("pair", 2))  # a gang whose pods name two shards' pools
    kube.create(_pooled(pod("pair-0", gpus=1, labels={"phalanx.io/pod-group": "pair"}), "h100"))
    kube.create(pod("pair-1", gpus=1, labels={"phalanx.io/pod-group": "pair"}))
    env = {**os.environ, "COLUMNS": "200"}
    procs = {name: phalanx(*a, env=env) for name, a in args.items()}  # the args begin with "scheduler"
    try:
        wait_for(
            "h100's pods on h1", lambda: all(kube.node_of(f"h-{k}") == "h1" for k in range(3)), timeout=60
        )
        wait_for(
            "the rest's pods on r1", lambda: all(kube.node_of(f"r-{k}") == "r1" for k in range(2)), timeout=60
        )
        for name in ("h100", "rest"):
            lease = kube.get(LEASES, f"phalanx-scheduler-{name}", NS)
            assert lease is not None and lease["spec"]["holderIdentity"] == f"{name}-0"
        wait_for("why lost waits", lambda: "no scheduling shard owns" in _events(kube, "lost"), timeout=30)
        assert "pool 't4'" in _events(kube, "lost") and not kube.node_of("lost")
        for p in ("pair-0", "pair-1"):  # each shard sees its half, and says a gang is one shard's
            wait_for(
                f"why {p} waits", lambda p=p: "placed whole by one shard" in _events(kube, p), timeout=30
            )
        assert not kube.node_of("pair-0") and not kube.node_of("pair-1")
        group = kube.get(OUR_POD_GROUPS, "pair", "default") or {}
        assert "one shard" in str(group.get("status")), group.get("status")

        shards_file = next(a for a in args["h100"] if a.endswith("shards.yaml"))
        status = phalanx("status", "--kubeconfig", str(kube.cp.kubeconfig), "--shards", shards_file, env=env)
        out = status.communicate(timeout=60)[0]
        assert status.returncode == 0, out
        rows = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.count("│") > 6}
        assert {"h100", "rest"} <= rows.keys(), out  # one table of every shard, then each shard's own
        assert [c.strip() for c in rows["h100"].split("│")[3:5]] == ["1", "8"], rows["h100"]  # nodes, GPUs
        assert "Pending workloads (shard rest)" in out and "default/pair" in out
        board = _dashboard(kube, shards_file, env)  # one board of both shards, read-only
        assert [(r["name"], r["nodes"], r["gpus"]) for r in board["shards"]] == [
            ("h100", 1, 8),
            ("rest", 1, 8),
        ]
        assert {n["name"] for n in board["nodes"]} == {"h1", "r1"}
        waits = {p["workload"]: p for p in board["pending"]}
        assert (
            waits["default/pair"]["shard"] in ("h100", "rest") and "one shard" in waits["default/pair"]["why"]
        )
        lost = [p for p in board["problems"] if "pool 't4'" in p]  # not taken in: said as a problem
        assert (
            len(lost) == 1 and lost[0].startswith("shard rest: ") and "no scheduling shard owns" in lost[0]
        ), board["problems"]

        procs["rest"].send_signal(signal.SIGKILL)  # the rest's leader dies: h100 goes on alone
        procs["rest"].wait(timeout=10)
        kube.create(_pooled(pod("h-late", gpus=1), "h100"))
        kube.create(pod("r-late", gpus=1))
        wait_for(
            "h100 binds after the rest's leader died", lambda: kube.node_of("h-late") == "h1", timeout=30
        )
        time.sleep(1.0)
        assert not kube.node_of("r-late")  # nobody else took the rest's pods
        lease = kube.get(LEASES, "phalanx-scheduler-rest", NS)
        assert lease is not None and lease["spec"]["holderIdentity"] == "rest-0"  # not taken over by h100
        bound = {n: kube.node_of(n) for n in ("h-0", "h-1", "h-2", "h-late", "r-0", "r-1")}
        assert {n for n, at in bound.items() if at == "h1"} == {"h-0", "h-1", "h-2", "h-late"}

        # r1 joins h100 (relabelled) with the rest's two pods still on it: h100 counts their GPUs
        kube.create(_pooled(pod("h-four", gpus=4), "h100"))  # h1 full
        wait_for("h-four on h1", lambda: kube.node_of("h-four") == "h1", timeout=30)
        kube.api.patch("nodes", "r1", None, {"metadata": {"labels": {"phalanx.io/node-pool": "h100"}}})
        kube.create(_pooled(pod("h-two", gpus=2), "h100"))
        wait_for("h-two on r1, which joined h100", lambda: kube.node_of("h-two") == "r1", timeout=30)
        kube.create(_pooled(pod("h-five", gpus=5), "h100"))  # 4 free on r1 with r-0, r-1; 6 without
        wait_for("why h-five waits", lambda: bool(kube.events("h-five")), timeout=30)
        assert not kube.node_of("h-five"), _events(kube, "h-five")
    finally:
        outs = {}
        for name, p in procs.items():
            if p.poll() is None:
                p.terminate()
            outs[name] = p.communicate(timeout=30)[0]
            print(f"--- shard {name}:\n{outs[name][-6000:]}")  # shown when the test fails
    assert "forbidden" not in outs["h100"].lower(), outs["h100"]
    assert "Traceback" not in outs["h100"], outs["h100"]
