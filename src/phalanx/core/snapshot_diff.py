"""Where two snapshots of the same cluster disagree: a driver that keeps its snapshot between cycles
(`phalanx.k8s.read.carry`) is checked against one built from scratch, in tests and now and then in service.

Only state counts (free capacity, who is bound where with which devices, workloads' standing, queue
usage, foreign usage), not caches or version counters; sums of floats are compared with a tolerance.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from phalanx.core.snapshot import Snapshot

_COUNTERS = {"node_version"}  # bumped on every change: differ between any two histories


def differences(a: Snapshot, b: Snapshot, limit: int = 20) -> list[str]:
    """What differs between `a` and `b` (empty: the same state), at most `limit` lines."""
    out: list[str] = []
    sa, sb = state_of(a), state_of(b)
    for key in sorted(set(sa) | set(sb)):
        _walk(key, sa.get(key), sb.get(key), out)
    return out[:limit]


def _walk(where: str, a: object, b: object, out: list[str]) -> None:
    """Name the innermost entries that differ (`allocations['ns/pod']`), not a whole table."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() != b.keys():
        for k in sorted(a.keys() ^ b.keys(), key=repr):
            out.append(f"{where}[{k!r}]: {'only in the first' if k in a else 'only in the second'}")
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(a.keys() & b.keys(), key=repr):
            _walk(f"{where}[{k!r}]", a[k], b[k], out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            _walk(f"{where}[{k}]", x, y, out)
    elif not _equal(a, b):
        out.append(f"{where}: {_brief(a)} != {_brief(b)}")


def state_of(s: Snapshot) -> dict[str, Any]:
    """The snapshot's state as plain, comparable values, by name."""
    c = s.cluster
    st: dict[str, Any] = {"nodes": tuple(n.name for n in c.nodes)}
    for name, value in vars(c).items():
        if isinstance(value, np.ndarray) and name not in _COUNTERS:
            st[f"cluster.{name}"] = value
    st["allocations"] = {
        t: (a.task.workload, a.node, a.devices, a.cpu_milli, a.memory_mib, a.since, a.claims)
        for t, a in s.allocations.items()
    }
    st["on_node"] = [sorted(d) for d in s.on_node]
    st["workloads"] = {
        n: (e.workload, sorted(e.bound), e.gpu_milli, e.attained, e.executed, e.parked_epoch >= 0)
        for n, e in s.workloads.items()
    }
    st["pending"] = set(s._pending)
    st["ready"] = set(s.running)
    st["partial"] = set(s.partial)
    st["fresh"] = set(s.fresh)
    st["pending_groups"] = {k: set(v) for k, v in s.pending_groups.items()}
    st["group_order"] = dict(s.group_order)
    st["pending_per_queue"] = dict(s.pending_per_queue)
    st["queue_gpu_milli"] = {q: v for q, v in s.queue_gpu_milli.items() if v}
    for table in ("queue_usage", "subtree_usage", "queue_pending"):
        st[table] = {q: v for q, v in getattr(s, table).items() if np.any(np.abs(v) > 1e-6)}
    st["usage_total"] = s.usage_total
    st["foreign_gpu_milli"] = s.foreign_gpu_milli
    st["leaving"] = sorted((lv.owner, lv.node, lv.cpu_milli, lv.memory_mib, lv.ends) for lv in s.leaving)
    st["foreign_on"] = [
        sorted((u.owner, d.gpus, d.milli, u.cpu_milli, u.memory_mib) for d, _, u in f) for f in s.foreign_on
    ]
    st["task_types"] = {k: n for k, (_, n) in s._type_counts.items() if n}
    st["tasks"] = set(s._tasks)
    return st


def _equal(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.shape == b.shape
            and np.allclose(a, b, rtol=1e-9, atol=1e-6)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))
    return bool(a == b)


def _brief(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 160 else text[:157] + "..."
