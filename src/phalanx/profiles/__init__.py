"""Profiles as data: YAML files compiled to `phalanx.core.profile.Profile`.

A profile names its actions and plugins; the registry below maps names to classes.
An experiment is a YAML change, not a code change.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from phalanx.actions.allocate import Allocate
from phalanx.actions.backfill import Backfill
from phalanx.actions.consolidate import Consolidate
from phalanx.actions.preempt import Preempt
from phalanx.actions.reclaim import Reclaim
from phalanx.actions.repartition import Repartition
from phalanx.actions.replan import Replan
from phalanx.actions.reserve import Reserve
from phalanx.core import traits
from phalanx.core.backends import DEFAULT as DEFAULT_BACKEND
from phalanx.core.backends import FractionBackend
from phalanx.core.errors import SpecError
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
from phalanx.core.profile import Profile
from phalanx.plugins.bestfit import BestFitScorer
from phalanx.plugins.binpack import BinpackScorer, SpreadScorer
from phalanx.plugins.dotprod import DotProdScorer
from phalanx.plugins.fairshare import FairShareOrder
from phalanx.plugins.fgd import FgdScorer
from phalanx.plugins.gpuclustering import GpuClusteringScorer
from phalanx.plugins.gpupacking import GpuPackingScorer
from phalanx.plugins.gpuselect import BestFitGpu, RandomGpu
from phalanx.plugins.locality import DatasetMountFilter, DataTopologyPlanner, LocalityScorer
from phalanx.plugins.order import LasOrder, PriorityOrder, SrtfOrder
from phalanx.plugins.quota import QuotaCheck
from phalanx.plugins.random import RandomScorer
from phalanx.plugins.reservation import ReservationFilter
from phalanx.plugins.topology import GangAffinityScorer, TopologyPlanner
from phalanx.plugins.wholeguard import WholeGpuGuard

T = TypeVar("T")
Factory = Callable[..., Any]  # any plugin's constructor, for the argument check

# The registry, typed by extension point: mypy checks that each class satisfies its Protocol.
ACTIONS: Mapping[str, Callable[..., Action]] = {
    "allocate": Allocate,
    "backfill": Backfill,
    "preempt": Preempt,
    "reclaim": Reclaim,
    "consolidate": Consolidate,
    "reserve": Reserve,
    "replan": Replan,
    "repartition": Repartition,
}
SCORERS: Mapping[str, Callable[..., NodeScorer]] = {
    "random": RandomScorer,
    "dotprod": DotProdScorer,
    "gpuclustering": GpuClusteringScorer,
    "gpupacking": GpuPackingScorer,
    "bestfit": BestFitScorer,
    "fgd": FgdScorer,
    "binpack": BinpackScorer,
    "spread": SpreadScorer,
    "locality": LocalityScorer,
    "gang-affinity": GangAffinityScorer,
}
SELECTORS: Mapping[str, Callable[..., DeviceSelector]] = {
    "bestfit-gpu": BestFitGpu,
    "random-gpu": RandomGpu,
    "fgd": FgdScorer,
}
ORDERS: Mapping[str, Callable[..., WorkloadOrder]] = {
    "priority": PriorityOrder,
    "las": LasOrder,
    "srtf": SrtfOrder,
}
PLANNERS: Mapping[str, Callable[..., GangPlanner]] = {
    "topology": TopologyPlanner,
    "data-topology": DataTopologyPlanner,
}
ADMISSION: Mapping[str, Callable[..., AdmissionCheck]] = {"quota": QuotaCheck}
QUEUE_ORDERS: Mapping[str, Callable[..., QueueOrder]] = {"fairshare": FairShareOrder}
FILTERS: Mapping[str, Callable[..., NodeFilter]] = {
    "whole-gpu-guard": WholeGpuGuard,
    "reservation": ReservationFilter,
    "dataset-mount": DatasetMountFilter,
}
REGISTRIES: Mapping[str, Mapping[str, Callable[..., object]]] = {
    "actions": ACTIONS,
    "scorers": SCORERS,
    "device_selector": SELECTORS,
    "order": ORDERS,
    "gang_planner": PLANNERS,
    "admission": ADMISSION,
    "queue_order": QUEUE_ORDERS,
    "filters": FILTERS,
}


class PluginSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    weight: float = 1.0


class FractionBackendSpec(BaseModel):
    """`fraction_backend`: which backend serves a fractional GPU request (`core.backends`)."""

    model_config = ConfigDict(extra="forbid")
    order: list[Literal["mig", "mps", "time-slice"]] = Field(min_length=1)
    mig_for: Literal["memory", "fraction", "any"] = "any"


class ProfileSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    tie_break: Literal["random", "name"] = "random"
    gpu_sharing: bool = True
    preemption_cost: Literal["checkpoint", "none"] = "checkpoint"
    actions: list[PluginSpec]
    order: list[PluginSpec] = Field(default_factory=list)
    filters: list[PluginSpec] = Field(default_factory=list)
    scorers: list[PluginSpec] = Field(default_factory=list)
    device_selector: PluginSpec | None = None
    gang_planner: PluginSpec | None = None
    admission: list[PluginSpec] = Field(default_factory=list)
    queue_order: PluginSpec | None = None
    fraction_backend: FractionBackendSpec | None = None


def _fraction_backend(spec: FractionBackendSpec | None, source: str) -> FractionBackend:
    if spec is None:
        return DEFAULT_BACKEND
    if len(set(spec.order)) != len(spec.order):
        listed = ", ".join(spec.order)
        raise SpecError(f"{source}: fraction_backend.order", f"a backend listed twice: {listed}")
    return FractionBackend(tuple(spec.order), spec.mig_for)


def _make(registry: Mapping[str, Callable[..., T]], spec: PluginSpec, where: str) -> T:
    factory = registry.get(spec.name)
    if factory is None:
        raise SpecError(where, f"unknown plugin {spec.name!r} (known: {', '.join(sorted(registry))})")
    _check_arg_names(factory, spec, where)
    try:
        plugin = factory(**spec.args)
    except (TypeError, ValueError) as e:  # a value the plugin refuses
        raise SpecError(f"{where}.args", f"bad arguments for {spec.name}: {e}") from None
    traits.check(plugin, where)
    return plugin


def _check_arg_names(factory: Factory, spec: PluginSpec, where: str) -> None:
    """A misspelt argument names itself and what the plugin takes, not `X.__init__() got an
    unexpected keyword argument`, which names a class the profile never mentions."""
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(spec.args) - set(params))
    if unknown:
        takes = ", ".join(params) or "no arguments"
        raise SpecError(
            f"{where}.args",
            f"bad arguments for {spec.name}: unknown argument(s) {', '.join(map(repr, unknown))} "
            f"({spec.name} takes: {takes})",
        )


def compile_profile(data: Mapping[str, Any], source: str = "profile") -> Profile:
    """Validate profile data and build its plugin objects."""
    try:
        spec = ProfileSpec.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise SpecError(f"{source}: {loc}", err["msg"]) from None
    scorers = [(_make(SCORERS, p, f"{source}: scorers[{k}]"), p.weight) for k, p in enumerate(spec.scorers)]
    selector: DeviceSelector | None = None
    if spec.device_selector is not None:  # a plugin in both registries (fgd): one object scores and selects
        same = [
            s
            for (s, _), p in zip(scorers, spec.scorers, strict=True)
            if p.name == spec.device_selector.name and not spec.device_selector.args
        ]
        selector = (
            cast(DeviceSelector, same[0])
            if same
            else _make(SELECTORS, spec.device_selector, f"{source}: device_selector")
        )
    return Profile(
        name=spec.name,
        description=spec.description,
        actions=[_make(ACTIONS, p, f"{source}: actions[{k}]") for k, p in enumerate(spec.actions)],
        scorers=scorers,
        filters=[_make(FILTERS, p, f"{source}: filters[{k}]") for k, p in enumerate(spec.filters)],
        order=[_make(ORDERS, p, f"{source}: order[{k}]") for k, p in enumerate(spec.order)],
        device_selector=selector,
        gang_planner=_make(PLANNERS, spec.gang_planner, f"{source}: gang_planner")
        if spec.gang_planner
        else None,
        admission=[_make(ADMISSION, p, f"{source}: admission[{k}]") for k, p in enumerate(spec.admission)],
        queue_order=_make(QUEUE_ORDERS, spec.queue_order, f"{source}: queue_order")
        if spec.queue_order
        else None,
        tie_break=spec.tie_break,
        gpu_sharing=spec.gpu_sharing,
        preemption_cost=spec.preemption_cost,
        fraction_backend=_fraction_backend(spec.fraction_backend, source),
    )


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__package__).iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        # a path: a missing file is said as such, not as an unknown built-in name
        if not path.is_file():
            raise SpecError("profile", f"file not found: {name_or_path}")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            why = "not a text file" if isinstance(e, UnicodeDecodeError) else e.strerror or str(e)
            raise SpecError(name_or_path, f"cannot read profile: {why}") from None
        source = str(path)
    else:
        res = resources.files(__package__) / f"{name_or_path}.yaml"
        if not res.is_file():
            raise SpecError(
                "profile", f"unknown profile {name_or_path!r} (built-in: {', '.join(builtin_names())})"
            )
        text = res.read_text()
        source = f"profile {name_or_path}"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:  # one line: where, and the problem without YAML's source excerpt
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise SpecError(where, f"not valid YAML: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict):
        raise SpecError(source, "a profile must be a YAML mapping")
    return compile_profile(data, source)
