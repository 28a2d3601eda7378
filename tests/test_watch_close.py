"""Closing a client's watches wakes their readers, and no socket is closed under a reader.

Found as a webhook that timed out in CI: a scheduler closed in the test process left its informers
blocked reading sockets that had been closed under them; the next connection made took the same
file number, and a TLS reader (OpenSSL keeps the number) read that connection's bytes, the API
server's handshake with the webhook among them. Here the server is a TLS stand-in that sends one
event and then holds the stream open, as a quiet watch does.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from phalanx.k8s import certs
from phalanx.k8s.client.api import Api, WatchesClosed
from phalanx.k8s.client.kinds import PODS
from quiet_http import QuietServer


class _Watch(BaseHTTPRequestHandler):
    release: threading.Event

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        pod = {"metadata": {"name": "p", "namespace": "default", "resourceVersion": "2"}}
        self.wfile.write(json.dumps({"type": "ADDED", "object": pod}).encode() + b"\n")
        self.wfile.flush()
        self.release.wait(30)  # a quiet watch: nothing more until the test ends


@pytest.fixture
def tls_watch(tmp_path: Path) -> Iterator[tuple[Api, threading.Event]]:
    ca = certs.make_ca("watch-test-ca", days=1)
    leaf = certs.issue(ca, "127.0.0.1", server_names=("127.0.0.1",), days=1)
    (tmp_path / "tls.crt").write_bytes(leaf.cert)
    (tmp_path / "tls.key").write_bytes(leaf.key)
    release = threading.Event()
    handler = type("Watch", (_Watch,), {"release": release})
    server = QuietServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": f"https://127.0.0.1:{server.server_address[1]}",
                    "certificate-authority-data": base64.b64encode(ca.cert).decode(),
                },
            }
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    api = Api.connect(kubeconfig=str(tmp_path / "kubeconfig"))
    try:
        yield api, release
    finally:
        release.set()
        api.close()
        server.shutdown()
        server.server_close()


def test_closing_the_watches_wakes_a_reader_blocked_on_a_quiet_stream(tls_watch: tuple[Api, threading.Event]):
    api, _ = tls_watch
    got: list[str] = []
    first = threading.Event()
    ended: list[str] = []

    def read() -> None:
        try:
            for _, obj in api.watch(PODS, ""):
                got.append(obj["metadata"]["name"])
                first.set()
            ended.append("end of stream")
        except Exception as e:  # the stream cut: as the informers see it
            ended.append(type(e).__name__)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert first.wait(10), "the stand-in's event never came"
    api.close_watches(wait_s=5.0)
    reader.join(5.0)
    # before: the socket was closed under the reader, which stayed blocked in its read until the
    # server sent more (a quiet kind: up to the watch's 5-minute timeout), holding a file number
    # that the next socket made would take
    assert not reader.is_alive(), "the reader was not woken: it still reads a socket closed under it"
    assert got == ["p"] and len(ended) == 1
    with pytest.raises(WatchesClosed):
        next(iter(api.watch(PODS, "")))


def test_a_watch_cut_from_the_other_side_still_closes_its_own_stream(tls_watch: tuple[Api, threading.Event]):
    """A stream the server ends leaves nothing registered for `close_watches` to wait on."""
    api, release = tls_watch
    names = []
    release.set()
    for _, obj in api.watch(PODS, ""):
        names.append(obj["metadata"]["name"])
    assert names == ["p"]
    assert api._watching == 0 and not api._streams
