"""Any public job log as a CSV with a column mapping, e.g. `submit=timestamp,duration=duration,gpus=num_gpus`.

Fields: `submit` (required; seconds or ISO 8601 dates, made relative to the first job), one of
`duration`, `end` (same units as submit) or `iterations` + `time_per_iteration`; optional `gpus`
(default 1), `tasks`, `queue`, `user`, `name`, `model`, `dataset`, `cpu` (cores), `memory` (MiB),
`gpu_milli` (a share of one GPU per task), `dataset_size` (bytes, or a quantity such as 150Gi).
"""

from __future__ import annotations

import math
from pathlib import Path

from phalanx.core.errors import SpecError
from phalanx.sim.jobs import JobSpec
from phalanx.sim.traces.rows import Row, read_rows
from phalanx.spec.common import pairs
from phalanx.spec.quantity import size_bytes
from phalanx.spec.times import rfc3339

FIELDS = (
    "submit",
    "duration",
    "end",
    "iterations",
    "time_per_iteration",
    "gpus",
    "tasks",
    "min_tasks",
    "queue",
    "user",
    "name",
    "model",
    "dataset",
    "dataset_size",
    "cpu",
    "memory",
    "gpu_milli",
    "restart",
)


def parse_mapping(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in pairs(text, "--map", "field=column"):
        if k not in FIELDS:
            raise SpecError("--map", f"unknown field {k!r} (fields: {', '.join(FIELDS)})")
        out[k] = v
    if "submit" not in out:
        raise SpecError("--map", "the mapping needs submit=<column>")
    if not ({"duration", "end"} & out.keys() or {"iterations", "time_per_iteration"} <= out.keys()):
        raise SpecError("--map", "the mapping needs duration=, end= or iterations= with time_per_iteration=")
    return out


def _time(row: Row, col: str) -> float:
    raw = row.text(col)
    try:
        v = float(raw)
    except ValueError:
        t = rfc3339(raw)
        if t is None:
            raise SpecError(
                row.where, f"column {col!r} is neither seconds nor an ISO date: {raw!r}"
            ) from None
        return t
    if not math.isfinite(v):
        raise SpecError(row.where, f"column {col!r} must be finite, got {raw!r}")
    return v


def load_jobs(path: str | Path, mapping: dict[str, str], delimiter: str = ",") -> list[JobSpec]:
    m = mapping
    rows = list(read_rows(path, tuple(m.values()), delimiter))
    if not rows:
        raise SpecError(str(path), "no jobs in file")
    submits = [_time(r, m["submit"]) for r in rows]
    t0 = min(submits)
    jobs = []
    for k, (row, sub) in enumerate(zip(rows, submits, strict=True)):
        if "duration" in m:
            dur = row.float(m["duration"])
        elif "end" in m:
            dur = _time(row, m["end"]) - sub
        else:
            dur = row.float(m["iterations"]) * row.float(m["time_per_iteration"])
        try:
            jobs.append(
                JobSpec(
                    name=row.text(m["name"]) if "name" in m else f"job-{k:06d}",
                    submit=sub - t0,
                    duration=dur,
                    gpus=row.int(m["gpus"]) if "gpus" in m else 1,
                    tasks=row.int(m["tasks"]) if "tasks" in m else 0,
                    min_tasks=row.int(m["min_tasks"]) if "min_tasks" in m else 0,
                    restart_s=row.float(m["restart"]) if "restart" in m else None,
                    queue=row.text(m["queue"], "default") if "queue" in m else "default",
                    user=row.text(m["user"], "") if "user" in m else "",
                    model=row.text(m["model"], "") if "model" in m else "",
                    iterations=row.int(m["iterations"]) if "iterations" in m else None,
                    dataset=row.text(m["dataset"], "") if "dataset" in m else "",
                    dataset_bytes=(
                        size_bytes(
                            row.text(m["dataset_size"], "0") or "0", f"{row.where}: {m['dataset_size']}"
                        )
                        if "dataset_size" in m
                        else 0
                    ),
                    cpu_milli=round(row.float(m["cpu"]) * 1000) if "cpu" in m else 0,
                    memory_mib=row.int(m["memory"]) if "memory" in m else 0,
                    gpu_milli=row.int(m["gpu_milli"]) if "gpu_milli" in m else 1000,
                    where=row.where,
                )
            )
        except SpecError as e:
            raise SpecError(row.where, e.message) from None
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise SpecError(str(path), f"duplicate job name {dup!r}")
    return jobs
