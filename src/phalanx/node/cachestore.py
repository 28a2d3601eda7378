"""The dataset cache on a node's NVMe: what is ready, what is being staged, what may go.

Layout under the cache root (one filesystem, so every rename is atomic):

- `ready/<namespace>/<name>/`: complete, verified copies. Pods mount these read-only; a folder
  appears here only by one rename of a finished staging folder, so nobody sees a half copy.
- `staging/<namespace>/<name>/`: a copy in progress. `.phalanx-manifest.json` is the listing
  it stages; a file is written as `<path>.part` and renamed to `<path>` once verified, so a crash
  keeps every verified file and the tail of the one it was writing.
- `trash/`: evicted copies, renamed out of `ready/` first (a pod never sees a half-deleted one).
- `index.json`: size and last use of every ready copy, for least-recently-used eviction.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MANIFEST = ".phalanx-manifest.json"
PART = ".part"


@dataclass
class Entry:
    bytes: int
    files: int
    last_used: float
    source: str = ""


class CacheStore:
    def __init__(self, root: Path, capacity: int) -> None:
        self.root = root
        self.capacity = capacity
        for sub in ("ready", "staging", "trash"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self._empty_trash()
        self.index = self._load_index()

    # ------------------------------------------------------------------ paths
    def ready_dir(self, key: str) -> Path:
        return self.root / "ready" / key

    def staging_dir(self, key: str) -> Path:
        return self.root / "staging" / key

    # ------------------------------------------------------------------ state
    def _load_index(self) -> dict[str, Entry]:
        """The index, reconciled with the disk: a ready folder the index lacks is measured again."""
        raw: dict[str, Any] = {}
        try:
            raw = json.loads((self.root / "index.json").read_text())
        except (OSError, ValueError):
            raw = {}
        out: dict[str, Entry] = {}
        for ns in sorted((self.root / "ready").iterdir()):
            for d in sorted(ns.iterdir()) if ns.is_dir() else []:
                key = f"{ns.name}/{d.name}"
                e = raw.get(key)
                if isinstance(e, dict) and {"bytes", "files", "last_used"} <= e.keys():
                    out[key] = Entry(
                        int(e["bytes"]), int(e["files"]), float(e["last_used"]), str(e.get("source", ""))
                    )
                else:
                    size, files = _measure(d)
                    out[key] = Entry(size, files, time.time())
        return out

    def save(self) -> None:
        tmp = self.root / "index.json.tmp"
        tmp.write_text(json.dumps({k: asdict(v) for k, v in self.index.items()}, sort_keys=True))
        os.replace(tmp, self.root / "index.json")

    def ready(self) -> dict[str, int]:
        return {k: e.bytes for k, e in self.index.items()}

    def staging(self) -> list[str]:
        base = self.root / "staging"
        return sorted(f"{ns.name}/{d.name}" for ns in base.iterdir() if ns.is_dir() for d in ns.iterdir())

    def staged_bytes(self, key: str) -> int:
        d = self.staging_dir(key)
        return _measure(d)[0] if d.exists() else 0

    def used(self) -> int:
        """Bytes held: ready copies, and what staging folders hold so far."""
        return sum(e.bytes for e in self.index.values()) + sum(self.staged_bytes(k) for k in self.staging())

    def touch(self, keys: list[str], now: float | None = None) -> None:
        """These copies were used now: one index write for all of them."""
        keys = [k for k in keys if k in self.index]
        for k in keys:
            self.index[k].last_used = time.time() if now is None else now
        if keys:
            self.save()

    # ------------------------------------------------------------------ changes
    def promote(self, key: str, source: str) -> None:
        """The staged copy is complete and verified: make it visible in one rename."""
        src, dst = self.staging_dir(key), self.ready_dir(key)
        (src / MANIFEST).unlink(missing_ok=True)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists():  # an older copy (the source changed): retire it first
            self._to_trash(dst)
        os.rename(src, dst)
        size, files = _measure(dst)
        self.index[key] = Entry(size, files, time.time(), source)
        self.save()
        _rmdir_empty(src.parent)

    def evict(self, key: str) -> int:
        """Drop a ready copy (or a staging one); the bytes freed."""
        freed = 0
        if key in self.index:
            freed += self.index.pop(key).bytes
            self.save()
        for d in (self.ready_dir(key), self.staging_dir(key)):
            if d.exists():
                if d == self.staging_dir(key):
                    freed += self.staged_bytes(key)
                self._to_trash(d)
                _rmdir_empty(d.parent)
        self._empty_trash()
        return freed

    def victims(self, need: int, keep: set[str]) -> list[str] | None:
        """Least recently used ready copies, outside `keep`, to free `need` bytes; None if they cannot."""
        free = self.capacity - self.used()
        out: list[str] = []
        for key, e in sorted(self.index.items(), key=lambda kv: (kv[1].last_used, kv[0])):
            if free >= need:
                break
            if key in keep:
                continue
            out.append(key)
            free += e.bytes
        return out if free >= need else None

    def _to_trash(self, d: Path) -> None:
        target = self.root / "trash" / f"{d.parent.name}__{d.name}__{time.time_ns()}"
        os.rename(d, target)

    def _empty_trash(self) -> None:
        for d in (self.root / "trash").iterdir():
            shutil.rmtree(d, ignore_errors=True)


def _measure(d: Path) -> tuple[int, int]:
    """Bytes and files below `d` (the manifest not counted; partial files counted as bytes only)."""
    size = files = 0
    for dirpath, _, names in os.walk(d):
        for n in names:
            if n == MANIFEST:
                continue
            try:
                size += os.path.getsize(os.path.join(dirpath, n))
            except OSError:
                continue
            files += 0 if n.endswith(PART) else 1
    return size, files


def _rmdir_empty(d: Path) -> None:
    with contextlib.suppress(OSError):  # not empty: another dataset of the namespace is there
        d.rmdir()
