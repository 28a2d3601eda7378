"""Copy a dataset from its source into a staging folder: listed, parallel, ranged, resumable, verified.

Any source fsspec reads works (s3fs for S3). Each file is fetched in ranged reads into
`<path>.part`, appended from where a crash left it, checked by size, then renamed to its final
name. The listing is kept in the staging folder, so a restart stages exactly what the first run
listed; once every file is there the source is listed again and each file's size and ETag must
still be the listed ones (`changed`), so a copy never mixes two versions of an object. With
`checksum`, a file whose ETag is an MD5 (a single-part S3 upload) is also hashed as it is written:
that catches corruption on the wire, at a CPU cost (`docs/benchmarks.md`).
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from phalanx.node.cachestore import MANIFEST, PART

_MD5 = re.compile(r"^[0-9a-f]{32}$")
CHUNK = 8 << 20


class StageError(Exception):
    """Staging stopped for a reason the Dataset's status says as is."""


@dataclass(frozen=True)
class RemoteFile:
    path: str  # as the filesystem names it
    rel: str  # below the source
    size: int
    etag: str = ""


def _etag(info: dict[str, Any]) -> str:
    raw = info.get("ETag") or info.get("etag") or info.get("md5") or ""
    return str(raw).strip('"').lower()


def _safe_rel(rel: str, source: str) -> str:
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or ".." in p.parts or p.name.endswith(PART) or p.name == MANIFEST:
        raise StageError(f"{source}: object name {rel!r} cannot be cached safely")
    return str(p)


def list_source(fs: Any, root: str, include: str, source: str) -> list[RemoteFile]:
    """Every file below `root` (matching `include`), or StageError with what is wrong."""
    try:
        found = fs.find(root, detail=True)
    except FileNotFoundError:
        raise StageError(f"source {source} not found") from None
    except PermissionError as e:
        raise StageError(f"access to {source} denied ({_short(e)}): check the credentials") from None
    except OSError as e:
        raise StageError(f"cannot list {source}: {_short(e)}") from None
    except Exception as e:  # botocore's EndpointConnectionError and kin are no OSError
        raise StageError(f"cannot list {source}: {type(e).__name__}: {_short(e)}") from None
    base = root.rstrip("/") + "/"
    out = []
    for path, info in sorted(found.items()):
        if info.get("type") != "file":
            continue
        rel = path[len(base) :] if path.startswith(base) else PurePosixPath(path).name
        if include and not fnmatch.fnmatch(rel, include):
            continue
        if info.get("size") is None:  # an HTTP listing gives names only: ask each file
            try:
                info = {**info, **fs.info(path)}
            except OSError as e:
                raise StageError(f"cannot read the size of {path}: {_short(e)}") from None
        out.append(RemoteFile(path, _safe_rel(rel, source), int(info.get("size") or 0), _etag(info)))
    if not out:
        raise StageError(f"no objects under {source}" + (f" match {include!r}" if include else ""))
    return out


def write_manifest(folder: Path, source: str, files: list[RemoteFile]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"source": source, "files": [asdict(f) for f in files]}))
    os.replace(tmp, folder / MANIFEST)


def read_manifest(folder: Path, source: str) -> list[RemoteFile] | None:
    """The listing a previous run staged from, if it staged from this source."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
        if data.get("source") != source:
            return None
        return [RemoteFile(**f) for f in data["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class Progress:
    total_bytes: int
    total_files: int
    done_bytes: int = 0
    done_files: int = 0
    fetched: int = 0  # bytes downloaded by this run (not those found verified on disk)
    started: float = 0.0
    max_rate: float = 0.0  # bytes/s this staging may take (0: no cap), so training keeps its network
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, n: int, fetched: bool = True) -> None:
        with self.lock:
            self.done_bytes += n
            self.fetched += n if fetched else 0
            ahead = self.fetched / self.max_rate - (time.monotonic() - self.started) if self.max_rate else 0.0
        if fetched and ahead > 0:
            time.sleep(ahead)

    def rate(self) -> float:
        dt = time.monotonic() - self.started
        return self.fetched / dt if dt > 0 else 0.0


def fetch_file(
    fs: Any, f: RemoteFile, folder: Path, progress: Progress, checksum: bool = False, chunk: int = CHUNK
) -> None:
    """One file into `folder`, resumed from its `.part`, verified, then renamed to its name."""
    final = folder / f.rel
    if final.exists() and final.stat().st_size == f.size:
        progress.add(f.size, fetched=False)
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    part = final.with_name(final.name + PART)
    offset = part.stat().st_size if part.exists() else 0
    if offset > f.size:
        part.unlink()
        offset = 0
    check = checksum and bool(_MD5.match(f.etag))
    md5 = hashlib.md5(usedforsecurity=False) if check else None
    if md5 is not None and offset:
        with open(part, "rb") as old:
            while buf := old.read(chunk):
                md5.update(buf)
    progress.add(offset, fetched=False)
    try:
        with open(part, "ab") as out:
            pos = offset
            while pos < f.size:
                end = min(f.size, pos + chunk)
                buf = fs.cat_file(f.path, start=pos, end=end)
                if not buf:
                    break
                if len(buf) > end - pos:  # the server ignored the range and sent the whole file
                    if len(buf) != f.size:
                        raise StageError(f"file {f.rel}: got {len(buf)} bytes, the source lists {f.size}")
                    out.truncate(0)
                    out.seek(0)
                    md5 = hashlib.md5(usedforsecurity=False) if check else None
                    pos = 0
                out.write(buf)
                if md5 is not None:
                    md5.update(buf)
                pos += len(buf)
                progress.add(len(buf))
            if f.size == 0:
                fs.info(f.path)  # the object must still be there
            out.flush()
            os.fsync(out.fileno())
    except FileNotFoundError:
        raise StageError(f"object {f.path} is gone from the source (it was listed)") from None
    except PermissionError as e:
        raise StageError(f"access to {f.path} denied ({_short(e)}): check the credentials") from None
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise StageError(f"the cache disk is full while writing {f.rel}") from None
        raise
    got = part.stat().st_size
    if got != f.size:
        part.unlink()
        raise StageError(f"file {f.rel}: got {got} bytes, the source lists {f.size}")
    if md5 is not None and md5.hexdigest() != f.etag:
        part.unlink()
        raise StageError(f"file {f.rel}: checksum mismatch (MD5 {md5.hexdigest()}, source ETag {f.etag})")
    os.replace(part, final)


def stage(
    fs: Any,
    files: list[RemoteFile],
    folder: Path,
    workers: int = 16,
    report: Callable[[Progress], None] | None = None,
    every: float = 2.0,
    stop: threading.Event | None = None,
    checksum: bool = False,
    max_rate: float = 0.0,
) -> Progress:
    """Fetch `files` into `folder` with `workers` in parallel; StageError on the first failure.

    Returns early, with fewer files done, when `stop` is set."""
    progress = Progress(sum(f.size for f in files), len(files), started=time.monotonic(), max_rate=max_rate)
    # big files first: the tail of a staging is then many small files in parallel, not one big one
    todo = sorted(files, key=lambda f: -f.size)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="stage") as pool:
        halt = threading.Event()  # set on the first failure: the other workers take no new file
        stops = (halt, stop) if stop is not None else (halt,)
        pending = {pool.submit(_one, fs, f, folder, progress, stops, checksum) for f in todo}
        while pending:
            done, pending = wait(pending, timeout=every, return_when=FIRST_EXCEPTION)
            for fut in done:
                if fut.exception() is not None:
                    halt.set()
                    for p in pending:
                        p.cancel()
                    raise fut.exception()  # type: ignore[misc]
            if report is not None:
                report(progress)
    if report is not None:
        report(progress)
    return progress


def _one(
    fs: Any,
    f: RemoteFile,
    folder: Path,
    progress: Progress,
    stops: tuple[threading.Event, ...],
    checksum: bool,
) -> None:
    if any(s.is_set() for s in stops):
        return
    fetch_file(fs, f, folder, progress, checksum)
    with progress.lock:
        progress.done_files += 1


def changed(listed: list[RemoteFile], now: list[RemoteFile]) -> list[str]:
    """Files whose size or ETag differs between two listings (or that one of them lacks)."""
    a = {f.rel: (f.size, f.etag) for f in listed}
    b = {f.rel: (f.size, f.etag) for f in now}
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:200]
