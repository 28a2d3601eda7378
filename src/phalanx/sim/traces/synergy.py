"""Synergy (OSDI'22) replay traces: `job_id, model, arrival_time, num_iterations, gpu_demand` (no header).

A job's length in Synergy is iterations x the model's iteration time, which lives in Synergy's
model zoo (code, not copied). We take each job's run time from the companion per-job results of
the FIFO + fair-share replay (`derived/*_fifo_fair_jobs.csv`, column `fair_share_duration_s`).
Cluster configs are Synergy's `.ini` files.
"""

from __future__ import annotations

import configparser
from pathlib import Path

from phalanx.core.errors import SpecError
from phalanx.core.model import Gpu, Node
from phalanx.sim.jobs import JobSpec
from phalanx.sim.traces.rows import read_rows, read_text


def load_jobs(trace: str | Path, durations: str | Path) -> list[JobSpec]:
    runs = {
        r.text("job_id"): r.float("fair_share_duration_s")
        for r in read_rows(durations, ("job_id", "fair_share_duration_s"))
    }
    p = Path(trace)
    lines = read_text(p, "Synergy trace").splitlines()
    jobs = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        f = [x.strip() for x in line.split(",")]
        where = f"{p}:{n}"
        if len(f) != 5:
            raise SpecError(
                where, f"expected 5 fields (job_id, model, arrival, iterations, gpus), got {len(f)}"
            )
        if f[0] not in runs:
            raise SpecError(where, f"job {f[0]} has no run time in {durations}")
        try:
            arrival, iters, gpus = float(f[2]), int(float(f[3])), int(f[4])
        except ValueError:
            raise SpecError(where, "arrival, iterations and GPU demand must be numbers") from None
        try:
            jobs.append(
                JobSpec(f"job-{f[0]}", arrival, runs[f[0]], gpus, model=f[1], iterations=iters, where=where)
            )
        except SpecError as e:
            raise SpecError(where, e.message) from None
    if not jobs:
        raise SpecError(str(p), "no jobs in file")
    return jobs


def load_cluster(path: str | Path) -> tuple[list[Node], list[str]]:
    cp = configparser.ConfigParser(inline_comment_prefixes=("#",))
    try:
        cp.read_string(read_text(path, "Synergy .ini"), str(path))
    except configparser.Error as e:
        raise SpecError(str(path), f"not a valid .ini: {e.message.splitlines()[0]}") from None
    if "CLUSTER" not in cp:
        raise SpecError(str(path), "missing [CLUSTER] section")
    c = cp["CLUSTER"]
    try:
        racks, per, gpus = int(c["racks"]), int(c["servers_per_rack"]), int(c["gpus_per_server"])
        cpus, dram = int(c["cpus_per_server"]), float(c["dram_per_server"])
    except (KeyError, ValueError) as e:
        raise SpecError(f"{path} [CLUSTER]", f"missing or bad value: {e}") from None
    nodes = [
        Node(
            f"r{r}-s{s:02d}",
            cpus * 1000,
            round(dram * 1024),
            tuple(Gpu(j, "V100", 16384) for j in range(gpus)),
            topology={"rack": f"r{r}"},
        )
        for r in range(racks)
        for s in range(per)
    ]
    return nodes, ["rack"]
