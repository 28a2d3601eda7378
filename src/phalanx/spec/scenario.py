"""Scenario files: a cluster, workloads, a profile and steps with expectations, all in one YAML.

The same scenarios the tests build with fluent builders can be written this way, run by
`phalanx scenario FILE` and checked by `run_scenario`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import CycleResult
from phalanx.core.errors import SpecError
from phalanx.core.model import Workload
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import load_profile
from phalanx.spec.cluster import parse_cluster
from phalanx.spec.common import load_yaml, validate
from phalanx.spec.workloads import parse_workloads


class Expect(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bound: dict[str, int] = Field(default_factory=dict)
    pending: dict[str, str] = Field(default_factory=dict)
    nodes: dict[str, list[str]] = Field(default_factory=dict)


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: int | None = None
    complete: str | None = None
    expect: Expect | None = None


class ScenarioSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""
    profile: str = "phalanx"
    seed: int = 0
    cluster: dict[str, Any]
    workloads: list[dict[str, Any]]
    steps: list[Step] = Field(default_factory=lambda: [Step(run=50)])


@dataclass
class ScenarioRun:
    snapshot: Snapshot
    profile: str
    seed: int
    steps: list[Step]
    last: CycleResult = field(default_factory=CycleResult)


def parse_scenario(data: Any, source: str) -> ScenarioRun:
    if not isinstance(data, dict):
        raise SpecError(source, "a scenario must be a YAML mapping")
    spec = validate(ScenarioSpec, data, source)
    cluster = parse_cluster(spec.cluster, f"{source}: cluster")
    workloads: list[Workload]
    workloads, _ = parse_workloads({"workloads": spec.workloads}, source)
    _check_names(spec.steps, {w.name for w in workloads}, source)
    snap = cluster.snapshot()
    for w in workloads:
        snap.add_workload(w)
    return ScenarioRun(snap, spec.profile, spec.seed, spec.steps)


def _check_names(steps: list[Step], known: set[str], source: str) -> None:
    """A step that completes or expects a workload the scenario does not have is a typo: say so
    here, rather than as a KeyError mid-run or an expectation that can never hold."""
    for k, step in enumerate(steps):
        named = [("complete", step.complete)] if step.complete else []
        ex = step.expect or Expect()
        for kind, names in (("bound", ex.bound), ("pending", ex.pending), ("nodes", ex.nodes)):
            named += [(f"expect.{kind}.{w}", w) for w in names]
        for where, w in named:
            if w not in known:
                raise SpecError(
                    f"{source}: steps[{k}].{where}",
                    f"unknown workload {w!r} (the scenario's: {', '.join(sorted(known))})",
                )


def load_scenario(path: str | Path) -> ScenarioRun:
    return parse_scenario(load_yaml(path), str(path))


def run_scenario(sc: ScenarioRun, on_cycle: Callable[[CycleResult], None] | None = None) -> list[str]:
    """Run the steps; return the expectations that failed (empty when all hold).

    `on_cycle` sees every cycle's result (`phalanx scenario` prints the decisions).
    """
    prof = load_profile(sc.profile)
    rng = np.random.default_rng(sc.seed)
    clock = 0.0
    failures: list[str] = []
    for k, step in enumerate(sc.steps):
        if step.complete:
            sc.snapshot.remove_workload(step.complete)
        if step.run:
            for _ in range(step.run):
                clock += 1.0
                sc.last = run_cycle(sc.snapshot, prof, clock, rng, apply=True)
                if on_cycle is not None:
                    on_cycle(sc.last)
                if not sc.last.binds and not sc.last.evictions:
                    break
        if step.expect:
            failures += _check(sc, step.expect, f"steps[{k}]")
    return failures


def _check(sc: ScenarioRun, ex: Expect, where: str) -> list[str]:
    out = []
    s = sc.snapshot
    for w, n in ex.bound.items():
        got = len(s.workloads[w].bound) if w in s.workloads else 0
        if got != n:
            out.append(f"{where}: {w} has {got} bound task(s), expected {n}")
    for w, text in ex.pending.items():
        p = sc.last.pending_for(w)
        if p is None or text not in p.message:
            out.append(f"{where}: {w} pending message {p.message if p else None!r} lacks {text!r}")
    for w, allowed in ex.nodes.items():
        used = {s.nodes[a.node].name for a in s.workloads[w].bound.values()}
        if not used <= set(allowed):
            out.append(f"{where}: {w} runs on {sorted(used)}, expected within {allowed}")
    return out
