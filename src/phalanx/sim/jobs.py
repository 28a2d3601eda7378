"""Jobs of a time-replay trace and how they become workloads (gangs)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from phalanx.core.errors import SpecError
from phalanx.core.model import (
    MILLI,
    GpuRequest,
    Node,
    PodSet,
    SubGroup,
    TaskRequest,
    TopologyConstraint,
    Workload,
)


@dataclass(frozen=True, slots=True)
class JobGroup:
    """One subgroup of a multi-level job (prefill or decode of a disaggregated server): its tasks,
    the minimum of them that must run together, and the topology level that keeps them together."""

    name: str
    tasks: int
    min_tasks: int = 0  # 0: all of its tasks
    level: str = ""  # "" : anywhere inside the job's placement
    required: bool = True


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job of a trace: when it arrives, how long it runs when placed ideally, what it asks for."""

    name: str
    submit: float
    duration: float
    gpus: int
    tasks: int = 0
    queue: str = "default"
    user: str = ""
    model: str = ""
    iterations: int | None = None
    dataset: str = ""
    dataset_bytes: int = 0  # its size, when the trace says
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_milli: int = MILLI
    priority: int = 0
    preemptible: bool = True
    checkpoint_interval: float | None = None  # seconds; None: the replay's default
    min_tasks: int = 0  # elastic: runs with min_tasks..task_count tasks (0: rigid gang)
    where: str = ""
    groups: tuple[JobGroup, ...] = ()  # a multi-level gang: its tasks split into these subgroups
    restart_s: float | None = None  # what an eviction costs its GPUs to start again; None: the replay's
    mig: str = ""  # a MIG profile ("1g.10gb"): each task asks one such slice (gpus: one per task)

    def __post_init__(self) -> None:
        where = self.where or f"job {self.name}"
        if not math.isfinite(self.submit) or self.submit < 0:
            raise SpecError(where, f"submit time must be a finite number >= 0, got {self.submit}")
        if not math.isfinite(self.duration) or self.duration <= 0:
            raise SpecError(where, f"duration must be > 0 seconds, got {self.duration}")
        if self.gpus < 0:
            raise SpecError(where, f"GPU count must be >= 0, got {self.gpus}")
        if self.tasks < 0:
            raise SpecError(where, f"task count must be >= 0, got {self.tasks}")
        if self.restart_s is not None and not (math.isfinite(self.restart_s) and self.restart_s >= 0):
            raise SpecError(
                where, f"restart cost must be a finite number of seconds >= 0, got {self.restart_s}"
            )
        if self.checkpoint_interval is not None and not self.checkpoint_interval >= 0:
            raise SpecError(where, f"checkpoint interval must be >= 0 s, got {self.checkpoint_interval}")
        if self.min_tasks < 0 or self.min_tasks > self.task_count:
            raise SpecError(where, f"min tasks must be in [0, {self.task_count}], got {self.min_tasks}")
        if self.mig and (
            not self.mig[:1].isdigit() or not self.mig[1:2] == "g" or self.gpus != self.task_count
        ):
            raise SpecError(
                where, f"a MIG job asks one slice (like 1g.10gb) per task, got {self.mig!r} x {self.gpus}"
            )
        if not 0 < self.gpu_milli <= MILLI:
            raise SpecError(where, f"GPU share per task must be in (0, 1000] milli, got {self.gpu_milli}")
        if self.groups and sum(g.tasks for g in self.groups) != self.task_count:
            raise SpecError(
                where, f"its groups hold {sum(g.tasks for g in self.groups)} tasks, not {self.task_count}"
            )

    @property
    def task_count(self) -> int:
        """One task per GPU unless the trace says otherwise (at least one task)."""
        if self.tasks:
            return self.tasks
        return max(1, self.gpus if self.gpu_milli == MILLI else 1)

    @property
    def min_count(self) -> int:
        return self.min_tasks or self.task_count

    @property
    def gpus_per_task(self) -> float:
        return self.gpu_amount / self.task_count

    @property
    def gpu_amount(self) -> float:
        """GPUs the whole job holds (shares count as fractions, MIG slices as their compute sevenths)."""
        if self.mig:
            return self.task_count * int(self.mig[0]) / 7
        return self.task_count * self.gpu_milli / MILLI if self.gpu_milli < MILLI else float(self.gpus)

    def workload(self, checkpoint_interval: float = 0.0, estimated_runtime: float | None = None) -> Workload:
        """The job as a gang; the replay supplies its default checkpoint interval and run-time estimate."""
        n = self.task_count
        if self.mig:
            gpu = GpuRequest.mig(self.mig)
        elif self.gpus == 0:
            gpu = GpuRequest.none()
        elif self.gpu_milli < MILLI:
            gpu = GpuRequest.fraction(self.gpu_milli / MILLI)
        else:
            per, rest = divmod(self.gpus, n)
            if rest:
                raise SpecError(
                    self.where or f"job {self.name}", f"{self.gpus} GPUs do not split over {n} tasks"
                )
            gpu = GpuRequest.whole(per)
        req = TaskRequest(self.cpu_milli, self.memory_mib, gpu, dataset=self.dataset)
        podsets: tuple[PodSet, ...] = (PodSet("worker", n, req),)
        subgroups: tuple[SubGroup, ...] = ()
        if self.groups:
            podsets = tuple(PodSet(g.name, g.tasks, req) for g in self.groups)
            subgroups = tuple(
                SubGroup(
                    g.name,
                    (g.name,),
                    g.min_tasks or g.tasks,
                    TopologyConstraint(g.level, g.required) if g.level else None,
                )
                for g in self.groups
            )
        return Workload(
            self.name,
            podsets,
            min_available=0 if self.groups else self.min_count,
            subgroups=subgroups,
            queue=self.queue,
            priority=self.priority,
            preemptible=self.preemptible,
            creation_time=self.submit,
            checkpoint_interval=(
                self.checkpoint_interval if self.checkpoint_interval is not None else checkpoint_interval
            ),
            estimated_runtime=estimated_runtime,
            restart_s=self.restart_s,
        )


def never_fit(jobs: Sequence[JobSpec], nodes: Sequence[Node]) -> str:
    """One line naming the jobs that no placement on `nodes` can ever hold, or "" when none.

    Such a job waits to the end of the replay without a word (its pending reason repeats every
    cycle, unseen); said once up front, a wrong --cluster shows at once. Only sure cases count:
    more GPUs than the whole cluster, or more whole GPUs per task than the largest node has.
    """
    total = sum(len(n.gpus) for n in nodes)
    per_node = max((len(n.gpus) for n in nodes), default=0)
    bad = []
    for j in jobs:
        if j.gpus == 0:
            continue
        need = j.min_count * j.gpus_per_task
        whole_per_task = j.gpus_per_task if j.gpu_milli == MILLI else 1.0
        if need > total or whole_per_task > per_node:
            bad.append(f"{j.name} ({j.gpu_amount:g} GPUs, {j.task_count} task(s))")
    if not bad:
        return ""
    names = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return (
        f"{len(bad)} job(s) can never fit this cluster ({total} GPUs, at most {per_node} per node) "
        f"and will wait to the end: {names}"
    )
