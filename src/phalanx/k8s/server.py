"""Prometheus metrics, the /healthz, /readyz and /metrics endpoints, and the dashboard under /dashboard/."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from phalanx.k8s.board import Board
from phalanx.web import asset


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.cycle = Histogram(
            "phalanx_cycle_seconds",
            "Duration of one scheduling cycle (snapshot, decisions, API calls)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
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


def serve(
    port: int, metrics: Metrics | None, ready: Callable[[], bool], board: Board | None = None
) -> ThreadingHTTPServer:
    """Serve the endpoints on a daemon thread; returns the server (port 0 picks a free one).

    With a `board`, also the read-only dashboard under /dashboard/ (`phalanx.k8s.board`).
    """

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if board is not None and (path == "/dashboard" or path.startswith("/dashboard/")):
                self._dashboard(board, path)
            elif path == "/metrics" and metrics is not None:
                self._reply(200, metrics.render(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._reply(200, b"ok\n")
            elif self.path == "/readyz":
                ok = ready()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"not ready: caches not synced\n")
            else:
                self._reply(404, b"not found\n")

        def _dashboard(self, board: Board, path: str) -> None:
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
                self._reply(200, board.state_json(), "application/json")
            elif rest.startswith("api/") and rest.count("/") == 2:
                _, kind, name = rest.split("/")
                body = board.detail_json(kind, unquote(name))
                if body is None:
                    self._reply(404, f"no {kind} {unquote(name)!r}\n".encode())
                else:
                    self._reply(200, body, "application/json")
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="phalanx-http").start()
    return server
