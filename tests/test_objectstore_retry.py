"""The throw-away S3 server (SeaweedFS `weed mini`) tries again with new ports when a port it was
given is taken before it binds it (a busy machine), and gives up at once on anything else."""

from __future__ import annotations

import pytest

from phalanx.node.objectstore import S3Server


def test_a_taken_port_is_tried_again_and_other_failures_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    failures = [
        "weed mini exited 255: Filer listener error: listen tcp 127.0.0.1:60857: "
        "bind: address already in use",
        "weed mini exited 1: Port allocation failed for filer",
    ]
    calls: list[float] = []

    def start(self: S3Server, timeout: float) -> S3Server:
        calls.append(timeout)
        if failures:
            raise RuntimeError(failures.pop(0))
        return self

    monkeypatch.setattr(S3Server, "_start", start)
    s = S3Server()
    assert s.start(timeout=5.0) is s and len(calls) == 3  # two taken ports, then up

    failures[:] = ["weed mini exited 2: unknown flag -ip.bind"]
    calls.clear()
    with pytest.raises(RuntimeError, match="unknown flag"):
        s.start(timeout=5.0)
    assert len(calls) == 1

    failures[:] = ["bind: address already in use"] * 3
    calls.clear()
    with pytest.raises(RuntimeError, match="address already in use"):
        s.start(timeout=5.0, tries=3)
    assert len(calls) == 3
