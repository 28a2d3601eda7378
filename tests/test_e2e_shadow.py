"""Shadow mode on a real control plane with kube-scheduler placing the pods, and read-only rights.

The shadow runs under the ServiceAccount and ClusterRole the chart renders with shadow.enabled
(get, list and watch only, and the two reviews that store nothing). kube-scheduler places two
singletons (pinned by node selector: Phalanx must agree) and then a gang of 4 x 2 GPUs that only
partly fits: kube-scheduler places some members, Phalanx would have waited for the whole gang.
The shadow sends no request but GETs, binds nothing, and counts exactly that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from e2e_kube import ROOT, SERVICE_ACCOUNTS, Kube, phalanx, wait_for
from helm_chart import render
from kube_objects import node, pod, pod_group
from phalanx.k8s.client.api import Api
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.lab.localcluster import ControlPlane, Unavailable
from phalanx.k8s.loop.shadow import AGREE, DISAGREE, SAME_NODE, WHOLE_GANG, Shadow
from phalanx.k8s.view.server import serve
from phalanx.profiles import load_profile

pytestmark = pytest.mark.e2e
READ = {"get", "list", "watch"}
REVIEWS = {"tokenreviews", "subjectaccessreviews"}


@pytest.fixture(scope="module")
def kube() -> Iterator[Kube]:
    """A control plane of this module's own, with kube-scheduler: it must not place other tests' pods."""
    try:
        cp = ControlPlane(controller_manager=False).start()
    except Unavailable as e:
        if os.environ.get("PHALANX_REQUIRE_E2E") == "1":
            pytest.fail(f"PHALANX_REQUIRE_E2E=1 but no Kubernetes control plane: {e}")
        pytest.skip(f"no Kubernetes control plane: {e}")
    try:
        cp.start_scheduler()
        k = Kube(cp)
        k.install_crds(sorted((ROOT / "deploy" / "helm" / "phalanx" / "crds").glob("*.yaml")))
        yield k
        k.close()
    finally:
        cp.stop()


def _read_only(kube: Kube) -> tuple[str, list[dict[str, Any]]]:
    """A kubeconfig for the chart's shadow ServiceAccount, bound to the chart's shadow ClusterRole."""
    docs = [d for d in render({"shadow": {"enabled": True}}) if d["metadata"]["name"].endswith("-shadow")]
    kube.ensure_namespace("phalanx-system")
    rules: list[dict[str, Any]] = []
    for d in docs:
        if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
            kube.apply(d)
        else:  # the Deployment: validated by the real server (no kubelet here to run it)
            kube.apply(d, dry_run=True)
        if d["kind"] == "ClusterRole":
            rules = d["rules"]
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]
    tok = kube.api.request(
        "POST",
        SERVICE_ACCOUNTS.path(sa["namespace"], sa["name"], "token"),
        {"spec": {"expirationSeconds": 900}},
    )["status"]["token"]
    return str(kube.cp.kubeconfig_for_token(tok, "shadow")), rules


class Recorder:
    """Wraps the shadow's transport: every request it sends, by method and path."""

    def __init__(self, api: Api) -> None:
        self.sent: list[tuple[str, str]] = []
        inner = api.transport.send

        def send(method: str, path: str, *args: Any, **kw: Any) -> Any:
            self.sent.append((method, path))
            return inner(method, path, *args, **kw)

        api.transport.send = send  # type: ignore[method-assign]


def _gpu_pod(name: str, gpus: int, slot: str = "", **kw: Any) -> dict[str, Any]:
    p = pod(name, gpus=gpus, scheduler="default-scheduler", **kw)
    if slot:
        p["spec"]["nodeSelector"] = {"slot": slot}
    return p


def _phalanx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phalanx.cli.main", *args], capture_output=True, text=True, timeout=60
    )


def test_shadow_beside_kube_scheduler_binds_nothing_and_counts_right(kube: Kube) -> None:
    cfg_path, rules = _read_only(kube)
    for r in rules:  # the chart's role: reads, and the two reviews that store nothing
        assert set(r["verbs"]) <= READ or (set(r["resources"]) <= REVIEWS and r["verbs"] == ["create"]), r
    kube.api.create("nodes", node("n0", gpus=4, labels={"slot": "a"}))
    kube.api.create("nodes", node("n1", gpus=4, labels={"slot": "b"}))
    api = Api.connect(kubeconfig=cfg_path)
    rec = Recorder(api)
    cfg = AdapterConfig(scheduler_name="default-scheduler", cycle_seconds=0.2, rediscover_seconds=1.0)
    s = Shadow(api, cfg, load_profile("phalanx"))
    server = serve(0, s.metrics, s.ready, s.board, address="127.0.0.1")
    s.start()
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    try:
        assert s.wait_synced(20), "the shadow could not list and watch with read-only rights"
        kube.create(_gpu_pod("solo-a", 1, slot="a"))
        kube.create(_gpu_pod("solo-b", 1, slot="b"))
        wait_for("both singletons placed and judged", lambda: sum(s.tally.values()) == 2, timeout=30)
        assert s.tally == {(AGREE, SAME_NODE): 2}  # pinned: Phalanx can only agree
        assert {kube.node_of("solo-a"), kube.node_of("solo-b")} == {"n0", "n1"}
        kube.create(pod_group("big", 4))  # the gang is 4 pods, whatever kube-scheduler makes of them
        gang = {"phalanx.io/pod-group": "big"}
        for k in range(4):  # 8 GPUs asked, 6 free: kube-scheduler places what fits, pod by pod
            kube.create(_gpu_pod(f"big-{k}", 2, annotations=gang))

        def placed() -> list[str]:
            return [n for n, p in kube.pods().items() if n.startswith("big-") and p["spec"].get("nodeName")]

        # each node has 3 GPUs free: one member of 2 GPUs fits on each, so kube-scheduler places two
        wait_for("kube-scheduler placed two members of the gang", lambda: len(placed()) == 2, timeout=30)
        wait_for("each placed member judged", lambda: sum(s.tally.values()) == 2 + len(placed()), timeout=30)
        bound = placed()
        assert s.tally == {(AGREE, SAME_NODE): 2, (DISAGREE, WHOLE_GANG): len(bound)}
        assert s.partial == {"default/big": f"{len(bound)} of 4 pods placed, the gang cannot start"}
        metrics = server_get(server.server_port, "/metrics")
        assert (
            f'phalanx_shadow_decisions_total{{reason="{WHOLE_GANG}",verdict="disagree"}} {len(bound)}.0'
            in metrics
        )
        assert f'phalanx_shadow_decisions_total{{reason="{SAME_NODE}",verdict="agree"}} 2.0' in metrics
        url = f"http://127.0.0.1:{server.server_port}"
        st = _phalanx("status", "--shadow", url)
        assert st.returncode == 0, st.stdout + st.stderr
        assert f"{2 + len(bound)} placement(s) judged, 2 agreed" in st.stdout
        assert "gang placed partially by default-scheduler: default/big" in st.stdout
        assert WHOLE_GANG in st.stdout
        recent = [r for r in s.board.recent if r["kind"].startswith("shadow ")]  # the dashboard's list
        assert sorted(r["what"] for r in recent) == sorted(
            ["default/solo-a", "default/solo-b", *(f"default/{b}" for b in bound)]
        )
        for k in range(4):  # the gang's pods gone: nothing is partly placed any more (once stuck there)
            kube.force_delete_pod(f"big-{k}")
        wait_for("the partly placed gang forgotten", lambda: not s.partial, timeout=30)
    finally:
        s.close()
        t.join(timeout=10)
        server.shutdown()
        api.close()
    # the command itself, with the same read-only rights: it starts, watches, and says what it does
    proc = phalanx("scheduler", "--shadow", "--kubeconfig", cfg_path, "--port", "0", "--insecure-metrics",
                   "--cycle-seconds", "0.2")  # fmt: skip
    try:
        assert proc.stdout is not None
        line = ""
        for line in proc.stdout:
            if "shadow mode: watching the pods of 'default-scheduler'" in line or "Error" in line:
                break
        assert "binding and evicting nothing" in line, line
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=20)[0]
    assert "forbidden" not in rest.lower() and "Traceback" not in rest, rest
    writes = [(m, p) for m, p in rec.sent if m != "GET"]
    assert not writes, f"the shadow sent writes: {writes}"
    assert not [
        e for e in kube.api.list("events")[0] if (e.get("source") or {}).get("component") == "phalanx"
    ]


def server_get(port: int, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.read().decode()
