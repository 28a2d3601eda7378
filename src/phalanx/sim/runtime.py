"""How placement changes a job's run time in the time replay: spread, cache and GPU sharing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from phalanx.core.snapshot import Allocation, Snapshot
from phalanx.spec.common import load_yaml, validate


class SpreadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    bandwidth_gbps: dict[str, float] = Field(default_factory=dict)
    default_iteration_s: float = Field(default=0.5, gt=0)
    default_model_mb: float = Field(default=100.0, ge=0)
    model_mb: dict[str, float] = Field(default_factory=dict)


class CacheSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    remote_gbps: float = Field(default=10.0, gt=0)
    local_gbps: float = Field(default=25.0, gt=0)
    epochs: float = Field(default=1.0, ge=0)


class DistributedSpec(BaseModel):
    """`--data-cache distributed` (`phalanx.sim.distcache`): datasets striped over a cache group."""

    model_config = ConfigDict(extra="forbid")
    group: str = "all"  # all, a count (the first N nodes by name), or a node label key=value
    replicas: int = Field(default=1, ge=1)  # copies of each block, on different members
    nic_gbps: float = Field(default=10.0, gt=0)  # a node's link to its peers, each way
    source_gbps: float = Field(default=100.0, gt=0)  # the remote source, shared by the group's fetch

    @field_validator("group", mode="before")
    @classmethod
    def _group(cls, v: object) -> str:
        """A YAML count arrives as an int; anything else must read as one of the three forms."""
        text = str(v).strip() if isinstance(v, int | str) and not isinstance(v, bool) else ""
        if text == "all" or (text.isdigit() and int(text) > 0):
            return text
        key, eq, _ = text.partition("=")
        if eq and key.strip():
            return text
        raise ValueError(f"must be all, a node count (16) or a node label key=value; got {v!r}")


class IoSpec(BaseModel):
    """Input I/O for the dynamic data cache of the replay (`phalanx.sim.datacache`)."""

    model_config = ConfigDict(extra="forbid")
    read_gbps: float = Field(default=1.0, gt=0)  # a training loader's reads from remote storage, per node
    stage_gbps: float = Field(default=10.0, gt=0)  # bulk parallel copy into the cache, per node
    nvme_gbps: float = Field(default=16.0, gt=0)  # reads from the node's cache
    capacity_gb: float = Field(default=7680.0, ge=0)  # cache per node
    epochs: float = Field(default=10.0, gt=0)  # when the trace does not say
    dataset_gb: dict[str, float] = Field(default_factory=dict)  # dataset -> size, when the trace does not say
    samples: dict[str, int] = Field(default_factory=dict)  # dataset -> samples per epoch
    plan_every_s: float = Field(default=300.0, ge=0)  # staging ahead: how often the forecast is asked
    plan_gangs: int = Field(default=32, ge=1)  # ... for this many waiting gangs with a dataset
    min_copy_s: float = Field(default=10.0, ge=0)  # ... whose copy takes longer than this
    plan_steps: int = Field(default=50, ge=1)
    horizon_s: float = Field(default=3600.0, ge=0)  # ... that should start within this
    distributed: DistributedSpec = Field(default_factory=DistributedSpec)


class SharingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    slowdown: float = Field(default=0.3, ge=0)


class RuntimeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spread: SpreadSpec = Field(default_factory=SpreadSpec)
    cache: CacheSpec = Field(default_factory=CacheSpec)
    sharing: SharingSpec = Field(default_factory=SharingSpec)
    io: IoSpec = Field(default_factory=IoSpec)


def default_runtime() -> RuntimeSpec:
    data = yaml.safe_load((resources.files("phalanx.sim") / "runtime.yaml").read_text())
    return validate(RuntimeSpec, data, "runtime.yaml")


def load_runtime(path: str | Path | None, off: Mapping[str, bool] | None = None) -> RuntimeSpec:
    spec = default_runtime() if path is None else validate(RuntimeSpec, load_yaml(path), str(path))
    for name, disabled in (off or {}).items():
        if disabled:
            getattr(spec, name).enabled = False
    return spec


def model_key(name: str) -> str:
    """`ResNet-50 (batch size 64)` -> `resnet50`."""
    base = name.split("(")[0].strip().lower()
    return "".join(ch for ch in base if ch.isalnum())


@dataclass(frozen=True, slots=True)
class JobShape:
    """What the runtime model needs to know about a job."""

    gpus: int
    duration: float
    iterations: int | None = None
    model: str = ""
    dataset: str = ""
    epochs: float | None = None


@dataclass
class RuntimeModel:
    spec: RuntimeSpec = field(default_factory=default_runtime)

    def span_level(self, s: Snapshot, nodes: set[int]) -> str:
        """The narrowest topology level containing every node of the job."""
        if len(nodes) <= 1:
            return "node"
        for level in reversed(s.topology_levels):
            dom = s.domains(level)
            if len({int(dom[i]) for i in nodes}) == 1:
                return level
        return "cluster"

    def _bw(self, level: str) -> float:
        bw = self.spec.spread.bandwidth_gbps
        return bw.get(level, bw.get("cluster", 50.0))

    def comm_seconds(self, job: JobShape, level: str) -> float:
        """Ring all-reduce time per iteration at a topology level."""
        n = job.gpus
        if n <= 1:
            return 0.0
        sp = self.spec.spread
        mb = sp.model_mb.get(model_key(job.model), sp.default_model_mb)
        return 2 * (n - 1) / n * mb * 8e6 / (self._bw(level) * 1e9)

    def ideal_level(self, s: Snapshot, job: JobShape) -> str:
        if job.gpus <= int(s.cluster.gpu_count.max(initial=0)):
            return "node"
        return s.topology_levels[-1] if s.topology_levels else "cluster"

    def run_time(self, s: Snapshot, job: JobShape, allocs: list[Allocation]) -> float:
        """Run time of the job placed as `allocs` (its duration when placed ideally)."""
        t = job.duration
        nodes = {a.node for a in allocs}
        sp = self.spec.spread
        if sp.enabled and job.gpus > 1:
            iters = job.iterations or max(1, round(job.duration / sp.default_iteration_s))
            extra = self.comm_seconds(job, self.span_level(s, nodes)) - self.comm_seconds(
                job, self.ideal_level(s, job)
            )
            t += iters * max(0.0, extra)
        ca = self.spec.cache
        if ca.enabled and job.dataset and allocs:
            size = s.datasets.get(job.dataset, 0)
            if size > 0:
                frac = s.dataset_fraction(job.dataset)
                cached = sum(float(frac[a.node]) for a in allocs) / len(allocs)
                epochs = job.epochs if job.epochs is not None else ca.epochs
                shard_bits = size * 8 / len(allocs)
                remote = shard_bits / (ca.remote_gbps * 1e9)
                local = shard_bits / (ca.local_gbps * 1e9)
                t += epochs * (1.0 - cached) * (remote - local)
        sh = self.spec.sharing
        if sh.enabled and any(a.devices.gpus and a.devices.milli < 1000 and _shared(s, a) for a in allocs):
            t *= 1.0 + sh.slowdown
        return t


def _shared(s: Snapshot, a: Allocation) -> bool:
    """Does another task use one of this task's GPUs?"""
    gpus = set(a.devices.gpus)
    for other in s.on_node[a.node].values():
        if other.task.name != a.task.name and gpus & set(other.devices.gpus):
            return True
    return False


def runtime_from_dict(data: Any) -> RuntimeSpec:
    return validate(RuntimeSpec, data, "runtime")
