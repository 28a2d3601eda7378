"""`phalanx distcache`: Datasets with `spec.cache: distributed`, cached once across a SeaweedFS cluster.

A per-node copy (`phalanx cache`) cannot hold a dataset larger than one node's NVMe. Here the
dataset's `s3://` source is mounted into the SeaweedFS filer (`remote.mount`) at
`/phalanx/datasets/<ns>/<name>` and its content fetched into the volume servers (`remote.cache`):
the master spreads the chunks over every volume server (one per cache node's NVMe), with
`spec.replicas` copies of each chunk (SeaweedFS replication `00N`: on other servers). The engine
does the placement, so this runs once per cluster (a Deployment), not once per node: N agents
would race on the same `remote.cache`.

The engine is driven through `weed shell` (the `remote.*` and `fs.configure` commands exist
there only) and read back through the filer's and master's HTTP JSON: which chunks each file has
and which servers hold each volume. The truth for "is the whole dataset cached" is a fresh listing
of the source (s3fs), never the filer's own view, so a file missing or stale in the cache, or a
chunk whose every copy is gone, is counted as not cached: the status never reports a part as
whole. A chunk whose copies are all lost (a node wiped) is dropped from the cache
(`remote.uncache`, the file reads through to the source meanwhile) and fetched again.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import re
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from lightkube import Client
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Pod
from lightkube.types import PatchType

from phalanx.core.errors import SpecError
from phalanx.node import stager
from phalanx.node.cacheagent import DATASET, DatasetRes, open_source, read_secret
from phalanx.node.objectstore import find_weed
from phalanx.spec.datasets import Dataset, parse_dataset, pod_dataset

log = logging.getLogger("phalanx.distcache")
ROOT = "/phalanx/datasets"
_DIR_BIT = 1 << 31  # Go's os.ModeDir in the filer's `Mode`
RETRY_S = 30.0
# the scheduling gate the admission webhook puts on a pod whose distributed Dataset is not cached
# yet (spec.readiness: cached); lifted here once it is (phalanx.k8s.admission.mutation.DATASET_GATE)
GATE = "phalanx.io/dataset-cached"
READABLE = ("ready", "degraded")  # every file readable from the cache


class WeedError(Exception):
    """The engine refused or failed a command; the message is what it said."""


@dataclass(frozen=True)
class Chunk:
    volume: int
    size: int


@dataclass(frozen=True)
class CachedFile:
    """A file of the mounted folder as the filer holds it."""

    rel: str
    size: int
    remote_etag: str  # the source object's ETag when it was last synced ("" if never)
    chunks: tuple[Chunk, ...]


def dataset_path(ds: Dataset) -> str:
    return f"{ROOT}/{ds.namespace}/{ds.name}"


def remote_name(ds: Dataset) -> str:
    """The engine's name for the Dataset's remote storage and its collection of volumes.

    One per Dataset (credentials differ); SeaweedFS takes letters and digits only, so the name is
    the key's letters and digits, then a hash of the key (`a-b/c` and `ab/c` must not collide).
    """
    plain = re.sub(r"[^a-z0-9]", "", ds.key)[:40]
    return plain + hashlib.sha256(ds.key.encode()).hexdigest()[:8]


def replication(copies: int) -> str:
    """SeaweedFS replication for `copies` copies on distinct volume servers (any rack)."""
    return f"00{copies - 1}"


# ---------------------------------------------------------------------------------- the engine
@dataclass
class Weed:
    """One SeaweedFS cluster: `weed shell` for commands, HTTP JSON for reading back.

    `master` and `filer` are `host:port` or `host:port.grpcPort` (weed's form, when the gRPC port
    is not port + 10000).
    """

    master: str
    filer: str
    weed: Path = field(default_factory=find_weed)
    timeout: float = 3600.0

    def _http(self, addr: str) -> str:
        host, _, port = addr.rpartition(":")
        return f"http://{host}:{port.split('.')[0]}"

    def shell(self, *commands: str, timeout: float | None = None) -> str:
        """Run commands in one `weed shell` (fed on stdin: keys never show in `ps`); its output."""
        args = [str(self.weed), "shell", f"-master={self.master}", f"-filer={self.filer}"]
        try:
            p = subprocess.run(
                args,
                input="\n".join(commands) + "\n",
                capture_output=True,
                text=True,
                timeout=timeout or self.timeout,
            )
        except subprocess.TimeoutExpired:
            raise WeedError(f"weed shell timed out: {commands[0].split()[0]}") from None
        return p.stdout + p.stderr

    def configure_remote(self, name: str, endpoint: str, key: str, secret: str, region: str) -> None:
        cmd = f"remote.configure -name={name} -type=s3 -s3.region={region}"
        if endpoint:
            cmd += f" -s3.endpoint={endpoint}"
        if key:
            cmd += f" -s3.access_key={key} -s3.secret_key={secret}"
        _check(self.shell(cmd), "remote.configure")

    def mounts(self) -> dict[str, dict[str, Any]]:
        """Filer folder -> its remote ({name, bucket, path})."""
        out = self.shell("remote.mount")
        start = out.find("{")
        if start < 0:
            raise WeedError(f"remote.mount listed nothing readable: {out.strip()[-300:]}")
        try:
            maps = json.loads(out[start:]).get("mappings") or {}
        except ValueError:
            raise WeedError(f"remote.mount: not JSON: {out.strip()[-300:]}") from None
        return dict(maps)

    def mount(self, path: str, remote: str, collection: str, copies: int) -> None:
        """Where the chunks go (a collection per dataset, its replication), then the mount itself.

        The storage rule's prefix has no trailing slash: remote.cache asks for the folder's own
        path, and `/a/b/` would not match `/a/b`.
        """
        rule = f"fs.configure -locationPrefix={path} -collection={collection}"
        _check(self.shell(rule + f" -replication={replication(copies)} -apply"), "fs.configure")
        _check(self.shell(f"remote.mount -dir={path} -remote={remote} -nonempty"), "remote.mount")

    def unmount(self, path: str) -> None:
        """Drop the mount and its cached chunks (the source is never touched)."""
        _check(
            self.shell(f"remote.unmount -dir={path}", f"fs.configure -locationPrefix={path} -delete -apply"),
            "remote.unmount",
        )

    def cache(self, path: str, include: str = "", concurrent: int = 8) -> subprocess.Popen[str]:
        """Start `remote.cache` on the folder (metadata sync, then fetch).

        `-deleteLocalExtra=false`: its clean-up tries to delete nested folders (S3 lists them
        only as prefixes) and stops the run (4.48). So files deleted at the source stay in the
        filer; the status counts only what the source lists.
        """
        cmd = f"remote.cache -dir={path} -concurrent={concurrent} -deleteLocalExtra=false"
        if include:
            cmd += f" -include={include}"
        args = [str(self.weed), "shell", f"-master={self.master}", f"-filer={self.filer}"]
        p = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert p.stdin is not None
        p.stdin.write(cmd + "\n")
        p.stdin.close()
        return p

    def read_through(self, path: str, rels: list[str], concurrent: int = 8) -> list[str]:
        """Read files through the filer, which caches what it reads from a mounted remote; failures."""

        def read(rel: str) -> str:
            url = f"{self._http(self.filer)}{urllib.parse.quote(f'{path}/{rel}')}"
            try:
                with urllib.request.urlopen(url, timeout=600) as r:
                    while r.read(1 << 20):
                        pass
                return ""
            except (OSError, ValueError) as e:
                return f"failed: {rel}: {e}"

        with ThreadPoolExecutor(max(1, concurrent)) as pool:
            return [e for e in pool.map(read, rels) if e]

    def uncache(self, path: str, rels: list[str]) -> None:
        for rel in rels:
            folder, name = (f"{path}/{rel}").rsplit("/", 1)
            self.shell(f"remote.uncache -dir={folder} -include={name}")

    def files(self, path: str) -> list[CachedFile]:
        """Every file under `path` in the filer, with its chunks (recursive, paged)."""
        out: list[CachedFile] = []
        todo = [path]
        while todo:
            folder = todo.pop()
            last = ""
            while True:
                q = urllib.parse.urlencode({"limit": 1000, "lastFileName": last})
                page = self._get(f"{self._http(self.filer)}{urllib.parse.quote(folder)}/?{q}")
                entries = page.get("Entries") or []
                for e in entries:
                    full = str(e["FullPath"])
                    if int(e.get("Mode") or 0) & _DIR_BIT:
                        todo.append(full)
                        continue
                    out.append(_cached_file(e, full[len(path) + 1 :]))
                if not entries or not page.get("ShouldDisplayLoadMore"):
                    break
                last = str(page.get("LastFileName") or PurePosixPath(entries[-1]["FullPath"]).name)
        return out

    def locations(self) -> dict[int, list[str]]:
        """Volume id -> the live volume servers that hold a copy (the master's view)."""
        status = self._get(f"{self._http(self.master)}/vol/status")
        out: dict[int, list[str]] = {}
        for dc in (status.get("Volumes") or {}).get("DataCenters", {}).values():
            for rack in dc.values():
                for server, vols in rack.items():
                    for v in vols or []:
                        out.setdefault(int(v["Id"]), []).append(str(server))
        return out

    def _get(self, url: str) -> dict[str, Any]:
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return dict(json.load(r))
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return {}
            raise WeedError(f"GET {url}: {e}") from None
        except (OSError, ValueError) as e:
            raise WeedError(f"GET {url}: {e}") from None


def _cached_file(e: dict[str, Any], rel: str) -> CachedFile:
    chunks = tuple(
        Chunk(int((c.get("fid") or {}).get("volume_id") or str(c["file_id"]).split(",")[0]), int(c["size"]))
        for c in e.get("chunks") or []
    )
    remote = e.get("Remote") or {}
    return CachedFile(
        rel, int(e.get("FileSize") or 0), str(remote.get("remote_e_tag") or "").strip('"'), chunks
    )


def _check(out: str, what: str) -> None:
    bad = [ln.strip() for ln in out.splitlines() if ln.strip().startswith(("error", "failed"))]
    if bad:
        raise WeedError(f"{what}: {bad[0]}")


def failures(out: str) -> list[str]:
    """The per-file failures `remote.cache` printed ("failed: ..." / "error: ...")."""
    lines = [ln for part in out.splitlines() for ln in part.split("... ")]
    return [ln.strip() for ln in lines if ln.strip().startswith(("failed:", "error:"))]


# ---------------------------------------------------------------------------------- the status
@dataclass
class Summary:
    state: str  # caching, ready, degraded, failed
    total_bytes: int
    cached_bytes: int
    files: int
    cached_files: int
    servers: dict[str, int]
    lost: list[str]  # files with a chunk no live server holds: to fetch again
    reason: str = ""
    missing: list[str] = field(default_factory=list)  # source files not cached (lost ones too)

    def status(self, path: str, copies: int) -> dict[str, Any]:
        return {
            "state": self.state,
            "cachedBytes": self.cached_bytes,
            "totalBytes": self.total_bytes,
            "files": self.files,
            "cachedFiles": self.cached_files,
            "replicas": copies,
            "path": path,
            "servers": dict(sorted(self.servers.items())),
            "reason": self.reason,
        }


def summarize(
    source: list[stager.RemoteFile],
    cached: list[CachedFile],
    locations: dict[int, list[str]],
    copies: int,
) -> Summary:
    """How much of the source the cache holds, and where.

    A file counts as cached only if the filer has it at the source's size and ETag and every one of
    its chunks has a live copy; it is fully replicated if every chunk has `copies` of them.
    """
    have = {f.rel: f for f in cached}
    servers: dict[str, int] = {}
    for cf in cached:
        for c in cf.chunks:
            for s in locations.get(c.volume, []):
                servers[s] = servers.get(s, 0) + c.size
    cached_bytes = cached_files = 0
    short = 0
    lost: list[str] = []
    missing: list[str] = []
    for src in source:
        f = have.get(src.rel)
        if f is None or f.size != src.size or (src.etag and f.remote_etag and f.remote_etag != src.etag):
            missing.append(src.rel)
            continue
        if sum(c.size for c in f.chunks) < f.size:
            missing.append(src.rel)
            continue  # not fetched yet (or dropped): reads go to the source
        if any(not locations.get(c.volume) for c in f.chunks):
            lost.append(f.rel)
            missing.append(src.rel)
            continue
        cached_bytes += f.size
        cached_files += 1
        if any(len(locations[c.volume]) < copies for c in f.chunks):
            short += 1
    total = sum(f.size for f in source)
    if cached_files < len(source):
        state, reason = "caching", f"{len(source) - cached_files} of {len(source)} files not cached yet"
        if lost:
            reason += f" ({len(lost)} lost with their volume servers: fetched again)"
    elif short:
        state, reason = "degraded", f"{short} files have fewer than {copies} copies (a volume server lost)"
    else:
        state, reason = "ready", ""
    return Summary(state, total, cached_bytes, len(source), cached_files, servers, lost, reason, missing)


# ---------------------------------------------------------------------------------- the controller
class DistCache:
    """Mounts, caches, repairs and reports every distributed Dataset, one at a time."""

    def __init__(
        self,
        client: Client,
        weed: Weed,
        region: str = "us-east-1",
        concurrent: int = 8,
        progress_s: float = 2.0,
    ) -> None:
        self.client = client
        self.weed = weed
        self.region = region
        self.concurrent = concurrent
        self.progress_s = progress_s
        self.stop = threading.Event()
        self.configured: dict[str, tuple[str, ...]] = {}  # remote name -> what it was configured with
        self.failed: dict[str, float] = {}  # key -> when; retried after RETRY_S
        self.told: set[tuple[str, str]] = set()  # (pod uid, state) a held pod was told of

    def look(self) -> None:
        datasets: dict[str, Dataset] = {}
        for obj in self.client.list(DatasetRes, namespace="*"):
            raw: dict[str, Any] = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)  # type: ignore[no-untyped-call]
            try:
                ds = parse_dataset(raw)
            except SpecError as e:
                if (raw.get("spec") or {}).get("cache") == "distributed":
                    meta = raw.get("metadata") or {}
                    ns, name = str(meta.get("namespace")), str(meta.get("name"))
                    self._status(ns, name, {"state": "failed", "reason": str(e)})
                continue
            if ds.distributed:
                datasets[ds.key] = ds
        self._drop_gone(datasets)
        now = time.monotonic()
        for key, ds in sorted(datasets.items()):
            if self.stop.is_set():
                return
            if now - self.failed.get(key, -1e9) >= RETRY_S:
                summary = self.sync(ds)
                self.release(ds, summary)

    def run(self, interval: float) -> None:
        while not self.stop.is_set():
            try:
                self.look()
            except Exception:
                log.exception("distcache look failed; trying again")
            self.stop.wait(interval)

    def sync(self, ds: Dataset) -> Summary:
        """Bring one Dataset's cache up to its source, and say in its status how far it got."""
        path = dataset_path(ds)
        try:
            fs, root = open_source(self.client, ds)
            source = self._listing(fs, root, ds)
            self._mount(ds, path)
            summary = self._cache(ds, path, source)
            if stager.changed(source, self._listing(fs, root, ds)):
                summary.state, summary.reason = "caching", "the source changed while it was cached"
        except (stager.StageError, WeedError) as e:
            log.error("dataset %s: %s", ds.key, e)
            self.failed[ds.key] = time.monotonic()
            summary = _failed(str(e))
        else:
            if summary.state != "failed":  # else retried after RETRY_S, not at the next look
                self.failed.pop(ds.key, None)
        self._status(
            ds.namespace,
            ds.name,
            summary.status(path, ds.copies),
            top={"totalBytes": summary.total_bytes, "files": summary.files},
        )
        log.info(
            "dataset %s: %s, %d of %d bytes cached over %d servers",
            ds.key,
            summary.state,
            summary.cached_bytes,
            summary.total_bytes,
            len(summary.servers),
        )
        return summary

    def release(self, ds: Dataset, summary: Summary) -> None:
        """Pods held for this Dataset (the webhook's scheduling gate): let them go once every file
        is readable from the cache, else tell each once per state why it still waits."""
        try:
            pods = [p.to_dict() for p in self.client.list(Pod, namespace=ds.namespace)]
        except Exception as e:
            log.warning("dataset %s: pods not listed: %s", ds.key, e)
            return
        for p in pods:
            meta, spec = p.get("metadata") or {}, p.get("spec") or {}
            gates = [g for g in spec.get("schedulingGates") or [] if isinstance(g, dict)]
            named = (meta.get("annotations") or {}).get(DATASET)
            if not named or not any(g.get("name") == GATE for g in gates):
                continue
            if pod_dataset(str(named), ds.namespace) != ds.key:
                continue
            name, uid = str(meta.get("name")), str(meta.get("uid") or "")
            try:
                if summary.state in READABLE:
                    rest = [g for g in gates if g.get("name") != GATE]
                    patch = [{"op": "replace", "path": "/spec/schedulingGates", "value": rest}]
                    self.client.patch(Pod, name, patch, namespace=ds.namespace, patch_type=PatchType.JSON)
                    log.info("dataset %s: cached; pod %s/%s may start", ds.key, ds.namespace, name)
                    self._tell(
                        ds.namespace, name, uid, "Normal", "DatasetCached", f"Dataset {ds.key} is cached"
                    )
                elif (uid, summary.state) not in self.told:
                    self.told.add((uid, summary.state))
                    self._tell(ds.namespace, name, uid, *_waiting(ds, summary))
            except Exception as e:  # the pod may be gone; the next look tries again
                log.warning("dataset %s: pod %s/%s: %s", ds.key, ds.namespace, name, e)

    def _tell(self, ns: str, pod: str, uid: str, kind: str, reason: str, message: str) -> None:
        now = datetime.now(UTC)
        self.client.create(
            Event(
                metadata=ObjectMeta(generateName=f"{pod}.", namespace=ns),
                involvedObject=ObjectReference(kind="Pod", namespace=ns, name=pod, uid=uid, apiVersion="v1"),
                reason=reason,
                message=message,
                type=kind,
                source=EventSource(component="phalanx-distcache"),
                firstTimestamp=now,
                lastTimestamp=now,
                count=1,
            )
        )

    def _listing(self, fs: Any, root: str, ds: Dataset) -> list[stager.RemoteFile]:
        files = stager.list_source(fs, root, "", ds.spec.source)
        if ds.spec.include:
            files = [f for f in files if fnmatch.fnmatch(PurePosixPath(f.rel).name, ds.spec.include)]
            if not files:
                raise stager.StageError(f"no objects under {ds.spec.source} match {ds.spec.include!r}")
        return files

    def _mount(self, ds: Dataset, path: str) -> None:
        name = remote_name(ds)
        key = secret = ""
        if ds.spec.secret_ref is not None:
            data = read_secret(self.client, ds)
            key, secret = data.get("AWS_ACCESS_KEY_ID", ""), data.get("AWS_SECRET_ACCESS_KEY", "")
        region = ds.spec.options.get("region", self.region)
        conf = (ds.spec.endpoint, key, secret, region)
        if self.configured.get(name) != conf:
            self.weed.configure_remote(name, ds.spec.endpoint, key, secret, region)
            self.configured[name] = conf
        bucket_path = ds.spec.source.split("://", 1)[1].strip("/")
        if path not in self.weed.mounts():
            log.info("dataset %s: mounting %s at %s (%d copies)", ds.key, ds.spec.source, path, ds.copies)
            self.weed.mount(path, f"{name}/{bucket_path}", name, ds.copies)

    def _cache(self, ds: Dataset, path: str, source: list[stager.RemoteFile]) -> Summary:
        """Fetch what is not cached; the summary after.

        The first time (nothing of it cached) by `remote.cache`, writing progress to the status
        every `progress_s`. After that only by reading the missing files through the filer (it
        caches what it reads from a mounted remote): in 4.48 a second `remote.cache` drops the
        chunks of every file already cached (measured), so it is never run twice on a folder.
        Files whose every copy was lost are uncached first, so that the read fetches them again.
        """
        cached = self.weed.files(path)
        before = summarize(source, cached, self.weed.locations(), ds.copies)
        if not before.missing:
            return before
        self.release(ds, before)  # pods held for it are told it is caching, before the wait
        if any(f.chunks for f in cached):
            if before.lost:
                log.warning(
                    "dataset %s: %d files lost with their volume servers; fetching them again",
                    ds.key,
                    len(before.lost),
                )
                self.weed.uncache(path, before.lost)
            bad = self.weed.read_through(path, before.missing, self.concurrent)
            log.info("dataset %s: read %d missing files through the filer", ds.key, len(before.missing))
            summary = summarize(source, self.weed.files(path), self.weed.locations(), ds.copies)
            kept = len(before.missing) - len(summary.missing)
            if not bad and summary.missing and kept <= 0:  # read, but not kept: no room
                bad = [f"{len(summary.missing)} files read through but not kept (is the cache full?)"]
        else:
            bad = self._remote_cache(ds, path, source)
            summary = summarize(source, self.weed.files(path), self.weed.locations(), ds.copies)
        if bad and summary.state == "caching":
            summary.state, summary.reason = "failed", f"{len(bad)} fetches failed, e.g. {bad[0]}"
            self.failed[ds.key] = time.monotonic()
        return summary

    def _remote_cache(self, ds: Dataset, path: str, source: list[stager.RemoteFile]) -> list[str]:
        p = self.weed.cache(path, ds.spec.include, self.concurrent)
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(p.stdout or []), daemon=True)
        reader.start()
        while p.poll() is None:
            if self.stop.wait(self.progress_s):
                p.terminate()
                break
            if p.poll() is None:
                s = summarize(source, self.weed.files(path), self.weed.locations(), ds.copies)
                self._status(ds.namespace, ds.name, s.status(path, ds.copies))
                self.release(ds, s)  # pods created while it caches are told too
        p.wait()
        reader.join(10)
        log.debug("dataset %s: remote.cache said: %s", ds.key, "".join(out)[-2000:])
        return failures("".join(out))

    def _drop_gone(self, datasets: dict[str, Dataset]) -> None:
        """Unmount (and free) the cache of Datasets deleted or turned back to per-node copies."""
        for path in self.weed.mounts():
            if not path.startswith(ROOT + "/"):
                continue
            key = path[len(ROOT) + 1 :]
            if key not in datasets:
                log.info("dataset %s: no longer distributed or gone; unmounting %s", key, path)
                try:
                    self.weed.unmount(path)
                except WeedError as e:
                    log.warning("dataset %s: %s", key, e)

    def _status(self, ns: str, name: str, entry: dict[str, Any], top: dict[str, Any] | None = None) -> None:
        entry = {**entry, "lastUpdate": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        body = {"status": {"distributed": entry, **(top or {})}}
        try:
            self.client.patch(DatasetRes.Status, name, body, namespace=ns, patch_type=PatchType.MERGE)
        except Exception as e:  # the Dataset may be gone
            log.debug("dataset %s/%s: status not written: %s", ns, name, e)


def _waiting(ds: Dataset, s: Summary) -> tuple[str, str, str]:
    """(type, reason, message) of the Event on a pod held for `ds`."""
    if s.state == "failed":
        return "Warning", "DatasetNotCached", f"Dataset {ds.key} cannot be cached: {s.reason}"
    done = f"{s.cached_files} of {s.files} files cached" if s.files else "listing the source"
    return (
        "Normal",
        "WaitingForDataset",
        f"Dataset {ds.key} is {s.state} ({done}): the pod starts once every file is cached "
        "(spec.readiness: cached; readThrough would start it at once)",
    )


def _failed(reason: str) -> Summary:
    return Summary("failed", 0, 0, 0, 0, {}, [], reason)
