"""Tiresias (NSDI'19) job CSVs and cluster specs (also the format of the Synergy and Gavel conversions).

Jobs: `job_id,num_gpu,submit_time,iterations,model_name,duration,interval` (seconds).
Cluster: `num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node` (memory in GB).
"""

from __future__ import annotations

from pathlib import Path

from phalanx.core.errors import SpecError
from phalanx.core.model import Gpu, Node
from phalanx.sim.jobs import JobSpec
from phalanx.sim.traces.rows import read_rows


def load_jobs(path: str | Path, queue: str = "default") -> list[JobSpec]:
    jobs = []
    for row in read_rows(path, ("job_id", "num_gpu", "submit_time", "duration")):
        try:
            jobs.append(
                JobSpec(
                    name=f"job-{row.text('job_id')}",
                    submit=row.float("submit_time"),
                    duration=row.float("duration"),
                    gpus=row.int("num_gpu"),
                    queue=row.text("queue", queue),
                    model=row.text("model_name", ""),
                    iterations=row.int("iterations", 0) or None,
                    where=row.where,
                )
            )
        except SpecError as e:
            raise SpecError(row.where, e.message) from None
    if not jobs:
        raise SpecError(str(path), "no jobs in file")
    return jobs


def load_cluster(
    path: str | Path, gpu_model: str = "V100", gpu_memory_mib: int = 32768
) -> tuple[list[Node], list[str]]:
    """Switches x nodes per switch x GPUs per node; the switch is the rack level."""
    rows = list(
        read_rows(path, ("num_switch", "num_node_p_switch", "num_gpu_p_node", "num_cpu_p_node", "mem_p_node"))
    )
    if len(rows) != 1:
        raise SpecError(str(path), f"expected one cluster row, found {len(rows)}")
    r = rows[0]
    switches, per, gpus = (
        r.int("num_switch", minimum=1),
        r.int("num_node_p_switch", minimum=1),
        r.int("num_gpu_p_node"),
    )
    cpu, mem_gb = r.int("num_cpu_p_node"), r.float("mem_p_node")
    nodes = []
    for s in range(switches):
        for k in range(per):
            nodes.append(
                Node(
                    f"sw{s}-n{k:03d}",
                    cpu * 1000,
                    round(mem_gb * 1024),
                    tuple(Gpu(j, gpu_model, gpu_memory_mib) for j in range(gpus)),
                    topology={"rack": f"sw{s}"},
                )
            )
    return nodes, ["rack"]
