"""The scheduler's endpoints behind the API server's authentication and authorization (a fake one here;
tests/test_e2e_endpoints.py asks the real one)."""

from __future__ import annotations

import json
from typing import Any

import httpx2

from phalanx.k8s.view.authn import ACCESS_REVIEWS, TOKEN_REVIEWS, Guard, User, tls_context
from phalanx.k8s.view.board import PROBLEM_NAMESPACES, Board
from phalanx.k8s.view.server import Metrics, serve

USERS = {"admin-token": ("admin", ["system:masters"]), "viewer-token": ("alice", ["phalanx-viewer"])}
USERS["nobody-token"] = ("bob", [])


class FakeReviews:
    """Answers TokenReviews and SubjectAccessReviews as an API server with RBAC would."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.sent.append(path)
        spec = body["spec"]
        if path == TOKEN_REVIEWS:
            hit = USERS.get(spec["token"])
            if hit is None:
                return {"status": {"authenticated": False}}
            return {"status": {"authenticated": True, "user": {"username": hit[0], "groups": hit[1]}}}
        assert path == ACCESS_REVIEWS
        groups = spec.get("groups", [])
        if "system:masters" in groups:
            return {"status": {"allowed": True}}
        if "nonResourceAttributes" in spec:
            return {"status": {"allowed": "phalanx-viewer" in groups}}
        return {"status": {"allowed": spec["resourceAttributes"]["namespace"] == "team-a"}}


def board() -> Board:
    b = Board()
    b._state = {
        "generated": 1.0,
        "summary": {"waiting": 2},
        "pending": [{"workload": "team-a/x"}, {"workload": "team-b/y"}],
        "recent": [{"what": "team-b/y-0"}, {"what": "team-a/x-0"}],
        "problems": ["Pod team-b/z: bad", "Node n1: bad"],
        PROBLEM_NAMESPACES: ["team-b", None],
    }
    b._details = {
        "workload/team-b/y": {"name": "team-b/y"},
        "node/n1": {"name": "n1", "pods": ["team-a/x-0", "team-b/y-0"], "gpus": []},
    }
    return b


def test_probes_are_open_the_rest_needs_a_token_the_api_server_accepts_and_a_role() -> None:
    fake = FakeReviews()
    guard = Guard(fake)  # type: ignore[arg-type]
    tls = tls_context(None, None, ("localhost", "127.0.0.1"))
    server = serve(0, Metrics(), lambda: True, board(), guard=guard, tls=tls, address="127.0.0.1")
    base = f"https://127.0.0.1:{server.server_port}"
    with httpx2.Client(verify=False) as c:

        def get(path: str, token: str | None = None) -> httpx2.Response:
            return c.get(base + path, headers={"Authorization": f"Bearer {token}"} if token else {})

        assert get("/healthz").status_code == 200 and get("/readyz").status_code == 200
        assert fake.sent == []  # probes cost the API server nothing
        r = get("/metrics")
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
        assert get("/metrics", "forged").status_code == 401
        assert get("/dashboard/state.json").status_code == 401
        assert get("/metrics", "nobody-token").status_code == 403
        assert get("/dashboard/state.json", "nobody-token").status_code == 403
        assert get("/metrics", "viewer-token").status_code == 200
        assert "phalanx_binds_total" in get("/metrics", "admin-token").text
        # the viewer may list pods in team-a only: it sees team-a's workloads and pods, not team-b's
        st = json.loads(get("/dashboard/state.json", "viewer-token").text)
        assert [r["workload"] for r in st["pending"]] == ["team-a/x"]
        assert [r["what"] for r in st["recent"]] == ["team-a/x-0"]
        assert st["problems"] == ["Node n1: bad"] and st["summary"]["waiting"] == 1
        assert PROBLEM_NAMESPACES not in st
        assert get("/dashboard/api/workload/team-b%2Fy", "viewer-token").status_code == 404
        assert json.loads(get("/dashboard/api/node/n1", "viewer-token").text)["pods"] == ["team-a/x-0"]
        full = json.loads(get("/dashboard/state.json", "admin-token").text)
        assert len(full["pending"]) == 2 and len(full["problems"]) == 2
        # cached: asking again sends no review
        n = len(fake.sent)
        get("/dashboard/state.json", "viewer-token")
        assert len(fake.sent) == n
    server.shutdown()


def test_plain_http_does_not_answer_on_the_https_port_and_the_cache_is_bounded() -> None:
    fake = FakeReviews()
    guard = Guard(fake, size=2)  # type: ignore[arg-type]
    server = serve(0, Metrics(), lambda: True, None, guard=guard, tls=tls_context(None, None, ("localhost",)))
    try:
        httpx2.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=3)
        raise AssertionError("plain HTTP answered on the HTTPS port")
    except httpx2.HTTPError:
        pass
    for i in range(5):
        guard.authenticate(f"Bearer t{i}")
    assert len(guard.tokens) == 2
    assert guard.authenticate(None) is None and guard.authenticate("Basic x") is None
    assert guard.allowed(User("alice", groups=("phalanx-viewer",)), path="/metrics")
    server.shutdown()


def test_an_api_server_that_does_not_answer_denies() -> None:
    class Down:
        def request(self, *a: Any, **k: Any) -> Any:
            raise ConnectionError("refused")

    g = Guard(Down())  # type: ignore[arg-type]
    assert g.authenticate("Bearer x") is None
    assert not g.allowed(User("a"), path="/metrics")
    assert len(g.tokens) == 0 and len(g.access) == 0  # not cached: the next call asks again
