"""The repeat guard's memory across a restart or a new leader (issue 26).

Preempt and reclaim do not evict a workload again for a preemptor of the same shape within their
`repeat_window` (`Snapshot.evicted_for`: workload -> preemptor demand key -> when). That memory
lived in the scheduler only, so a new leader could repeat an eviction once. It is now saved with
the attained service (`phalanx.k8s.loop.service`): demand keys are Python values, so each is
written as a digest of a canonical form, and read back into a key when a workload of that shape is
in the snapshot again. Digests no workload has claimed are kept for `KEEP_S`, then dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from phalanx.core.snapshot import WINDOW_S, Snapshot
from phalanx.core.snapshot import Recent as _Recent

KEEP_S = 86400.0  # a saved eviction no preemptor shape has claimed by then is forgotten
Memory = dict[str, dict[tuple[object, ...], float]]
Saved = dict[str, dict[str, float]]
RecentRecord = _Recent  # an eviction the budgets count: when, workload, its queue, GPU-seconds lost
Recent = collections.deque[RecentRecord]


def digest(key: object) -> str:
    """A digest of `key` that is the same in every process (no hash seeds, no set order); demand keys
    are hashable and few, so each is digested once."""
    try:
        return _digest_cached(key)
    except TypeError:  # a part that does not hash (a plain dict)
        return _digest(key)


@functools.lru_cache(maxsize=4096)
def _digest_cached(key: object) -> str:
    return _digest(key)


def _digest(key: object) -> str:
    text = json.dumps(_canonical(key), separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _canonical(v: object) -> Any:
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, enum.Enum):
        return [type(v).__name__, v.name]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return [type(v).__name__, {f.name: _canonical(getattr(v, f.name)) for f in dataclasses.fields(v)}]
    if isinstance(v, frozenset | set):
        return ["set", sorted((_canonical(x) for x in v), key=lambda x: json.dumps(x, sort_keys=True))]
    if isinstance(v, Mapping):
        items = [[_canonical(k), _canonical(x)] for k, x in v.items()]
        return ["map", sorted(items, key=lambda x: json.dumps(x, sort_keys=True))]
    if isinstance(v, list | tuple):
        return [_canonical(x) for x in v]
    return repr(v)


def to_saved(memory: Memory, pending: Saved, now: float) -> Saved:
    """What to write: the memory as digests, and what was read back but not claimed yet (if recent)."""
    out: Saved = {w: {s: t for s, t in shapes.items() if now - t < KEEP_S} for w, shapes in pending.items()}
    for w, shapes in memory.items():
        mine = out.setdefault(w, {})
        for key, t in shapes.items():
            mine[digest(key)] = t
    return {w: shapes for w, shapes in out.items() if shapes}


def recent_from_saved(d: object) -> list[RecentRecord]:
    """A saved record of the hour's evictions as it reads; entries of the wrong shape are skipped. A
    record saved before costs were kept (three fields) reads with none: GPU-hour budgets count it 0."""
    if not isinstance(d, list):
        return []
    out = []
    for r in d:
        if (
            isinstance(r, list)
            and len(r) in (3, 4)
            and all(isinstance(x, int | float) and math.isfinite(x) for x in (r[0], *r[3:]))
            and isinstance(r[1], str)
            and isinstance(r[2], str)
        ):
            out.append((float(r[0]), r[1], r[2], max(0.0, float(r[3])) if len(r) == 4 else 0.0))
    return out


def from_saved(d: object) -> Saved:
    """A saved memory as it reads; entries of the wrong type are skipped."""
    if not isinstance(d, dict):
        return {}
    out: Saved = {}
    for w, shapes in d.items():
        if isinstance(shapes, dict):
            good = {
                str(s): float(t) for s, t in shapes.items() if isinstance(t, int | float) and math.isfinite(t)
            }
            if good:
                out[str(w)] = good
    return out


def restore(memory: Memory, pending: Saved, snap: Snapshot) -> None:
    """Turn saved digests back into demand keys for the shapes the snapshot has; the rest stay pending."""
    if not pending:
        return
    keys = {digest(k): k for k in {entry.demand_key for entry in snap.workloads.values()}}
    for w in list(pending):
        shapes = pending[w]
        for s in [s for s in shapes if s in keys]:
            t = shapes.pop(s)
            mine = memory.setdefault(w, {})
            mine[keys[s]] = max(t, mine.get(keys[s], t))
        if not shapes:
            del pending[w]


def forget_old(memory: Memory, now: float) -> None:
    """Drop evictions older than `KEEP_S` (no repeat window is that long); by age, not by absence: a
    gang just evicted may have no pods for a while as its controller remakes them."""
    for w in list(memory):
        shapes = memory[w]
        for key in [k for k, t in shapes.items() if now - t >= KEEP_S]:
            del shapes[key]
        if not shapes:
            del memory[w]


class RepeatMemory:
    """The repeat guard's memory as the loop keeps it across cycles: who was evicted for which
    preemptor shape, and when (`evicted_for`, lent to each cycle's snapshot), and the digests an
    earlier leader saved that no shape in the snapshot has claimed yet (`unclaimed`)."""

    def __init__(self) -> None:
        self.evicted_for: Memory = {}
        self.unclaimed: Saved = {}
        self.restore_due = False  # the saved memory was just read back
        self.restore_seen = -1  # the snapshot's types_version when saved shapes were last looked for
        # the eviction budgets' hour: (when, workload, queue, GPU-s lost) of each eviction, lent to
        # every cycle's snapshot (`Snapshot.lend_recent`) and saved with the rest, so neither a
        # snapshot built anew nor a new leader starts the hour empty
        self.recent: Recent = collections.deque()

    def read_back(self, saved: Saved, recent: list[RecentRecord] | None = None) -> None:
        """What an earlier leader saved: claimed by the shapes of the next snapshots; its record of
        the hour's evictions joined to ours."""
        self.restore_due = True
        self.unclaimed = {w: dict(shapes) for w, shapes in saved.items()}
        merged = sorted({*self.recent, *(recent or [])})
        self.recent.clear()
        self.recent.extend(merged)

    def recent_saved(self, now: float) -> list[RecentRecord]:
        """The record of the last `WINDOW_S`, as saved."""
        return [r for r in self.recent if now - r[0] < WINDOW_S]

    def claim(self, snap: Snapshot) -> None:
        """Saved digests back into demand keys, when the memory was just read back or the snapshot's
        workloads changed (its `types_version` moves whenever a workload comes or goes)."""
        shapes = snap.types_version
        if self.unclaimed and (self.restore_due or shapes != self.restore_seen):
            self.restore_due, self.restore_seen = False, shapes
            restore(self.evicted_for, self.unclaimed, snap)

    def forget_old(self, now: float) -> None:
        forget_old(self.evicted_for, now)

    def to_saved(self, now: float) -> Saved:
        return to_saved(self.evicted_for, self.unclaimed, now)
