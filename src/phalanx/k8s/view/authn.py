"""Who may read the scheduler's endpoints: the API server decides, as for kube-scheduler's.

A caller's bearer token is checked with a TokenReview (authentication.k8s.io/v1); the user it
names is then asked about with a SubjectAccessReview (authorization.k8s.io/v1): `get` on the
non-resource URL asked for (/metrics, /dashboard/...), and, for the dashboard, `list pods` in
each namespace whose workloads it would show. Answers are cached briefly (`ttl_s`, at most
`size` of each kind), so a dashboard polling every few seconds costs the API server little.
An API server that cannot be reached denies: nothing is served on an unverified token.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.k8s import certs
from phalanx.k8s.client.api import Api

log = logging.getLogger("phalanx.k8s")
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def spec(self) -> dict[str, Any]:
        s: dict[str, Any] = {"user": self.name, "groups": list(self.groups)}
        if self.uid:
            s["uid"] = self.uid
        if self.extra:
            s["extra"] = {k: list(v) for k, v in self.extra}
        return s


class _Cache:
    """A small LRU with expiry: key -> value, each for `ttl_s`."""

    def __init__(self, ttl_s: float, size: int, clock: Callable[[], float]) -> None:
        self.ttl_s, self.size, self.clock = ttl_s, size, clock
        self._d: OrderedDict[Any, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> tuple[bool, Any]:
        with self._lock:
            hit = self._d.get(key)
            if hit is None or hit[0] < self.clock():
                self._d.pop(key, None)
                return False, None
            self._d.move_to_end(key)
            return True, hit[1]

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._d[key] = (self.clock() + self.ttl_s, value)
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


class Guard:
    """Authenticates bearer tokens and authorizes their users, through the API server."""

    def __init__(
        self, api: Api, ttl_s: float = 10.0, size: int = 1024, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.api = api
        self.tokens = _Cache(ttl_s, size, clock)
        self.access = _Cache(ttl_s, size * 4, clock)
        self.reviews = 0  # reviews sent (tests)

    def authenticate(self, header: str | None) -> User | None:
        """The user of an `Authorization: Bearer ...` header, or None (no header, a bad token)."""
        if not header or not header.lower().startswith("bearer "):
            return None
        token = header[7:].strip()
        if not token:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()  # the token itself is not kept
        hit, cached = self.tokens.get(key)
        if hit:
            return cached  # type: ignore[no-any-return]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        user: User | None = None
        try:
            self.reviews += 1
            st = (self.api.request("POST", TOKEN_REVIEWS, body) or {}).get("status") or {}
            if st.get("authenticated"):
                u = st.get("user") or {}
                extra = tuple(sorted((k, tuple(v)) for k, v in (u.get("extra") or {}).items()))
                user = User(
                    str(u.get("username", "")), str(u.get("uid", "")), tuple(u.get("groups") or ()), extra
                )
        except Exception as e:  # the API server is away: deny, and do not cache it
            log.warning("TokenReview failed: %s", e)
            return None
        self.tokens.put(key, user)
        return user

    def allowed(self, user: User, path: str | None = None, namespace: str | None = None) -> bool:
        """`get` on the non-resource URL `path`, or `list pods` in `namespace` ("" for all of them)."""
        attrs: dict[str, Any]
        if path is not None:
            attrs = {"nonResourceAttributes": {"path": path, "verb": "get"}}
        else:
            attrs = {"resourceAttributes": {"namespace": namespace or "", "verb": "list", "resource": "pods"}}
        key = (user, path, namespace)
        hit, ok = self.access.get(key)
        if hit:
            return bool(ok)
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {**user.spec(), **attrs},
        }
        try:
            self.reviews += 1
            st = (self.api.request("POST", ACCESS_REVIEWS, body) or {}).get("status") or {}
        except Exception as e:
            log.warning("SubjectAccessReview failed: %s", e)
            return False
        ok = bool(st.get("allowed")) and not st.get("denied")
        self.access.put(key, ok)
        return ok

    def namespaces(self, user: User) -> Callable[[str], bool]:
        """Which namespaces' workloads the user may see: those it may list pods in."""
        if self.allowed(user, namespace=""):
            return lambda ns: True
        return lambda ns: self.allowed(user, namespace=ns)


def tls_context(cert_file: Path | None, key_file: Path | None, names: tuple[str, ...]) -> ssl.SSLContext:
    """A server TLS context: the given certificate, or a self-made one for `names` (kept in memory
    but for the moment it is loaded: the key file is written to a private temporary folder)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None and key_file is not None:
        ctx.load_cert_chain(str(cert_file), str(key_file))
        return ctx
    ca = certs.make_ca("phalanx-scheduler-ca")
    pair = certs.issue(ca, "phalanx-scheduler", server_names=names)
    with tempfile.TemporaryDirectory(prefix="phalanx-tls-") as d:
        c, k = pair.write(Path(d), "serving")
        Path(c).write_bytes(pair.cert + ca.cert)
        ctx.load_cert_chain(str(c), str(k))
    return ctx
