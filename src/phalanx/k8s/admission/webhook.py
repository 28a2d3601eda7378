"""`phalanx webhook`: the HTTPS admission server for GPU shares, and its certificates.

Certificates come from a folder (`--cert-dir`, e.g. a cert-manager Certificate's Secret
mounted there, cert-manager's CA injector filling the webhook configuration's caBundle), or
are made here: a CA and a serving certificate kept in the Secret `phalanx-webhook-tls` (so
that every replica serves the same one), renewed a month before they expire, the CA bundle
patched into the MutatingWebhookConfiguration. The TLS context is reloaded in place when the
files or the Secret change: no restart, no dropped handshakes.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import ssl
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from phalanx.k8s import certs
from phalanx.k8s.admission.mutation import Distributed, review
from phalanx.k8s.client.api import Api, Conflict
from phalanx.k8s.client.kinds import SECRETS, WEBHOOK_CONFIGS, Kind
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.view.server import listening

log = logging.getLogger("phalanx.webhook")
WEBHOOK_CONFIG = "phalanx-gpu-shares"
SECRET = "phalanx-webhook-tls"
RENEW_BEFORE = dt.timedelta(days=30)


# read by the webhook where the distributed cache runs: is a pod's Dataset distributed, is it cached
DATASETS = Kind("scheduling.phalanx.io", "v1alpha1", "datasets", True, "Dataset")


@dataclass
class Material:
    ca: bytes
    cert: bytes
    key: bytes


class CertSource:
    """Where the serving certificate comes from, and keeping it fresh."""

    def __init__(
        self,
        api: Api,
        namespace: str,
        service: str,
        cert_dir: Path | None = None,
        extra_names: tuple[str, ...] = (),
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.names = (f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", *extra_names)
        self.cert_dir = cert_dir

    def get(self) -> Material:
        if self.cert_dir is not None:
            d = self.cert_dir
            ca = (d / "ca.crt").read_bytes() if (d / "ca.crt").is_file() else b""
            return Material(ca, (d / "tls.crt").read_bytes(), (d / "tls.key").read_bytes())
        for _ in range(3):
            secret = self.api.get(SECRETS, SECRET, self.namespace)
            have = _material(secret)
            fresh = have is not None and certs.expires(have.cert) - dt.datetime.now(dt.UTC) > RENEW_BEFORE
            if have is not None and fresh and _covers(have.cert, self.names):
                return have
            try:
                return self._write(secret)
            except Conflict:
                continue  # another replica wrote it first: use theirs
        raise RuntimeError(f"Secret {self.namespace}/{SECRET} kept changing under us")

    def _write(self, secret: dict[str, Any] | None) -> Material:
        ca = certs.make_ca("phalanx-webhook-ca", days=3650)
        leaf = certs.issue(ca, self.names[0], server_names=self.names, days=365)
        m = Material(ca.cert, leaf.cert, leaf.key)
        data = {
            k: base64.b64encode(v).decode()
            for k, v in (("ca.crt", m.ca), ("tls.crt", m.cert), ("tls.key", m.key))
        }
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": SECRET, "namespace": self.namespace},
            "data": data,
        }
        if secret is None:
            self.api.create(SECRETS, body, self.namespace)
        else:
            body["metadata"]["resourceVersion"] = (secret.get("metadata") or {}).get("resourceVersion")
            self.api.replace(SECRETS, body)  # with resourceVersion: a racing replica gets 409
        log.info(
            "made a new serving certificate for %s (valid until %s)",
            ", ".join(self.names),
            certs.expires(m.cert).date(),
        )
        return m

    def publish_ca(self, ca: bytes) -> bool:
        """Put the CA in the webhook configuration's caBundle; True if it changed."""
        if not ca:
            return False
        cfg = self.api.get(WEBHOOK_CONFIGS, WEBHOOK_CONFIG)
        if cfg is None:
            log.warning(
                "no MutatingWebhookConfiguration %s: install the Helm chart (deploy/helm/phalanx in the "
                "source repository) with webhook.enabled=true",
                WEBHOOK_CONFIG,
            )
            return False
        bundle = base64.b64encode(ca).decode()
        hooks = cfg.get("webhooks") or []
        if all((h.get("clientConfig") or {}).get("caBundle") == bundle for h in hooks):
            return False
        for h in hooks:
            h.setdefault("clientConfig", {})["caBundle"] = bundle
        self.api.replace(WEBHOOK_CONFIGS, cfg)
        log.info("CA bundle of %s updated", WEBHOOK_CONFIG)
        return True


def _material(secret: dict[str, Any] | None) -> Material | None:
    data = (secret or {}).get("data") or {}
    try:
        return Material(*(base64.b64decode(data[k]) for k in ("ca.crt", "tls.crt", "tls.key")))
    except (KeyError, ValueError):
        return None


def _covers(cert_pem: bytes, names: tuple[str, ...]) -> bool:
    from cryptography import x509

    try:
        sans = x509.load_pem_x509_certificate(cert_pem).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
    except (ValueError, x509.ExtensionNotFound):
        return False
    have = {str(v) for v in sans.value.get_values_for_type(x509.DNSName)} | {
        str(v) for v in sans.value.get_values_for_type(x509.IPAddress)
    }
    return set(names) <= have


class Webhook:
    """The TLS server; `refresh()` reloads its certificate when the source has a new one."""

    def __init__(
        self,
        source: CertSource,
        cfg: AdapterConfig,
        host: str = "0.0.0.0",
        port: int = 8443,
        dist: Distributed | None = None,
    ) -> None:
        self.source = source
        self.cfg = cfg
        self.folder = Path(tempfile.mkdtemp(prefix="phalanx-webhook-"))
        self.current: Material | None = None
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self.refresh()
        self.server = listening(_Server, host, port, _handler(cfg, dist))
        self.server.daemon_threads = True
        self.server.socket = self.ctx.wrap_socket(
            self.server.socket, server_side=True, do_handshake_on_connect=False
        )  # the handshake happens in the request's thread, not in the accept loop

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def refresh(self) -> bool:
        m = self.source.get()
        if self.current is not None and m == self.current:
            self.source.publish_ca(m.ca)  # someone may have reset the configuration
            return False
        crt, key = self.folder / "tls.crt", self.folder / "tls.key"
        crt.write_bytes(m.cert)
        key.write_bytes(m.key)
        key.chmod(0o600)
        self.ctx.load_cert_chain(str(crt), str(key))  # new handshakes use it; open ones carry on
        self.current = m
        self.source.publish_ca(m.ca)
        return True

    def serve(self, stop: threading.Event, check_s: float = 3600.0) -> None:
        t = threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True)
        t.start()
        log.info("admission webhook serving on port %d", self.port)
        while not stop.wait(check_s):
            try:
                self.refresh()
            except Exception:  # keep serving the current certificate; try again later
                log.exception("could not refresh the serving certificate")
        self.server.shutdown()
        self.server.server_close()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (the API server gives up after timeoutSeconds) or failed its TLS
        handshake: one line at debug, not a traceback on stderr."""
        log.debug("connection from %s ended badly", client_address, exc_info=True)


def _path(target: str) -> str:
    return urlsplit(target).path


def _handler(cfg: AdapterConfig, dist: Distributed | None = None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

        def do_GET(self) -> None:
            self._send(200 if _path(self.path) in ("/healthz", "/readyz") else 404, b"ok\n", "text/plain")

        def do_POST(self) -> None:
            if _path(self.path) != "/mutate":  # the API server adds ?timeout=...
                self._send(404, b"not found\n", "text/plain")
                return
            try:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n))
                out = review(body, cfg, dist)
            except (ValueError, AttributeError) as e:
                self._send(400, f"bad AdmissionReview: {e}\n".encode(), "text/plain")
                return
            resp = out["response"]
            if not resp["allowed"]:
                log.info("denied pod: %s", resp["status"]["message"])
            self._send(200, json.dumps(out).encode(), "application/json")

        def _send(self, code: int, data: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
