"""A compiled profile: ordered actions and the plugins at each extension point.

Profiles are written as YAML data (see `phalanx.profiles`); this is what that data
compiles to. The core only calls these objects through their protocols.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from phalanx.core.backends import DEFAULT, FractionBackend
from phalanx.core.extension import (
    Action,
    AdmissionCheck,
    DeviceSelector,
    GangPlanner,
    NodeFilter,
    NodeScorer,
    QueueOrder,
    WorkloadOrder,
)

TieBreak = Literal["random", "name"]
PreemptionCost = Literal["checkpoint", "none"]


@dataclass(slots=True)
class Profile:
    name: str
    actions: list[Action]
    scorers: list[tuple[NodeScorer, float]] = field(default_factory=list)
    filters: list[NodeFilter] = field(default_factory=list)
    order: list[WorkloadOrder] = field(default_factory=list)
    device_selector: DeviceSelector | None = None
    gang_planner: GangPlanner | None = None
    admission: list[AdmissionCheck] = field(default_factory=list)
    queue_order: QueueOrder | None = None
    tie_break: TieBreak = "random"
    gpu_sharing: bool = True
    description: str = ""
    # what a preempted workload loses, for drivers that model it (the replay): work since its last
    # checkpoint (realistic), or nothing (the free preemption of papers' simulators)
    preemption_cost: PreemptionCost = "checkpoint"
    # which backend serves a fractional GPU request (`core.backends`); the default: time-slice shares
    fraction_backend: FractionBackend = DEFAULT
