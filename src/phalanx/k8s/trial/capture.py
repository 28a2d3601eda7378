"""`phalanx capture`: one file with every object a cycle reads, to replay offline or share.

The capture is the watch cache as the scheduler would hold it: every kind of `kinds.WATCHED`
the server serves, listed once, stored by the same kind keys (`pods`, `nodes`,
`group/version/plural`). A replay (`phalanx.k8s.trial.replay`) gathers from it exactly as the
scheduler gathers from its store, so both build the same snapshot.

Only reads: list and discovery. A kind that cannot be listed (RBAC, a server error) is named
in `unreadable` with why, and the capture goes on; objects that are listed but that Phalanx
cannot take in are named in `problems` with why, as the scheduler would say it. What no
cycle reads is left out: managedFields, last-applied-configuration, and containers'
command, args and environment (which may hold secrets).
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.core.errors import SpecError
from phalanx.k8s.client.api import Api, ApiError
from phalanx.k8s.client.cache import Store
from phalanx.k8s.client.kinds import JOBS, WATCHED, Kind
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.gather import Gathered, gather
from phalanx.k8s.read.shard import ShardFilter
from phalanx.k8s.read.unread import unread_left_out
from phalanx.k8s.trial.collector import collector_paused

API_VERSION = "phalanx.io/v1alpha1"
KIND = "Capture"


@dataclass
class Capture:
    """A captured cluster: objects by kind key, what could not be read, and when it was taken."""

    objects: dict[str, list[dict[str, Any]]]
    time: float
    served: list[str] = field(default_factory=list)  # kind keys the server served
    unreadable: dict[str, str] = field(default_factory=dict)  # kind key -> why it could not be listed
    problems: dict[str, str] = field(default_factory=dict)  # object label -> why a cycle leaves it out
    server: str = ""  # the API server's version
    redacted: bool = False
    source: str = ""  # where it was read from (a file path), for messages

    def items(self, key: str) -> list[dict[str, Any]]:
        return self.objects.get(key, [])

    def gathered(self, cfg: AdapterConfig) -> Gathered:
        """What the scheduler's store would hold: Jobs count as listed when the server serves them
        (an informer that is refused them lists them as empty, as here). A scheduling shard's
        (`cfg.shard`): what its gate keeps of the same objects, listed in the order its informers list."""
        if cfg.shard is None:
            return gather(self.items, JOBS.key in self.served, cfg)
        gate = ShardFilter(cfg.shard, cfg.scheduler_name)
        store = Store(gate=gate)
        for kind, objs in sorted(self.objects.items(), key=lambda ko: gate.lists_after(ko[0]) is not None):
            store.replace(kind, objs)
        return gather(store.items, JOBS.key in self.served, cfg, split=gate.split())

    def to_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "capturedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time)),
            "time": self.time,
            "server": self.server,
            "redacted": self.redacted,
            "served": sorted(self.served),
            "unreadable": [{"kind": k, "why": w} for k, w in sorted(self.unreadable.items())],
            "problems": [{"object": k, "why": w} for k, w in sorted(self.problems.items())],
            "objects": {k: self.objects[k] for k in sorted(self.objects)},
        }


def _why(e: Exception) -> str:
    if isinstance(e, ApiError):
        return f"{e.code} {e.reason or ''}: {e.message}".replace("  ", " ")
    return f"{type(e).__name__}: {e}"


def take(
    api: Api, cfg: AdapterConfig, kinds: tuple[Kind, ...] = WATCHED, now: float | None = None
) -> Capture:
    """List every kind a cycle reads; a kind that cannot be listed is named and skipped; the objects
    a cycle would leave out are named with why."""
    cap = read(api, kinds, now)
    try:
        cap.problems = dict(cap.gathered(cfg).world(cfg, cap.time).problems)
    except Exception as e:  # never lose the capture to a translation bug: say so in it
        cap.problems = {"(world)": f"the snapshot could not be built: {_why(e)}"}
    return cap


def read(api: Api, kinds: tuple[Kind, ...] = WATCHED, now: float | None = None) -> Capture:
    """The objects of every kind the server serves, listed once (`phalanx status` reads them so too)."""
    now = time.time() if now is None else now
    unreadable: dict[str, str] = {}
    try:
        served = api.served(kinds)
    except Exception as e:  # discovery refused: the core kinds are still worth trying
        unreadable["discovery"] = _why(e)
        served = {k.key for k in kinds if not k.group}
    objects: dict[str, list[dict[str, Any]]] = {}
    for k in kinds:
        if k.key not in served or (k.superseded_by and k.superseded_by in served):
            continue  # not served, or the newer version is read instead (as the informers do)
        try:
            items, _ = api.list(k)
        except Exception as e:
            unreadable[k.key] = _why(e)
            continue
        objects[k.key] = [unread_left_out(k.key, o) for o in items]
    version = ""
    try:
        v = api.request("GET", "/version") or {}
        version = str(v.get("gitVersion") or "")
    except Exception as e:
        unreadable["version"] = _why(e)
    return Capture(objects, now, sorted(served), unreadable, server=version)


def write(cap: Capture, path: Path) -> None:
    data = json.dumps(cap.to_dict(), separators=(",", ":"), sort_keys=False).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)


def load(path: Path) -> Capture:
    """A capture file (JSON, gzipped when it ends in .gz); a bad one is one clear error."""
    where = f"--capture {path}"
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SpecError(where, f"cannot read the file: {e.strerror or e}") from None
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        with collector_paused():  # every object it makes is kept: see k8s.trial.collector
            d = json.loads(raw)
    except UnicodeDecodeError:  # a binary file that is not gzip: the codec's detail helps nobody
        raise SpecError(where, "not a text file; expected a capture file (JSON, or gzipped JSON)") from None
    except (OSError, ValueError, EOFError) as e:
        raise SpecError(where, f"not a capture file (JSON, or gzipped JSON): {e}") from None
    if not isinstance(d, dict) or d.get("kind") != KIND:
        raise SpecError(where, f"not a capture file: kind must be {KIND!r} (made by `phalanx capture`)")
    if d.get("apiVersion") != API_VERSION:
        raise SpecError(where, f"apiVersion {d.get('apiVersion')!r} is not {API_VERSION!r}")
    objs = d.get("objects")
    if not isinstance(objs, dict) or not all(
        isinstance(v, list) and all(isinstance(o, dict) for o in v) for v in objs.values()
    ):
        raise SpecError(where, "objects: must map each kind to a list of objects")
    t = d.get("time")
    if not isinstance(t, int | float):
        raise SpecError(where, "time: must be the capture's time in seconds since the epoch")

    def pairs(key: str, a: str, b: str) -> dict[str, str]:
        rows = d.get(key) or []
        if not isinstance(rows, list):
            raise SpecError(where, f"{key}: must be a list")
        return {str(r.get(a, "")): str(r.get(b, "")) for r in rows if isinstance(r, dict)}

    served = d.get("served") or list(objs)
    return Capture(
        {str(k): v for k, v in objs.items()},
        float(t),
        [str(s) for s in served] if isinstance(served, list) else list(objs),
        pairs("unreadable", "kind", "why"),
        pairs("problems", "object", "why"),
        str(d.get("server") or ""),
        bool(d.get("redacted")),
        str(path),
    )
