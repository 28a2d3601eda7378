"""The only module that talks to the API server; everything else sees plain dicts.

lightkube reads the kubeconfig or the service account (certificates, tokens, exec plugins)
and builds the authenticated HTTP client; requests go through that client as raw JSON,
decoded with msgspec. Typed models cost more than the whole scheduling cycle at 20,000
pods, and every kind we read (CRDs of four projects, DRA, Kueue) is a plain dict to us
anyway. Errors become the typed exceptions below, carrying the server's Status.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx2 as httpx
import msgspec
from lightkube.config.client_adapter import user_auth, verify_cluster
from lightkube.config.kubeconfig import KubeConfig, SingleConfig

from phalanx.k8s.client.kinds import BY_KEY, EVENTS, LEASES, NAMESPACES, PODS, Kind, of
from phalanx.k8s.client.transport import DirectTransport, HttpxTransport, Transport

log = logging.getLogger("phalanx.k8s")
_decode = msgspec.json.decode
_encode = msgspec.json.encode
JSON = {"Content-Type": "application/json"}
MERGE = {"Content-Type": "application/merge-patch+json"}


def cluster_verification(config: SingleConfig) -> ssl.SSLContext | None:
    """The cluster's verification context, built once per connection: loading a CA bundle
    costs tens of milliseconds of OpenSSL. A plain `http://` server (a test's fake, `kubectl
    proxy`) speaks no TLS, so nothing is loaded for it."""
    assert config.user is not None
    if urlsplit(config.cluster.server).scheme != "https":
        return None
    return verify_cluster(config.cluster, config.user, config.abs_file)


def client_params(
    config: SingleConfig, context: ssl.SSLContext | None, timeout: httpx.Timeout
) -> dict[str, Any]:
    """What lightkube's `ConnectionParams.httpx_params` gives, with the one context shared."""
    return {
        "base_url": config.cluster.server,
        "verify": context if context is not None else False,
        "auth": user_auth(config.user),
        "timeout": timeout,
        "trust_env": True,
    }


class ApiError(Exception):
    """A non-2xx answer: `code`, the Status `reason`, `message` and `details`."""

    def __init__(self, code: int, reason: str = "", message: str = "", details: Any = None) -> None:
        self.code = code
        self.reason = reason
        self.message = message or reason or f"HTTP {code}"
        self.details = details if isinstance(details, dict) else {}
        super().__init__(f"{code} {reason}: {self.message}" if reason else f"{code}: {self.message}")

    @property
    def retryable(self) -> bool:
        return self.code >= 500 or self.code == 429


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409: already bound, already exists, or a stale resourceVersion."""


class Gone(ApiError):
    """410: the watch's resourceVersion is too old; list again."""


class Forbidden(ApiError):
    pass


_BY_CODE: dict[int, type[ApiError]] = {404: NotFound, 409: Conflict, 410: Gone, 403: Forbidden}


def error_of(code: int, body: bytes | dict[str, Any]) -> ApiError:
    status: Any = body
    if isinstance(body, bytes | bytearray):
        try:
            status = _decode(body)
        except msgspec.DecodeError:
            status = {"message": body[:200].decode(errors="replace")}
    if not isinstance(status, dict):
        status = {}
    code = int(status.get("code") or code)
    cls = _BY_CODE.get(code, ApiError)
    return cls(code, str(status.get("reason") or ""), str(status.get("message") or ""), status.get("details"))


class WatchesClosed(RuntimeError):
    """A watch asked of a client whose watches were closed (`Api.close_watches`)."""


def _shut_down(r: httpx.Response) -> None:
    """Wake the reader of a watch stream: its socket shut down (never closed here: see
    `Api.close_watches`); the base socket's shutdown, since ssl's would drop the TLS object the
    reader is using."""
    stream = r.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):  # already shut, or closed by its reader
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _kind(kind: str | Kind) -> Kind:
    return kind if isinstance(kind, Kind) else of(kind)


class Api:
    def __init__(self, transport: Transport, watch_client: httpx.Client, field_manager: str = "phalanx"):
        self.transport = transport
        self.watch_client = watch_client
        self.field_manager = field_manager
        self.calls = 0  # requests sent (for benchmarks and tests)
        # open watch streams, and how many watches are opening or open: `close_watches` ends them
        # by shutting their sockets down and lets each reader close its own (`close_watches` says why)
        self._watches = threading.Condition()
        self._streams: set[httpx.Response] = set()
        self._watching = 0
        self._watches_closed = False

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None = None,
        in_cluster: bool = False,
        url: str | None = None,
        timeout_s: float = 10.0,
    ) -> Api:
        if url:  # a plain URL, no credentials (tests, `kubectl proxy`)
            config = KubeConfig.from_dict(
                {
                    "clusters": [{"name": "c", "cluster": {"server": url}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "c",
                }
            )
        elif in_cluster:
            config = KubeConfig.from_service_account()
        elif kubeconfig:
            config = KubeConfig.from_file(kubeconfig)
        else:
            config = KubeConfig.from_env()
        single = config.get()
        if single is None:
            raise ValueError("the kubeconfig names no current context")
        context = cluster_verification(single)
        params = client_params(single, context, httpx.Timeout(timeout_s))
        transport: Transport
        if DirectTransport.usable(single):
            transport = DirectTransport(single, timeout_s, context)
        else:
            transport = HttpxTransport(
                lambda: httpx.Client(
                    **params, limits=httpx.Limits(max_connections=4, max_keepalive_connections=4)
                )
            )
        wparams = client_params(single, context, httpx.Timeout(timeout_s, read=None))
        watch_client = httpx.Client(**wparams, limits=httpx.Limits(max_connections=None))
        return cls(transport, watch_client)

    def close(self) -> None:
        self.close_watches()
        self.transport.close()

    def close_watches(self, wait_s: float = 5.0) -> None:
        """End every watch, then close the watch client; no watch opens after this.

        A socket is never closed under a thread that reads it: Linux lets the number go to the next
        socket made while that read still waits, and the TLS reader (OpenSSL keeps the number, not
        the socket) then reads the new connection's bytes. A scheduler closed beside a webhook in
        one process had its informers take the API server's TLS handshake with the webhook: the
        webhook never answered and the pod was refused after 5 s. So each open watch's socket is
        shut down (its reader wakes to an end of stream) and its reader closes it; the client is
        closed once they have, or after `wait_s`."""
        deadline = time.monotonic() + wait_s
        with self._watches:
            self._watches_closed = True
            while self._watching and time.monotonic() < deadline:
                for r in self._streams:
                    _shut_down(r)
                self._watches.wait(0.05)  # one still opening registers, and is shut down next turn
            if self._watching:
                log.debug("%d watch(es) did not end within %.1f s: closing anyway", self._watching, wait_s)
        self.watch_client.close()

    # ------------------------------------------------------------------ plumbing
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """One call; the decoded JSON answer, or a typed ApiError. Transport errors pass through."""
        content = _encode(body) if body is not None else None
        if method in ("POST", "PUT", "PATCH"):
            params = {"fieldManager": self.field_manager, **(params or {})}
        self.calls += 1
        hdrs = {"Accept": "application/json", **(headers or (JSON if content is not None else {}))}
        status, data = self.transport.send(method, path, params, content, hdrs)
        if status >= 300:
            raise error_of(status, data)
        return _decode(data) if data else None

    # ------------------------------------------------------------------ discovery
    def served(self, kinds: tuple[Kind, ...]) -> set[str]:
        """Keys of the given kinds that this server serves now (API discovery)."""
        out = {k.key for k in kinds if not k.group}
        groups = self.request("GET", "/apis") or {}
        versions = {
            str(g.get("name")): {str(v.get("version")) for v in g.get("versions") or []}
            for g in groups.get("groups") or []
        }
        wanted: dict[tuple[str, str], list[Kind]] = {}
        for k in kinds:
            if k.group and k.version in versions.get(k.group, ()):
                wanted.setdefault((k.group, k.version), []).append(k)
        for (g, v), ks in wanted.items():
            try:
                listing = self.request("GET", f"/apis/{g}/{v}") or {}
            except NotFound:  # removed between the two calls
                continue
            plurals = {str(r.get("name")) for r in listing.get("resources") or []}
            out |= {k.key for k in ks if k.plural in plurals}
        return out

    # ------------------------------------------------------------------ reads
    def list(
        self,
        kind: str | Kind,
        chunk: int = 500,
        each: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
        field_selector: str = "",
    ) -> tuple[list[dict[str, Any]], str]:
        """All objects of a kind and the list's resourceVersion (paged, as client-go does). `each`:
        applied to every object as its page arrives (a watch cache slims them, or leaves out those
        it does not keep, by returning None, before the next page);
        `field_selector`: only those it picks (`spec.nodeName=n1`: the pods on one node)."""
        k = _kind(kind)
        items: list[dict[str, Any]] = []
        picked = {"fieldSelector": field_selector} if field_selector else {}
        params: dict[str, str] = {"limit": str(chunk), **picked}
        while True:
            page = self.request("GET", k.path(), params=params) or {}
            for o in page.get("items") or []:
                o.setdefault("apiVersion", k.api_version)
                o.setdefault("kind", k.kind)
                kept = each(o) if each is not None else o
                if kept is not None:
                    items.append(kept)
            meta = page.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return items, str(meta.get("resourceVersion") or "")
            params = {"limit": str(chunk), "continue": str(cont), **picked}

    def watch(
        self, kind: str | Kind, resource_version: str, timeout_s: int = 300
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Events after `resource_version` until the server closes the stream (then the caller resumes).

        BOOKMARK events are passed on (they only move the resourceVersion); an ERROR event
        raises its Status as an ApiError (410 Gone when the version is too old).
        """
        k = _kind(kind)
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        if resource_version:
            params["resourceVersion"] = resource_version
        self.calls += 1
        with self._watches:
            if self._watches_closed:
                raise WatchesClosed("the watches of this client were closed")
            self._watching += 1
        try:
            yield from self._stream(k, params)
        finally:
            with self._watches:
                self._watching -= 1
                self._watches.notify_all()

    def _stream(self, k: Kind, params: dict[str, str]) -> Iterator[tuple[str, dict[str, Any]]]:
        with self.watch_client.stream("GET", k.path(), params=params) as r:
            with self._watches:
                if self._watches_closed:
                    return
                self._streams.add(r)
            try:
                yield from self._events(k, r)
            finally:
                with self._watches:
                    self._streams.discard(r)

    def _events(self, k: Kind, r: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
        if r.status_code >= 300:
            raise error_of(r.status_code, r.read())
        for line in r.iter_lines():
            if not line:
                continue
            ev = _decode(line)
            typ = str(ev.get("type"))
            obj = ev.get("object") or {}
            if typ == "ERROR":
                raise error_of(int(obj.get("code") or 500), obj)
            if typ != "BOOKMARK":
                obj.setdefault("apiVersion", k.api_version)
                obj.setdefault("kind", k.kind)
            yield typ, obj

    def get(self, kind: str | Kind, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.request("GET", _kind(kind).path(namespace, name))  # type: ignore[no-any-return]
        except NotFound:
            return None

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(PODS, name, namespace)

    # ------------------------------------------------------------------ writes
    def create(self, kind: str | Kind, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return self.request("POST", _kind(kind).path(namespace), obj)  # type: ignore[no-any-return]

    def replace(self, kind: str | Kind, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        path = _kind(kind).path(meta.get("namespace"), meta.get("name"))
        return self.request("PUT", path, obj)  # type: ignore[no-any-return]

    def patch(
        self, kind: str | Kind, name: str, namespace: str | None, body: dict[str, Any], sub: str | None = None
    ) -> dict[str, Any]:
        """JSON merge patch (RFC 7386): None removes a key."""
        path = _kind(kind).path(namespace, name, sub)
        return self.request("PATCH", path, body, headers=MERGE)  # type: ignore[no-any-return]

    def delete(
        self, kind: str | Kind, name: str, namespace: str | None = None, grace: int | None = None
    ) -> None:
        body = {"gracePeriodSeconds": grace} if grace is not None else None
        self.request("DELETE", _kind(kind).path(namespace, name), body)

    def patch_pod_annotations(self, namespace: str, name: str, notes: dict[str, str | None]) -> None:
        self.patch(PODS, name, namespace, {"metadata": {"annotations": notes}})

    def bind(
        self, namespace: str, name: str, uid: str, node: str, notes: dict[str, str] | None = None
    ) -> None:
        """POST pods/{name}/binding; the server copies the Binding's annotations onto the pod.

        One call records the device assignment and binds; the uid makes a bind of a
        recreated pod of the same name fail instead of binding the wrong pod.
        """
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if notes:
            meta["annotations"] = notes
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"kind": "Node", "name": node},
        }
        self.request("POST", PODS.path(namespace, name, "binding"), body)

    def evict(self, namespace: str, name: str, reason: str = "") -> None:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        self.request("POST", PODS.path(namespace, name, "eviction"), body)

    def event(self, obj: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        meta = obj.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'phalanx')}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", "Pod"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self.field_manager},
            "reportingComponent": self.field_manager,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.create(EVENTS, body, ns)

    def patch_status(self, kind: str, name: str, namespace: str | None, status: dict[str, Any]) -> None:
        self.patch(kind, name, namespace, {"status": status}, sub="status")

    # ------------------------------------------------------------------ leases and namespaces
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(LEASES, name, namespace)

    def write_lease(self, lease: dict[str, Any], create: bool) -> dict[str, Any]:
        if create:
            return self.create(LEASES, lease, lease["metadata"]["namespace"])
        return self.replace(LEASES, lease)  # carries resourceVersion: a racing write gets 409

    def get_namespace(self, name: str) -> dict[str, Any] | None:
        return self.get(NAMESPACES, name)

    def create_namespace(self, name: str) -> None:
        self.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


__all__ = ["BY_KEY", "Api", "ApiError", "Conflict", "Forbidden", "Gone", "NotFound", "error_of"]
