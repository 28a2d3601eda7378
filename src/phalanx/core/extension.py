"""Typed extension points. Each says how the answers of several plugins combine.

- WorkloadOrder: lexicographic, in profile order; ties end with (creation time, name).
- CycleHooks, ChangeForecast (optional on an order): state across cycles; keys that move by themselves.
- NodeFilter: intersection (a node survives only if every filter keeps it).
- NodeScorer: weighted sum of scores over the candidate nodes.
- ClassKeyed (optional on a filter or scorer): what its answer depends on besides node state.
- NodeBound (optional on a filter): the nodes it refuses a task outright.
Optional traits are declared by subclassing their Protocol and checked when a profile is
compiled (`phalanx.core.traits`); the core reads them from `ProfileTraits`, never by probing.
- DeviceSelector: the profile names one; the default picks topology-aware / best-fit devices.
- GangPlanner: the profile names one; it proposes node sets (topology domains) to try in order.
- AdmissionCheck: first rejection wins (quota limits, borrowing, lending, non-preemptible in quota).
- QueueOrder: the profile names one; queues take turns by its key, lowest first.
- VictimOrder: the profile names one; eviction candidates are tried in its order.
- Action: run in profile order.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from phalanx.core.cluster import BoolArray, DeviceAssignment
from phalanx.core.decisions import Reason
from phalanx.core.feasibility import Candidates
from phalanx.core.model import Task, TaskRequest
from phalanx.core.snapshot import WorkloadEntry


@functools.lru_cache(maxsize=64)
def keep_all(n: int) -> BoolArray:
    """A filter's "keep every one of n candidates": one read-only array per size, shared, not a new
    one per placement (filters that mostly keep all answer this on the hot path)."""
    out = np.ones(n, dtype=np.bool_)
    out.flags.writeable = False
    return out


if TYPE_CHECKING:
    from phalanx.core.session import Session

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PlacementContext:
    """One task being placed: its effective request and the nodes that can host it."""

    session: Session
    task: Task
    request: TaskRequest
    candidates: Candidates


class WorkloadOrder(Protocol):
    """A sort key for waiting work; what the key depends on, declared, lets the core memoise it.

    `static`: the key depends only on the workload (kept in the entry across cycles).
    `cycle_static`: it holds for one cycle (attained service, run time move between cycles).
    `natural`: the order is the snapshot's own (priority, age, name), kept sorted for free.
    An optional `keyed_by_attained` (true): the key depends only on the workload and its attained
    service, so a waiting workload's key is kept across cycles while its attained service stays.
    """

    name: str

    @property
    def static(self) -> bool: ...

    @property
    def cycle_static(self) -> bool: ...

    @property
    def natural(self) -> bool: ...

    def key(self, session: Session, entry: WorkloadEntry) -> tuple[float | int | str, ...]: ...


class CycleHooks(Protocol):
    """An order that keeps state across cycles (LAS's per-level lists): told when a re-plan
    starts and ends. Declared by subclassing; `phalanx.core.traits` checks the claim."""

    def begin_cycle(self, entries: list[WorkloadEntry]) -> None: ...

    def end_cycle(self, entries: list[WorkloadEntry], running: set[str]) -> None: ...


class ChangeForecast(Protocol):
    """An order whose key of a running workload changes by itself (LAS crossing a threshold):
    says when, so that the replay runs a cycle then. Declared by subclassing."""

    def next_change(self, entry: WorkloadEntry, now: float) -> float | None: ...


class NodeFilter(Protocol):
    name: str

    def keep(self, ctx: PlacementContext) -> BoolArray:
        """Mask over `ctx.candidates` of nodes to keep."""
        ...

    def reason(self) -> str: ...


class NodeScorer(Protocol):
    name: str

    def score(self, ctx: PlacementContext) -> FloatArray:
        """One score per candidate node; higher is better."""
        ...


class _ScoresZero:
    """The `class_key` of a scorer that gives 0 on every node for this task (it is not called then)."""

    def __repr__(self) -> str:
        return "SCORES_ZERO"


SCORES_ZERO = _ScoresZero()


class ClassKeyed(Protocol):
    """A filter or scorer whose answer on a node depends only on that node's state and a key.

    `class_key` returns a hashable value such that two tasks with the same effective request
    and the same key get the same verdict (or score) on a node whose state did not change; or
    None when the answer depends on more (other nodes, the task's own placed gang members).
    Tasks alike then share one feasibility and scoring pass (`phalanx.core.classes`); a plugin
    without this method makes every placement take the full pass. A stateless scorer that gives 0
    on every node for this task may return `SCORES_ZERO`: the class pass then does not call it
    (adding 0 changes no comparison).
    """

    def class_key(self, session: Session, task: Task, request: TaskRequest) -> Hashable | None: ...


class NodeBound(Protocol):
    """A filter that rules out whole nodes for a task whatever they have free.

    `excluded` returns the nodes (array positions) the filter's `keep` would refuse the task on
    this cycle, or None when it refuses none outright; the same for tasks of one workload with
    one request object (consolidate asks once per such group). Bounds on free capacity
    (`phalanx.actions.gang.upper_bound` with `filtered`) leave those nodes out, so that a what-if
    does not try a placement the filter is bound to refuse.
    """

    def excluded(self, session: Session, task: Task) -> BoolArray | None: ...


class DeviceSelector(Protocol):
    name: str

    def select(self, ctx: PlacementContext, k: int) -> DeviceAssignment | None:
        """Devices for candidate `k` (a position in `ctx.candidates`), or None if it cannot host the task."""
        ...


class GangPlanner(Protocol):
    name: str

    def domains(self, session: Session, entry: WorkloadEntry, tasks: list[Task]) -> Iterator[Domain]:
        """Node sets to try, best first. Stop when a gang fits in one."""
        ...


@dataclass(frozen=True, slots=True)
class Domain:
    """A set of nodes to place a gang in; `mask` None means the whole cluster.

    `then_cluster`: the planner tries the whole cluster after this domain (the gang's topology
    is preferred, not required), so a failed try here need not say why: the whole cluster's
    failed try is the one its Pending reason tells.
    """

    level: str
    label: str
    mask: BoolArray | None
    required: bool = False
    then_cluster: bool = False


class AdmissionCheck(Protocol):
    name: str

    def admit(self, session: Session, entry: WorkloadEntry, tasks: list[Task]) -> Reason | None:
        """None to admit the gang `tasks` of `entry`, or why not."""
        ...


class QueueOrder(Protocol):
    name: str

    def queue_key(self, session: Session, queue: str) -> tuple[float | int | str, ...]: ...


class Action(Protocol):
    name: str

    def execute(self, session: Session) -> None: ...
