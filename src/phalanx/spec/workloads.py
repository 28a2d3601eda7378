"""Workload specs: gangs of pod sets with CPU, memory, GPU (whole, fraction, memory, MIG), NICs, data."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from phalanx.core.allocator import SelectorCache
from phalanx.core.dra import DraDevice
from phalanx.core.drafit import footprint
from phalanx.core.errors import SpecError
from phalanx.core.model import (
    GpuKind,
    GpuRequest,
    PodSet,
    SubGroup,
    TaskRequest,
    Toleration,
    TopologyConstraint,
    Workload,
)
from phalanx.spec.affinity import node_selector_terms
from phalanx.spec.common import at, load_yaml, validate
from phalanx.spec.dra import parse_claim_spec
from phalanx.spec.quantity import cpu_milli, memory_mib


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TolerationSpec(_Strict):
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""


class ClaimYaml(_Strict):
    """A DRA claim of each task (as a ResourceClaimTemplate's spec), or one shared by the pod set's tasks."""

    name: str
    shared: bool = False
    devices: dict[str, Any]


class PodSetSpec(_Strict):
    name: str
    count: int = 1
    cpu: int | float | str = 0
    memory: int | float | str = 0
    gpu: int | None = None
    gpu_fraction: float | None = None
    gpu_memory: int | str | None = None
    gpu_devices: int | None = None
    mig: str | None = None
    gpu_models: list[str] | str | None = None
    rdma_nics: int = 0
    nic_same_pcie: bool = False
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    dataset: str = ""
    node_affinity: list[dict[str, Any]] | None = None  # Kubernetes nodeSelectorTerms, ORed
    claims: list[ClaimYaml] = Field(default_factory=list)


class TopologySpec(_Strict):
    level: str
    required: bool = False


class SubGroupSpec(_Strict):
    """One gang of a multi-level workload: its pod sets, its minimum, its topology."""

    name: str
    podsets: list[str]
    min_available: int
    topology: TopologySpec | None = None


class WorkloadSpec(_Strict):
    name: str
    podsets: list[PodSetSpec]
    min_available: int | None = None
    subgroups: list[SubGroupSpec] = Field(default_factory=list)
    preempt_whole: bool = False
    preempts: bool = True  # false: Kubernetes' preemptionPolicy Never (placed in free room only)
    queue: str = "default"
    priority: int = 0
    preemptible: bool = True
    creation_time: float = 0.0
    topology: TopologySpec | None = None
    duration: float | None = None


class WorkloadsSpec(_Strict):
    workloads: list[WorkloadSpec]


def gpu_request(p: PodSetSpec, where: str) -> GpuRequest:
    kinds = [
        k
        for k, v in (
            ("gpu", p.gpu),
            ("gpu_fraction", p.gpu_fraction),
            ("gpu_memory", p.gpu_memory),
            ("mig", p.mig),
        )
        if v is not None
    ]
    if len(kinds) > 1:
        raise SpecError(
            where, f"give only one of gpu, gpu_fraction, gpu_memory, mig (got {', '.join(kinds)})"
        )
    devices = p.gpu_devices if p.gpu_devices is not None else 1
    if p.gpu_devices is not None and kinds and kinds[0] in ("gpu", "mig"):
        raise SpecError(f"{where}.gpu_devices", "only applies to gpu_fraction or gpu_memory")
    with at(where):
        if p.gpu is not None:
            if p.gpu < 0:
                raise SpecError("gpu", f"GPU count must be >= 0, got {p.gpu}")
            return GpuRequest.whole(p.gpu) if p.gpu else GpuRequest.none()
        if p.gpu_fraction is not None:
            return GpuRequest.fraction(p.gpu_fraction, devices)
        if p.gpu_memory is not None:
            return GpuRequest.memory(memory_mib(p.gpu_memory, "gpu_memory"), devices)
        if p.mig is not None:
            return GpuRequest.mig(p.mig)
    return GpuRequest.none()


def models_of(value: list[str] | str | None) -> frozenset[str]:
    if value is None:
        return frozenset()
    parts = value.split("|") if isinstance(value, str) else value
    return frozenset(x.strip() for x in parts if x.strip())


def build_workload(w: WorkloadSpec, where: str, dra: DraContext | None = None) -> Workload:
    podsets = []
    for k, p in enumerate(w.podsets):
        pw = f"{where}.podsets[{k}]"
        tolerations = []
        for j, t in enumerate(p.tolerations):
            with at(f"{pw}.tolerations[{j}]"):
                tolerations.append(Toleration(t.key, t.operator, t.value, t.effect))
        cpu = cpu_milli(p.cpu, f"{pw}.cpu")
        mem = memory_mib(p.memory, f"{pw}.memory")
        gpu = gpu_request(p, pw)
        affinity = node_selector_terms(p.node_affinity, f"{pw}.node_affinity")
        with at(pw):
            req = TaskRequest(
                cpu_milli=cpu,
                memory_mib=mem,
                gpu=gpu,
                gpu_models=models_of(p.gpu_models),
                rdma_nics=p.rdma_nics,
                nic_same_pcie=p.nic_same_pcie,
                node_selector=dict(p.node_selector),
                tolerations=tuple(tolerations),
                dataset=p.dataset,
                node_affinity=affinity,
            )
            if not p.claims:
                podsets.append(PodSet(p.name, p.count, req))
                continue
        if gpu.kind is not GpuKind.NONE or p.rdma_nics:
            raise SpecError(
                pw, "ask for devices one way: claims, or gpu/gpu_fraction/gpu_memory/mig/rdma_nics"
            )
        podsets += _claimed(w.name, p, req, pw, dra or DraContext())
    topo = TopologyConstraint(w.topology.level, w.topology.required) if w.topology else None
    subs = tuple(
        SubGroup(
            sg.name,
            tuple(sg.podsets),
            sg.min_available,
            TopologyConstraint(sg.topology.level, sg.topology.required) if sg.topology else None,
        )
        for sg in w.subgroups
    )
    with at(where):
        return Workload(
            name=w.name,
            podsets=tuple(podsets),
            min_available=w.min_available or 0,
            queue=w.queue,
            priority=w.priority,
            preemptible=w.preemptible,
            creation_time=w.creation_time,
            topology=topo,
            subgroups=subs,
            preempt_whole=w.preempt_whole,
            preempts=w.preempts,
        )


def parse_workloads(
    data: Any, source: str = "workloads", dra: DraContext | None = None
) -> tuple[list[Workload], dict[str, float]]:
    """Workloads and, where given, their durations (used by the simulator)."""
    if isinstance(data, list):
        data = {"workloads": data}
    if not isinstance(data, dict):
        raise SpecError(source, "a workload spec must be a YAML mapping with a `workloads` list")
    spec = validate(WorkloadsSpec, data, source)
    out: list[Workload] = []
    durations: dict[str, float] = {}
    seen: set[str] = set()
    for k, w in enumerate(spec.workloads):
        where = f"{source}: workloads[{k}]"
        if w.name in seen:
            raise SpecError(f"{where}.name", f"duplicate workload name {w.name!r}")
        seen.add(w.name)
        out.append(build_workload(w, where, dra))
        if w.duration is not None:
            if w.duration <= 0:
                raise SpecError(f"{where}.duration", f"duration must be > 0 seconds, got {w.duration}")
            durations[w.name] = w.duration
    return out, durations


def load_workloads(
    path: str | Path, dra: DraContext | None = None
) -> tuple[list[Workload], dict[str, float]]:
    return parse_workloads(load_yaml(path), str(path), dra)


@dataclass
class DraContext:
    """What claims need from the cluster: the DeviceClasses, and the devices (for what a claim amounts to)."""

    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    devices: list[DraDevice] = field(default_factory=list)
    cache: SelectorCache = field(default_factory=SelectorCache)


def _claimed(workload: str, p: PodSetSpec, req: TaskRequest, where: str, dra: DraContext) -> list[PodSet]:
    """One pod set per task (each task has claims of its own), named as the tasks would be anyway."""
    out = []
    for i in range(p.count):
        task = f"{workload}/{p.name}-{i}"
        claims = []
        for k, c in enumerate(p.claims):
            key = f"{workload}/{c.name}" if c.shared else f"{task}-{c.name}"
            claims.append(
                parse_claim_spec({"devices": c.devices}, key, dra.classes, c.shared, f"{where}.claims[{k}]")
            )
        gpu, nics = footprint(tuple(claims), dra.devices, dra.cache)
        task_req = replace(req, claims=tuple(claims), gpu=gpu, rdma_nics=nics)
        out.append(PodSet(f"{p.name}-{i}", 1, task_req, (task,)))
    return out
