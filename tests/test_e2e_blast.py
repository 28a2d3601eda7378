"""Blast radius, on the real API server: a slow webhook holds up no pod but Phalanx's (the chart's
configuration sends only pods of `scheduler.name`, through matchConditions, and gives up after
timeoutSeconds), and a scheduler that is down leaves every other pod to its scheduler."""

from __future__ import annotations

import base64
import http.server
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e_kube import Kube, wait_for
from helm_chart import render
from kube_objects import node, pod
from phalanx.k8s import certs
from phalanx.k8s.admission.webhook import WEBHOOK_CONFIG
from phalanx.k8s.client.api import ApiError
from phalanx.k8s.client.kinds import WEBHOOK_CONFIGS
from quiet_http import QuietServer

pytestmark = pytest.mark.e2e
SLOW_S = 30.0  # far longer than the chart's timeoutSeconds


@pytest.fixture
def slow_webhook(kube: Kube, tmp_path: Path) -> Iterator[list[float]]:
    """A webhook that answers nothing for SLOW_S, registered with the chart's configuration."""
    ca = certs.make_ca("slow-ca")
    crt, key = certs.issue(ca, "slow", server_names=("127.0.0.1",)).write(tmp_path, "slow")
    calls: list[float] = []
    release = threading.Event()  # set at the end: no handler outlives the test

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            calls.append(time.monotonic())
            release.wait(SLOW_S)

        def log_message(self, *args: object) -> None:
            pass

    srv = QuietServer(("127.0.0.1", 0), Slow)  # the API server gives up on it: no traceback
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(crt), str(key))
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    bundle = base64.b64encode(ca.cert).decode()
    for d in render():
        if d["kind"] == "MutatingWebhookConfiguration":
            for h in d["webhooks"]:
                h["clientConfig"] = {"url": f"https://127.0.0.1:{srv.server_address[1]}/mutate"}
                h["clientConfig"]["caBundle"] = bundle
            kube.apply(d)
    try:
        yield calls
    finally:
        kube.api.delete(WEBHOOK_CONFIGS, WEBHOOK_CONFIG)
        release.set()
        srv.shutdown()
        srv.server_close()


def test_a_slow_webhook_holds_up_only_phalanx_pods(kube: Kube, slow_webhook: list[float]) -> None:
    cfg = kube.get(WEBHOOK_CONFIGS, WEBHOOK_CONFIG) or {}
    (hook,) = cfg["webhooks"]
    timeout = int(hook["timeoutSeconds"])
    assert hook["failurePolicy"] == "Fail" and timeout <= 10  # fails closed, but soon, for ours only
    t = time.monotonic()
    for k in range(5):
        kube.create(pod(f"theirs-{k}", scheduler="default-scheduler"))
    theirs = time.monotonic() - t
    assert theirs < 2.0, f"5 pods of another scheduler took {theirs:.1f} s to admit"
    t = time.monotonic()
    with pytest.raises(ApiError) as refused:
        kube.create(pod("ours", gpus=1))
    ours = time.monotonic() - t
    assert timeout - 1 <= ours < timeout + 5, ours  # waited for the webhook, then refused
    assert "gpu-shares.phalanx.io" in refused.value.message
    assert len(slow_webhook) == 1  # only our pod was sent to it


def test_with_phalanx_down_only_phalanx_pods_wait(kube: Kube) -> None:
    kube.api.create("nodes", node("n0", gpus=8))
    kube.cp.start_scheduler()
    try:
        kube.create(pod("theirs", gpus=1, scheduler="default-scheduler"))
        kube.create(pod("ours", gpus=1))
        wait_for("kube-scheduler binds its pod", lambda: kube.node_of("theirs") == "n0", timeout=60)
        time.sleep(2.0)
        assert kube.node_of("ours") == ""  # waits for Phalanx, and holds nothing up
    finally:
        kube.cp.stop_scheduler()
