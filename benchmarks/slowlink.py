"""A TCP proxy that stands in for a remote object store's link: every byte it returns shares one
rate limit, and each is counted with the time it passed (for bench_distcache_nodes).

The clock is the host's /proc/uptime, which a pod on a kit node reads too (the nodes share this
machine's kernel), so a pod's epoch can be matched with the bytes that crossed the link meanwhile.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from bisect import bisect_left, bisect_right

CHUNK = 64 << 10


def uptime() -> float:
    """Seconds since boot, as a pod's `cut -d' ' -f1 /proc/uptime` reads them."""
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


class SlowLink:
    """Listens on `ip` (a free port), forwards to `upstream` (host, port); returns at most
    `bytes_per_s` in all, downstream."""

    def __init__(self, ip: str, upstream: tuple[str, int], bytes_per_s: float) -> None:
        self.upstream, self.rate = upstream, bytes_per_s
        self.sock = socket.create_server((ip, 0))
        self.endpoint = f"http://{ip}:{self.sock.getsockname()[1]}"
        self._lock = threading.Lock()
        self._next = time.monotonic()
        self.times: list[float] = []  # uptime of each chunk returned, and its size
        self.sizes: list[int] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def bytes_between(self, t0: float, t1: float) -> int:
        """Bytes returned between two uptimes."""
        with self._lock:
            i, j = bisect_left(self.times, t0), bisect_right(self.times, t1)
            return sum(self.sizes[i:j])

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.sizes)

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, up, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        try:
            while data := src.recv(CHUNK):
                if down:
                    self._pace(len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def _pace(self, n: int) -> None:
        """Wait for this chunk's turn on the shared link, and count it."""
        with self._lock:
            now = time.monotonic()
            until = self._next = max(now, self._next) + n / self.rate
            self.times.append(uptime())
            self.sizes.append(n)
        time.sleep(max(0.0, until - now))
