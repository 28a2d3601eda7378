"""Pollux (OSDI'21) workloads: `name,time,application,num_replicas,batch_size`.

Pollux jobs run until their model converges, so the trace has no durations. We estimate a
job's run time at its user-configured size from the Pollux model profiles: iterations to
finish at the nearest profiled batch size (last row of `validation-<bsz>.csv`) times the
per-iteration time (step + sync) at the nearest profiled replica count and local batch size
(`placements.csv` for one replica, `scalability.csv` otherwise). An approximation: Pollux
itself adapts batch sizes and allocations while a job runs.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

from phalanx.core.errors import SpecError
from phalanx.core.model import Gpu, Node
from phalanx.sim.jobs import JobSpec
from phalanx.sim.traces.rows import read_rows


@lru_cache(maxsize=32)
def _iterations(profiles: str, app: str, bsz: int) -> int:
    d = Path(profiles) / app
    files = sorted(d.glob("validation-*.csv"))
    if not files:
        raise SpecError(str(d), f"no validation profiles for application {app!r}")
    best = min(files, key=lambda f: abs(math.log(int(f.stem.split("-")[1]) / bsz)))
    rows = list(read_rows(best, ("iteration",)))
    return max(r.int("iteration") for r in rows)


@lru_cache(maxsize=64)
def _step_seconds(profiles: str, app: str, replicas: int, bsz: int) -> float:
    d = Path(profiles) / app
    if replicas <= 1:
        rows = [
            r
            for r in read_rows(d / "placements.csv", ("placement", "local_bsz", "step_time", "sync_time"))
            if r.text("placement") == "1"
        ]
        local = bsz
    else:
        rows = list(read_rows(d / "scalability.csv", ("num_replicas", "local_bsz", "step_time", "sync_time")))
        near = min({r.int("num_replicas") for r in rows}, key=lambda n: abs(n - replicas))
        rows = [r for r in rows if r.int("num_replicas") == near]
        local = max(1, bsz // replicas)
    if not rows:
        raise SpecError(str(d), f"no step-time profile for {app!r} at {replicas} replicas")
    r = min(rows, key=lambda r: abs(math.log(r.float("local_bsz") / local)))
    return r.float("step_time") + r.float("sync_time")


def load_jobs(path: str | Path, profiles: str | Path | None = None) -> list[JobSpec]:
    p = Path(path)
    prof = Path(profiles) if profiles is not None else p.parent.parent / "model-profiles"
    if not prof.is_dir():
        raise SpecError(str(prof), "Pollux model profiles not found (give the model-profiles folder)")
    jobs = []
    for row in read_rows(p, ("name", "time", "application", "num_replicas", "batch_size")):
        app = row.text("application")
        replicas = row.int("num_replicas", minimum=1)
        bsz = row.int("batch_size", minimum=1)
        try:
            duration = _iterations(str(prof), app, bsz) * _step_seconds(str(prof), app, replicas, bsz)
            jobs.append(
                JobSpec(
                    row.text("name"),
                    row.float("time"),
                    duration,
                    replicas,
                    model=app,
                    iterations=_iterations(str(prof), app, bsz),
                    where=row.where,
                )
            )
        except SpecError as e:
            raise SpecError(row.where, e.message) from None
    if not jobs:
        raise SpecError(str(p), "no jobs in file")
    return jobs


def testbed_cluster(nodes: int = 16, gpus: int = 4) -> tuple[list[Node], list[str]]:
    """The Pollux testbed: 16 nodes x 4 T4 GPUs, one rack."""
    return [
        Node(
            f"t4-{i:02d}",
            32_000,
            192 * 1024,
            tuple(Gpu(j, "T4", 15360) for j in range(gpus)),
            topology={"rack": "rack0"},
        )
        for i in range(nodes)
    ], ["rack"]
