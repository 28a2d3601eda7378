"""Gavel (OSDI'20) traces: Philly-derived per-VC job streams with measured throughputs.

`msr/seed=0/<vc>.trace`: tab-separated `job_type, command, num_steps_arg, needs_data_dir,
total_steps, arrival_time, scale_factor`. A job's duration on a V100 is
`total_steps / throughput[v100][(job_type, scale_factor)]` from `simulation_throughputs.json`.
The VC becomes the job's queue, and the dataset its command reads (`%s/data/<name>`) its dataset.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from phalanx.core.errors import SpecError
from phalanx.core.model import Gpu, Node
from phalanx.sim.jobs import JobSpec
from phalanx.sim.traces.rows import read_text


def load_throughputs(path: str | Path, worker: str = "v100") -> dict[tuple[str, int], float]:
    p = Path(path)
    try:
        data = json.loads(read_text(p, "throughputs JSON"))
    except json.JSONDecodeError as e:
        raise SpecError(f"{p}:{e.lineno}", f"not valid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise SpecError(str(p), "expected a JSON object of throughputs per worker type")
    table = data.get(worker)
    if not isinstance(table, dict):
        raise SpecError(str(p), f"no {worker!r} throughputs")
    out: dict[tuple[str, int], float] = {}
    for key, val in table.items():
        try:
            job_type, scale = key.strip("()").rsplit(",", 1)
            tput = val["null"] if isinstance(val, dict) else val
            out[(job_type.strip().strip("'\""), int(scale))] = float(tput)
        except (ValueError, KeyError, TypeError):
            continue
    return out


def throughput(table: dict[tuple[str, int], float], job_type: str, gpus: int) -> float | None:
    """Measured steps/s, or extrapolated linearly from the largest measured scale below `gpus`."""
    t = table.get((job_type, gpus))
    if t and math.isfinite(t) and t > 0:
        return t
    below = [s for (jt, s) in table if jt == job_type and s < gpus]
    if not below:
        return None
    s0 = max(below)
    t0 = table[(job_type, s0)]
    return t0 * gpus / s0 if t0 > 0 else None


_DATA = re.compile(r"%s/data/([A-Za-z0-9_-]+)")


def load_trace(
    path: str | Path, throughputs: dict[tuple[str, int], float], queue: str | None = None
) -> list[JobSpec]:
    p = Path(path)
    vc = queue or p.stem
    jobs = []
    lines = read_text(p, "Gavel .trace").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        f = line.split("\t")
        where = f"{p}:{n}"
        if len(f) == 7:
            job_type, steps, arrival, scale = f[0], f[4], f[5], f[6]
        elif len(f) == 10:
            job_type, steps, scale, arrival = f[0], f[5], f[6], f[9]
        else:
            raise SpecError(where, f"expected 7 or 10 tab-separated fields, got {len(f)}")
        # the dataset the job's own command line reads (`%s/data/imagenet/pytorch` -> imagenet)
        m = _DATA.search(f[1])
        dataset = m.group(1) if m else ""
        try:
            total_steps, t, gpus = int(float(steps)), float(arrival), int(scale)
        except ValueError:
            raise SpecError(where, "total_steps, arrival_time and scale_factor must be numbers") from None
        tput = throughput(throughputs, job_type, gpus)
        if tput is None:
            raise SpecError(where, f"no V100 throughput for ({job_type!r}, {gpus})")
        try:
            jobs.append(
                JobSpec(
                    f"{vc}-{n:05d}",
                    t,
                    total_steps / tput,
                    gpus,
                    queue=vc,
                    model=job_type,
                    iterations=total_steps,
                    dataset=dataset,
                    where=where,
                )
            )
        except SpecError as e:
            raise SpecError(where, e.message) from None
    if not jobs:
        raise SpecError(str(p), "no jobs in file")
    return jobs


def philly_cluster(
    gpus: int = 500, per_node: int = 4, nodes_per_rack: int = 16
) -> tuple[list[Node], list[str]]:
    """Gavel's `philly` cluster spec (500 V100), laid out as 4-GPU servers in racks of 16."""
    n = -(-gpus // per_node)
    nodes = []
    for i in range(n):
        g = min(per_node, gpus - i * per_node)
        nodes.append(
            Node(
                f"v100-{i:03d}",
                32_000,
                256 * 1024,
                tuple(Gpu(j, "V100", 16384) for j in range(g)),
                topology={"rack": f"rack{i // nodes_per_rack}"},
            )
        )
    return nodes, ["rack"]
