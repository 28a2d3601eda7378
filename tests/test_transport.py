"""The API client's kept-alive connections: one the server closed is opened anew, once."""

from __future__ import annotations

import http.client
import pathlib
import ssl
from typing import Any

import pytest

from phalanx.k8s.client.transport import DirectTransport


class Reply:
    status = 200

    def read(self) -> bytes:
        return b"{}"


class Conn:
    """A kept-alive connection that fails its first `fails` requests with `error`, then works
    (http.client reconnects on the next request after close(), as this stands in for)."""

    def __init__(self, error: BaseException, fails: int = 1) -> None:
        self.error, self.fails, self.closed, self.sent = error, fails, 0, 0

    def request(self, *args: object, **kw: object) -> None:
        self.sent += 1
        if self.sent <= self.fails:
            raise self.error

    def getresponse(self) -> Reply:
        return Reply()

    def close(self) -> None:
        self.closed += 1


def transport(conn: Conn) -> DirectTransport:
    t = DirectTransport.__new__(DirectTransport)  # no kubeconfig needed to test the retry
    t.base, t.token, t.token_file = "", None, None
    t._conn = lambda: conn  # type: ignore[method-assign]
    return t


@pytest.mark.parametrize(
    "error",
    [
        ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),  # a TLS close seen on the write
        http.client.RemoteDisconnected("Remote end closed connection without response"),
        BrokenPipeError(32, "Broken pipe"),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
)
def test_a_connection_the_server_closed_is_opened_again(error: BaseException) -> None:
    c = Conn(error)
    assert transport(c).send("PATCH", "/api/v1/nodes/n0/status", None, b"{}", {}) == (200, b"{}")
    assert c.sent == 2 and c.closed == 1


def test_only_once_and_other_errors_are_not_retried() -> None:
    twice = Conn(ssl.SSLEOFError(8, "EOF"), fails=2)
    with pytest.raises(ssl.SSLEOFError):
        transport(twice).send("GET", "/api", None, None, {})
    assert twice.sent == 2
    refused = Conn(ssl.SSLCertVerificationError(1, "certificate verify failed"))
    with pytest.raises(ssl.SSLError):
        transport(refused).send("GET", "/api", None, None, {})
    assert refused.sent == 1


def kubeconfig(tmp_path: pathlib.Path, server: str, extra: str = "") -> str:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
        f"apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: '{server}'{extra}}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    return str(cfg)


@pytest.mark.parametrize(
    ("server", "extra", "loads"),
    [
        ("http://127.0.0.1:1", "", 0),  # a fake API server or `kubectl proxy`: no TLS, no CA bundle read
        ("https://127.0.0.1:1", ", insecure-skip-tls-verify: true", 1),
        ("https://127.0.0.1:1", "", 1),  # the system's CA bundle, read once for all three clients
    ],
)
def test_one_tls_context_per_connection_and_none_for_plain_http(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, server: str, extra: str, loads: int
) -> None:
    from phalanx.k8s.client import api as api_module

    made: list[ssl.SSLContext] = []
    real = api_module.verify_cluster

    def counting(*args: Any, **kw: Any) -> ssl.SSLContext:
        made.append(real(*args, **kw))
        return made[-1]

    monkeypatch.setattr(api_module, "verify_cluster", counting)
    a = api_module.Api.connect(kubeconfig=kubeconfig(tmp_path, server, extra))
    try:
        assert len(made) == loads
        if loads:
            assert isinstance(a.transport, DirectTransport) and a.transport.context is made[0]
    finally:
        a.close()
