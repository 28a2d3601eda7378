"""An in-process fake of the Kubernetes API server, for the adapter tests (no cluster in CI).

It speaks HTTP/JSON like the real one, so the real client (lightkube) talks to it unchanged,
and keeps the semantics the scheduler depends on:
- every write bumps a global resourceVersion; PUT/PATCH with a stale resourceVersion: 409;
- list returns the current resourceVersion; watch streams ADDED/MODIFIED/DELETED events after
  a resourceVersion, or answers 410 Gone (an ERROR event) when it has been compacted away;
- POST pods/{name}/binding sets spec.nodeName, 409 if the pod is already bound;
- POST pods/{name}/eviction deletes the pod;
- faults: a request can fail with a status code, time out (after or before it took effect),
  and open watches can be dropped.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from quiet_http import QuietServer

# plural -> (namespaced, kind)
CORE = {
    "pods": (True, "Pod"),
    "nodes": (False, "Node"),
    "events": (True, "Event"),
    "namespaces": (False, "Namespace"),
}
GROUPS: dict[tuple[str, str], dict[str, tuple[bool, str]]] = {
    ("coordination.k8s.io", "v1"): {"leases": (True, "Lease")},
    ("scheduling.phalanx.io", "v1alpha1"): {"podgroups": (True, "PodGroup"), "queues": (False, "Queue")},
    ("scheduling.run.ai", "v2alpha2"): {"podgroups": (True, "PodGroup")},
    ("scheduling.run.ai", "v2"): {"queues": (False, "Queue")},
    ("scheduling.volcano.sh", "v1beta1"): {"podgroups": (True, "PodGroup"), "queues": (False, "Queue")},
    ("scheduling.x-k8s.io", "v1alpha1"): {"podgroups": (True, "PodGroup")},
    ("resource.k8s.io", "v1"): {
        "deviceclasses": (False, "DeviceClass"),
        "resourceslices": (False, "ResourceSlice"),
        "resourceclaims": (True, "ResourceClaim"),
        "resourceclaimtemplates": (True, "ResourceClaimTemplate"),
    },
}


@dataclass
class Fault:
    method: str
    pattern: str  # regex on the path
    status: int = 500  # HTTP status, or 0 for a timeout
    times: int = 1
    applied: bool = False  # for timeouts: whether the request took effect before it timed out


@dataclass
class Route:
    api: str  # "v1" or "group/version"
    plural: str
    namespace: str | None
    name: str | None
    sub: str | None
    namespaced: bool
    kind: str


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


@dataclass
class FakeApi:
    store: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = field(default_factory=dict)
    rv: int = 0
    log: list[tuple[int, str, tuple[str, str], str, dict[str, Any]]] = field(default_factory=list)
    compacted: int = 0
    faults: list[Fault] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    watch_epoch: int = 0
    binds: dict[str, int] = field(default_factory=dict)  # successful binds per pod
    timeout_s: float = 2.0
    absent: set[str] = field(default_factory=set)  # API groups this server does not serve (no CRD)
    # clients to close before the server goes (a scheduler left running by a failed assertion
    # would otherwise retry its watches against nothing, and print so, long after its test)
    clients: list[Callable[[], None]] = field(default_factory=list)
    # watches send nothing written after this resourceVersion (None: everything): a lagging watch
    held_after: int | None = None

    def __post_init__(self) -> None:
        self.lock = threading.Condition()
        handler = type("Handler", (_Handler,), {"api": self})
        self.server = QuietServer(("127.0.0.1", 0), handler)  # watches cut at a test's end: no traceback
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeApi:
        self.thread.start()
        return self

    def stop(self) -> None:
        for close in reversed(self.clients):
            close()
        self.clients.clear()
        self.drop_watches()
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ test helpers
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object directly (as kubectl apply would)."""
        api = obj["apiVersion"]
        plural = _plural(api, obj["kind"])
        ns = (obj.get("metadata") or {}).get("namespace") or ""
        with self.lock:
            return self._write((api, plural), ns, obj["metadata"]["name"], copy.deepcopy(obj))

    def get(self, api: str, plural: str, name: str, ns: str = "") -> dict[str, Any] | None:
        with self.lock:
            obj = self.store.get((api, plural), {}).get((ns, name))
            return copy.deepcopy(obj) if obj is not None else None

    def all(self, api: str, plural: str) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(o) for o in self.store.get((api, plural), {}).values()]

    def delete(self, api: str, plural: str, name: str, ns: str = "") -> None:
        with self.lock:
            self._delete((api, plural), ns, name)

    def fail(
        self, method: str, pattern: str, status: int = 500, times: int = 1, applied: bool = False
    ) -> None:
        with self.lock:
            self.faults.append(Fault(method, pattern, status, times, applied))

    def drop_watches(self) -> None:
        with self.lock:
            self.watch_epoch += 1
            self.lock.notify_all()

    def lag(self) -> int:
        """From now on watches lag: nothing written from here on goes out until `catch_up`."""
        with self.lock:
            self.held_after = self.rv
            return self.rv

    def catch_up(self, upto: int | None = None) -> None:
        """Watches send what was written up to resourceVersion `upto` (None: all, and lag no more)."""
        with self.lock:
            self.held_after = upto
            self.lock.notify_all()

    def compact(self) -> None:
        """Forget the event history: watches from an older resourceVersion get 410 Gone."""
        with self.lock:
            self.compacted = self.rv
            self.log.clear()
            self.watch_epoch += 1
            self.lock.notify_all()

    # ------------------------------------------------------------------ storage
    def _write(self, res: tuple[str, str], ns: str, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        table = self.store.setdefault(res, {})
        kind = "MODIFIED" if (ns, name) in table else "ADDED"
        self.rv += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.rv)
        meta.setdefault("uid", f"uid-{res[1]}-{ns}-{name}")
        meta.setdefault("creationTimestamp", "2026-11-29T10:00:00Z")
        if ns:
            meta["namespace"] = ns
        table[(ns, name)] = obj
        self.log.append((self.rv, kind, res, ns, copy.deepcopy(obj)))
        self.lock.notify_all()
        return obj

    def _delete(self, res: tuple[str, str], ns: str, name: str) -> dict[str, Any] | None:
        obj = self.store.get(res, {}).pop((ns, name), None)
        if obj is not None:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.log.append((self.rv, "DELETED", res, ns, copy.deepcopy(obj)))
            self.lock.notify_all()
        return obj


def _plural(api: str, kind: str) -> str:
    if api == "v1":
        return next(p for p, (_, k) in CORE.items() if k == kind)
    g, v = api.split("/")
    return next(p for p, (_, k) in GROUPS[(g, v)].items() if k == kind)


_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class _Handler(BaseHTTPRequestHandler):
    api: FakeApi
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ------------------------------------------------------------------ plumbing
    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"null") if n else None

    def _route(self, path: str) -> Route | None:
        m = _PATH.match(path)
        if not m:
            return None
        api = "v1" if m["core"] else f"{m['group']}/{m['version']}"
        if m["group"] in self.api.absent:
            return None
        table = CORE if m["core"] else GROUPS.get((m["group"], m["version"]), {})
        if m["plural"] not in table:
            return None
        namespaced, kind = table[m["plural"]]
        return Route(api, m["plural"], m["ns"], m["name"], m["sub"], namespaced, kind)

    def _fault(self, method: str, path: str) -> Fault | None:
        a = self.api
        with a.lock:
            a.requests.append((method, path))
            for f in a.faults:
                if f.times > 0 and f.method == method and re.search(f.pattern, path):
                    f.times -= 1
                    return f
        return None

    def _discovery(self, path: str) -> dict[str, Any] | None:
        """GET /apis and /apis/{group}/{version}, as the real server answers them."""
        served = {gv: t for gv, t in GROUPS.items() if gv[0] not in self.api.absent}
        if path == "/apis":
            by_group: dict[str, list[str]] = {}
            for g, v in served:
                by_group.setdefault(g, []).append(v)
            return {
                "kind": "APIGroupList",
                "groups": [
                    {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs]}
                    for g, vs in by_group.items()
                ],
            }
        m = re.match(r"^/apis/([^/]+)/([^/]+)$", path)
        if m and (m[1], m[2]) in served:
            table = served[(m[1], m[2])]
            return {
                "kind": "APIResourceList",
                "groupVersion": f"{m[1]}/{m[2]}",
                "resources": [{"name": p, "namespaced": ns, "kind": k} for p, (ns, k) in table.items()],
            }
        return None

    def _handle(self, method: str) -> None:
        u = urlparse(self.path)
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        if method == "GET":
            listing = self._discovery(u.path)
            if listing is not None:
                with self.api.lock:
                    self.api.requests.append((method, u.path))
                self._send(200, listing)
                return
        r = self._route(u.path)
        body = self._body() if method in ("POST", "PUT", "PATCH") else None
        if r is None:
            self._send(404, _status(404, "NotFound", f"no route {u.path}"))
            return
        fault = self._fault(method, u.path)
        if fault is not None and fault.status:
            self._send(fault.status, _status(fault.status, "Injected", f"injected {fault.status}"))
            return
        if fault is not None and not fault.applied:
            time.sleep(self.api.timeout_s)  # the client gives up first; nothing happened
            self.close_connection = True
            return
        code, out = self._apply(method, r, q, body)
        if fault is not None:  # it took effect, but the client never hears
            time.sleep(self.api.timeout_s)
            self.close_connection = True
            return
        if out is not None:
            self._send(code, out)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ------------------------------------------------------------------ semantics
    def _apply(
        self, method: str, r: Route, q: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any] | None]:
        a = self.api
        res = (r.api, r.plural)
        ns = r.namespace or ""
        if method == "GET" and r.name is None:
            if q.get("watch") in ("true", "1"):
                self._watch(r, q)
                return 0, None
            with a.lock:
                items = [
                    copy.deepcopy(o)
                    for (ons, _), o in sorted(a.store.get(res, {}).items())
                    if not r.namespace or ons == r.namespace
                ]
                return 200, {
                    "kind": f"{r.kind}List",
                    "apiVersion": r.api,
                    "metadata": {"resourceVersion": str(a.rv)},
                    "items": items,
                }
        with a.lock:
            table = a.store.setdefault(res, {})
            cur = table.get((ns, r.name or ""))
            if method == "GET":
                return (
                    (200, copy.deepcopy(cur))
                    if cur
                    else (404, _status(404, "NotFound", f"{r.plural} {r.name} not found"))
                )
            if method == "POST" and r.sub == "binding":
                if cur is None:
                    return 404, _status(404, "NotFound", f"pods {r.name} not found")
                if (cur.get("spec") or {}).get("nodeName"):
                    msg = f"pod {r.name} is already assigned to node {cur['spec']['nodeName']}"
                    return 409, _status(409, "Conflict", msg)
                new = copy.deepcopy(cur)
                new.setdefault("spec", {})["nodeName"] = body["target"]["name"]
                # as the real server does: the Binding's annotations are copied onto the pod
                notes = (body.get("metadata") or {}).get("annotations") or {}
                if notes:
                    new.setdefault("metadata", {}).setdefault("annotations", {}).update(notes)
                a._write(res, ns, r.name or "", new)
                key = f"{ns}/{r.name}"
                a.binds[key] = a.binds.get(key, 0) + 1
                return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
            if method == "POST" and r.sub == "eviction":
                if cur is None:
                    return 404, _status(404, "NotFound", f"pods {r.name} not found")
                a._delete(res, ns, r.name or "")
                return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
            if method == "POST":
                name = (
                    body["metadata"].get("name")
                    or f"{body['metadata'].get('generateName', 'obj-')}{a.rv + 1}"
                )
                if (ns, name) in table:
                    return 409, _status(409, "AlreadyExists", f"{r.plural} {name} already exists")
                body["metadata"]["name"] = name
                return 201, copy.deepcopy(a._write(res, ns, name, body))
            if cur is None:
                return 404, _status(404, "NotFound", f"{r.plural} {r.name} not found")
            want = ((body or {}).get("metadata") or {}).get("resourceVersion")
            if want and want != cur["metadata"]["resourceVersion"]:
                return 409, _status(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version",
                )
            if method == "DELETE":
                a._delete(res, ns, r.name or "")
                return 200, _status(200, "Deleted", "deleted") | {"status": "Success"}
            if method == "PUT":
                new = copy.deepcopy(body)
                if r.sub == "status":
                    new = copy.deepcopy(cur) | {"status": body.get("status")}
            else:  # PATCH: JSON merge patch
                if r.sub == "status":
                    body = {"status": (body or {}).get("status")}
                else:
                    body = {k: v for k, v in (body or {}).items() if k != "status"}
                new = merge_patch(cur, body)
                new.get("metadata", {}).pop("resourceVersion", None)
            return 200, copy.deepcopy(a._write(res, ns, r.name or "", new))

    def _watch(self, r: Route, q: dict[str, str]) -> None:
        a = self.api
        res = (r.api, r.plural)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def emit(kind: str, obj: dict[str, Any]) -> None:
            data = (json.dumps({"type": kind, "object": obj}) + "\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 30)
        try:
            with a.lock:
                epoch = a.watch_epoch
                start = int(q["resourceVersion"]) if q.get("resourceVersion") else None
                if start is not None and start < a.compacted:
                    emit(
                        "ERROR", _status(410, "Expired", f"too old resource version: {start} ({a.compacted})")
                    )
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if start is None:
                    for (ons, _), o in sorted(a.store.get(res, {}).items()):
                        if not r.namespace or ons == r.namespace:
                            emit("ADDED", o)
                    start = a.rv
                sent = start
                while time.monotonic() < deadline:
                    # dropped (or compacted) while waiting: nothing written since goes out on this
                    # stream, and no clean end of it; checked before sending, as the writer that
                    # dropped it may already have written again by the time this thread wakes
                    if a.watch_epoch != epoch:
                        self.close_connection = True
                        return
                    upto = a.rv if a.held_after is None else a.held_after
                    for rv, kind, ores, ons, obj in list(a.log):
                        if rv > upto:
                            break
                        if rv > sent and ores == res and (not r.namespace or ons == r.namespace):
                            emit(kind, obj)
                        sent = max(sent, rv) if rv > sent else sent
                    sent = max(sent, upto)
                    a.lock.wait(0.05)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
