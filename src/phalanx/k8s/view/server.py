"""Prometheus metrics, the /healthz, /readyz and /metrics endpoints, and the dashboard under /dashboard/.

/healthz and /readyz are open (probes). With a `guard` (`phalanx.k8s.view.authn`), /metrics and
/dashboard/... answer only a caller whose bearer token the API server authenticates (401
otherwise) and authorizes for that URL (403 otherwise), and the dashboard shows it only the
namespaces it may list pods in. With `tls`, everything is served over HTTPS.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from phalanx.core.errors import SpecError
from phalanx.k8s.view.authn import Guard
from phalanx.k8s.view.board import Board, Visible
from phalanx.web import asset


class _Labelled(CollectorRegistry):
    """Every sample with the same extra labels (a scheduling shard's name: shards' series stay apart)."""

    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__()
        self.extra = labels

    def collect(self) -> Iterator[Metric]:
        for m in super().collect():
            m.samples = [s._replace(labels={**s.labels, **self.extra}) for s in m.samples]
            yield m


class Metrics:
    def __init__(self, shard: str = "") -> None:
        self.registry = _Labelled({"shard": shard}) if shard else CollectorRegistry()
        r = self.registry
        self.cycle = Histogram(
            "phalanx_cycle_seconds",
            "Duration of one scheduling cycle (snapshot, decisions, API calls)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=r,
        )
        self.phase = Histogram(
            "phalanx_cycle_phase_seconds",
            "One cycle's time by phase: read (the store into a snapshot), decide (the core), act (binds "
            "and evictions), report (forecasts, explanations, the dashboard)",
            ["phase"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
            registry=r,
        )
        self.skipped = Counter(
            "phalanx_cycles_skipped",
            "Cycles not run: nothing changed since a cycle that left nothing waiting",
            registry=r,
        )
        self.rebuilds = Counter(
            "phalanx_world_rebuilds",
            "Cycles that built the snapshot from scratch (nodes, queues or datasets changed; DRA in use)",
            registry=r,
        )
        self.reads = Counter(
            "phalanx_world_reads",
            "Cycles' reads by how: patched (only what the change feed named), kept (every object, the "
            "snapshot kept), rebuilt (a snapshot from scratch)",
            ["how"],
            registry=r,
        )
        self.gc_full = Histogram(
            "phalanx_gc_full_seconds",
            "Full collections of the cyclic garbage collector, run between cycles (phalanx.k8s.loop.heap)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.feed_behind = Counter(
            "phalanx_feed_behind",
            "Reads that fell behind the watch cache's change feed (more changes than it holds): read in full",
            registry=r,
        )
        self.recorded = Histogram(
            "phalanx_world_nodes_recorded",
            "Nodes recorded anew into the kept snapshot in a cycle (their pods changed)",
            buckets=(0, 1, 5, 20, 100, 500, 2000, 10000),
            registry=r,
        )
        self.drift = Counter(
            "phalanx_world_drift",
            "Audits that found the kept snapshot differing from one built from scratch (it is replaced)",
            registry=r,
        )
        self.pending = Gauge("phalanx_pending_workloads", "Workloads waiting to be placed", registry=r)
        self.binds = Counter("phalanx_binds_total", "Pods bound", registry=r)
        self.evictions = Counter("phalanx_evictions_total", "Pods evicted", registry=r)
        self.broken = Counter("phalanx_broken_gangs_total", "Gangs undone because a bind failed", registry=r)
        self.queue_gpus = Gauge(
            "phalanx_queue_gpu_allocated", "GPUs allocated per queue", ["queue"], registry=r
        )
        self.pool_gpus = Gauge(
            "phalanx_pool_gpu_allocated_ratio", "Share of GPUs allocated per node pool", ["pool"], registry=r
        )
        self.leader = Gauge("phalanx_leader", "1 while this replica holds the lease", registry=r)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


STATIC = {"style.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8"}


S = TypeVar("S", bound=ThreadingHTTPServer)


def listening(
    cls: type[S], address: str, port: int, handler: type[BaseHTTPRequestHandler], flag: str = "--port"
) -> S:
    """The server bound to address:port, or one line that names the flag (a port taken, say,
    by a port-forward left running), never a traceback."""
    try:
        return cls((address, port), handler)
    except OSError as e:
        why = e.strerror or str(e)
        raise SpecError(flag, f"cannot listen on {address}:{port}: {why} (give another {flag})") from None


class _Server(ThreadingHTTPServer):
    """TLS handshakes happen on each connection's own thread: a slow client never holds up accept."""

    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = self.socket.accept()
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a failed handshake or a dropped connection: the client's problem, not a traceback


def serve(
    port: int,
    metrics: Metrics | None,
    ready: Callable[[], bool],
    board: Board | None = None,
    guard: Guard | None = None,
    tls: ssl.SSLContext | None = None,
    address: str = "0.0.0.0",
) -> ThreadingHTTPServer:
    """Serve the endpoints on a daemon thread; returns the server (port 0 picks a free one).

    With a `board`, also the read-only dashboard under /dashboard/ (`phalanx.k8s.view.board`).
    Without a `guard`, /metrics and the dashboard are open to anyone who reaches `address`.
    """

    class Handler(BaseHTTPRequestHandler):
        timeout = 30  # seconds a connection may be idle (or stall its TLS handshake)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            if isinstance(self.request, ssl.SSLSocket):
                self.request.do_handshake()

        def handle(self) -> None:
            try:
                super().handle()
            except (ssl.SSLError, OSError):  # a client that does not speak TLS, or hangs up
                self.close_connection = True

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            protected = (board is not None and (path == "/dashboard" or path.startswith("/dashboard/"))) or (
                path == "/metrics" and metrics is not None
            )
            visible: Visible | None = None
            if protected and guard is not None:
                user = guard.authenticate(self.headers.get("Authorization"))
                if user is None:
                    self._reply(
                        401,
                        b"unauthorized: a bearer token the API server accepts is needed\n",
                        extra={"WWW-Authenticate": 'Bearer realm="phalanx"'},
                    )
                    return
                if not guard.allowed(user, path=path):
                    self._reply(403, f"forbidden: {user.name} may not get {path}\n".encode())
                    return
                visible = guard.namespaces(user)
            if board is not None and (path == "/dashboard" or path.startswith("/dashboard/")):
                self._dashboard(board, path, visible)
            elif path == "/metrics" and metrics is not None:
                self._reply(200, metrics.render(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._reply(200, b"ok\n")
            elif self.path == "/readyz":
                ok = ready()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"not ready: caches not synced\n")
            else:
                self._reply(404, b"not found\n")

        def _dashboard(self, board: Board, path: str, visible: Visible | None) -> None:
            rest = path[len("/dashboard") :].lstrip("/")
            if path == "/dashboard":
                self.send_response(301)
                self.send_header("Location", "/dashboard/")
                self.end_headers()
            elif rest == "":
                self._reply(200, asset("dashboard.html"), "text/html; charset=utf-8")
            elif rest.startswith("static/") and rest[len("static/") :] in STATIC:
                name = rest[len("static/") :]
                self._reply(200, asset(name), STATIC[name])
            elif rest == "state.json":
                self._reply(200, board.state_json(visible), "application/json")
            elif rest.startswith("api/") and rest.count("/") == 2:
                _, kind, name = rest.split("/")
                body = board.detail_json(kind, unquote(name), visible)
                if body is None:
                    self._reply(404, f"no {kind} {unquote(name)!r}\n".encode())
                else:
                    self._reply(200, body, "application/json")
            else:
                self._reply(404, b"not found\n")

        def _reply(
            self, code: int, body: bytes, ctype: str = "text/plain", extra: dict[str, str] | None = None
        ) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = listening(_Server, address, port, Handler)
    server.tls = tls
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="phalanx-http").start()
    return server
