"""A throw-away SeaweedFS cluster on loopback (1 master, 1 filer, N volume servers), for tests and benchmarks.

Each volume server has its own folder and a capacity of `max_volumes` x `volume_mb`, standing for
one node's NVMe in the distributed dataset cache (`phalanx.node.distcache`). Volume servers are
started with `-volume.allowUntrustedRemoteEndpoints`: SeaweedFS refuses by default to fetch a
remote object from a loopback or private address (an SSRF guard), and both the test S3 source and
an in-cluster object store live on one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.node.objectstore import find_weed, free_ports, on_fresh_ports


@dataclass
class VolumeServer:
    port: int
    grpc: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class WeedCluster:
    volumes: int = 4
    max_volumes: int = 8  # volume slots per server: its capacity is max_volumes x volume_mb
    volume_mb: int = 4
    master: str = ""  # host:port.grpc (what weed takes)
    filer: str = ""  # host:port.grpc
    servers: list[VolumeServer] = field(default_factory=list)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _dir: Path = Path()

    @property
    def capacity(self) -> int:
        """Bytes one volume server can hold."""
        return self.max_volumes * self.volume_mb << 20

    @property
    def filer_url(self) -> str:
        return "http://" + self.filer.rsplit(".", 1)[0]

    @property
    def master_url(self) -> str:
        return "http://" + self.master.rsplit(".", 1)[0]

    def start(self, timeout: float = 60.0) -> WeedCluster:
        """Start it, on new ports if one was taken (`on_fresh_ports`)."""
        return on_fresh_ports(lambda: self._start(timeout))

    def _start(self, timeout: float) -> WeedCluster:
        weed = str(find_weed())
        self.servers = []
        self._dir = Path(tempfile.mkdtemp(prefix="phalanx-weed-"))
        ports = free_ports(4 + 2 * self.volumes)
        self.master = f"127.0.0.1:{ports[0]}.{ports[1]}"
        self.filer = f"127.0.0.1:{ports[2]}.{ports[3]}"
        loop = ["-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        (self._dir / "master").mkdir()
        self._spawn(
            "master",
            [
                *(weed, "master", *loop, f"-port={ports[0]}", f"-port.grpc={ports[1]}"),
                *(f"-mdir={self._dir / 'master'}", f"-volumeSizeLimitMB={self.volume_mb}"),
            ],
        )
        for i in range(self.volumes):
            vs = VolumeServer(ports[4 + 2 * i], ports[5 + 2 * i], self._dir / f"volume{i}")
            vs.folder.mkdir()
            self.servers.append(vs)
            self._start_volume(weed, vs)
        (self._dir / "filer").mkdir()
        self._spawn(
            "filer",
            [
                *(weed, "filer", *loop, f"-port={ports[2]}", f"-port.grpc={ports[3]}"),
                *(f"-master={self.master}", f"-defaultStoreDir={self._dir / 'filer'}"),
                "-allowUntrustedRemoteEndpoints",  # reads through to the loopback source
            ],
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self._procs:
                if p.poll() is not None:
                    why = f"a weed process exited {p.returncode}: {self.log_tail()}"
                    self.stop()
                    raise RuntimeError(why)
            if self._ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the SeaweedFS cluster was not up within {timeout:.0f} s")

    def _start_volume(self, weed: str, vs: VolumeServer) -> None:
        vs.proc = self._spawn(
            vs.folder.name,
            [
                *(weed, "volume", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-port={vs.port}"),
                *(f"-port.grpc={vs.grpc}", f"-dir={vs.folder}", f"-max={self.max_volumes}"),
                *(f"-master={self.master}", "-preStopSeconds=0", "-minFreeSpace=1MiB"),
                "-volume.allowUntrustedRemoteEndpoints",
            ],
        )

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self._dir / f"{name}.log", "wb")  # noqa: SIM115 (the process owns it)
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self._dir)
        self._procs.append(p)
        return p

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.master_url + "/dir/status", timeout=2) as r:
                topo = json.load(r)["Topology"]
            nodes = [
                n for dc in topo.get("DataCenters") or [] for rack in dc["Racks"] for n in rack["DataNodes"]
            ]
            if len(nodes) < self.volumes:
                return False
            with urllib.request.urlopen(self.filer_url + "/", timeout=2):
                return True
        except (OSError, ValueError, KeyError):
            return False

    def kill_volume(self, i: int) -> VolumeServer:
        """SIGKILL volume server `i` (a node lost), and wait until the master no longer lists it."""
        vs = self.servers[i]
        assert vs.proc is not None
        vs.proc.kill()
        vs.proc.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.master_url + "/dir/status", timeout=2) as r:
                    topo = json.load(r)["Topology"]
                urls = {
                    n["Url"] for dc in topo["DataCenters"] for rack in dc["Racks"] for n in rack["DataNodes"]
                }
                if vs.address not in urls:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        return vs

    def log_tail(self) -> str:
        out = []
        for f in sorted(self._dir.glob("*.log")):
            out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-800:])
        return "\n".join(out)

    def stop(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()
        if self._dir != Path():
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> WeedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
