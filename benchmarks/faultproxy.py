"""A plain-HTTP proxy in front of the real kube-apiserver that injects faults (for bench_churn).

The schedulers talk to it without credentials; it forwards each request over TLS as the
cluster admin, so the API server, etcd and their restarts are real. Faults: a share of the
pods/binding POSTs answered 500 before they reach the server, and `drop()` closes every open
watch stream at once (the client sees its watch end mid-stream, as on a load balancer reset).
"""

from __future__ import annotations

import contextlib
import http.client
import random
import re
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

BIND = re.compile(r"/api/v1/namespaces/[^/]+/pods/[^/]+/binding")
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class FaultProxy:
    def __init__(self, upstream: str, ca: Path, cert: Path, key: Path, bind_500: float = 0.01) -> None:
        u = urlparse(upstream)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 443
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.ctx.load_cert_chain(str(cert), str(key))
        self.bind_500 = bind_500
        self.rng = random.Random(7)
        self.lock = threading.Lock()
        self.streams: set[Any] = set()
        self.counts = {"requests": 0, "binds": 0, "binds_500": 0, "watches_dropped": 0}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy.forward(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.drop()

    def drop(self) -> int:
        """Close every open watch; how many there were."""
        with self.lock:
            streams, self.streams = list(self.streams), set()
            self.counts["watches_dropped"] += len(streams)
        for h in streams:
            with contextlib.suppress(OSError):
                h.connection.shutdown(2)
        return len(streams)

    def forward(self, h: BaseHTTPRequestHandler) -> None:
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else None
        with self.lock:
            self.counts["requests"] += 1
            fail = h.command == "POST" and bool(BIND.search(h.path))
            if fail:
                self.counts["binds"] += 1
                fail = self.rng.random() < self.bind_500
                self.counts["binds_500"] += int(fail)
        if fail:
            msg = b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected","code":500}'
            h.send_response(500)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(msg)))
            h.end_headers()
            h.wfile.write(msg)
            return
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP}
        try:
            c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=330)
            c.request(h.command, h.path, body=body, headers=headers)
            r = c.getresponse()
        except OSError as e:  # the API server is down (restarting): what a client sees then
            msg = f"upstream: {e}".encode()
            h.send_response(503)
            h.send_header("Content-Length", str(len(msg)))
            h.end_headers()
            h.wfile.write(msg)
            return
        watch = "watch=true" in h.path or "watch=1" in h.path
        h.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in HOP:
                h.send_header(k, v)
        if not watch:
            data = r.read()
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            c.close()
            return
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        with self.lock:
            self.streams.add(h)
        try:
            while True:
                chunk = r.read1(65536)
                if not chunk:
                    break
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass
        finally:
            with self.lock:
                self.streams.discard(h)
            c.close()
            h.close_connection = True
