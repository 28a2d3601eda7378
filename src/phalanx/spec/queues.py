"""Queue specs: a tree of queues with per-resource quotas, in cluster YAML under `queues:`.

GPU amounts are GPUs (1.5 = one and a half), CPU amounts cores, memory amounts MiB or
quantities such as 512Gi. Omitted limits mean unlimited.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from phalanx.core.errors import SpecError
from phalanx.core.queues import INF, Queue, QueueTree, ResourceQuota
from phalanx.spec.common import at
from phalanx.spec.quantity import cpu_milli, memory_mib


class QuotaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    deserved: float | int | str = 0
    limit: float | int | str | None = None
    over_quota_weight: float = Field(default=1.0, ge=0)
    borrowing_limit: float | int | str | None = None
    lending_limit: float | int | str | None = None


class QueueSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    parent: str = ""
    priority: int = 0
    quotas: dict[str, QuotaSpec] = Field(default_factory=dict)


def _amount(resource: str, value: float | int | str | None, where: str) -> float:
    if value is None:
        return INF
    if resource == "gpu":
        if isinstance(value, bool):
            raise SpecError(where, f"GPU amounts are numbers of GPUs, got {value!r}")
        if isinstance(value, str):  # "1.5": Kubernetes int-or-string fields carry fractions as strings
            try:
                value = float(value)
            except ValueError:
                raise SpecError(where, f"GPU amounts are numbers of GPUs, got {value!r}") from None
        if math.isnan(value) or value < 0:
            raise SpecError(where, f"must be >= 0, got {value}")
        return float(value) * 1000
    if resource == "cpu":
        return float(cpu_milli(value, where))
    if resource == "memory":
        return float(memory_mib(value, where))
    raise SpecError(where, f"unknown resource {resource!r} (known: gpu, cpu, memory)")


def build_queues(specs: list[Any], gpu_weights: dict[str, float], where: str) -> QueueTree:
    queues = []
    for k, raw in enumerate(specs):
        w = f"{where}queues[{k}]"
        q = QueueSpec.model_validate(raw) if not isinstance(raw, QueueSpec) else raw
        quotas = {}
        for r, qs in q.quotas.items():
            qw = f"{w}.quotas.{r}"
            with at(qw):
                quotas[r] = ResourceQuota(
                    deserved=_amount(r, qs.deserved, f"{qw}.deserved"),
                    limit=_amount(r, qs.limit, f"{qw}.limit"),
                    over_quota_weight=qs.over_quota_weight,
                    borrowing_limit=_amount(r, qs.borrowing_limit, f"{qw}.borrowing_limit"),
                    lending_limit=_amount(r, qs.lending_limit, f"{qw}.lending_limit"),
                )
        with at(w):
            queues.append(Queue(q.name, q.parent, quotas, q.priority))
    with at(where.rstrip(": ") or "queues"):
        return QueueTree(queues, gpu_weights)
