"""What a cycle outputs: Bind, Evict and Pending decisions (a Pending names the guards that hold it back)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from phalanx.core.cluster import MigSlice
from phalanx.core.dra import ClaimAllocation

if TYPE_CHECKING:
    from phalanx.core.wake import Wake


@dataclass(frozen=True, slots=True)
class Bind:
    """Place `task` on `node` with these devices (GPU and NIC device indices)."""

    task: str
    workload: str
    node: str
    gpus: tuple[int, ...] = ()
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    mig: MigSlice | None = None
    nics: tuple[int, ...] = ()
    claims: tuple[ClaimAllocation, ...] = ()  # DRA claims allocated with it
    # what serves a fractional GPU request: "mig" (then `mig` is the instance), "mps" or
    # "time-slice"; "" when no backend policy chose (a time-slice share, as always)
    backend: str = ""

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "kind": "bind",
            "task": self.task,
            "workload": self.workload,
            "node": self.node,
        }
        if self.gpus:
            d["gpus"] = list(self.gpus)
            d["gpu_milli"] = self.gpu_milli
            d["gpu_memory_mib"] = self.gpu_memory_mib
        if self.mig is not None:
            d["mig"] = {"profile": self.mig.profile, "start": self.mig.start}
        if self.backend:
            d["backend"] = self.backend
        if self.nics:
            d["nics"] = list(self.nics)
        if self.claims:
            d["claims"] = {
                c.claim: [f"{r.request}={r.driver}/{r.pool}/{r.device}" for r in c.results]
                for c in self.claims
            }
        return d


@dataclass(frozen=True, slots=True)
class Evict:
    """Stop `task` on `node` so that a preemptor, a reclaimer or a consolidation can run."""

    task: str
    workload: str
    node: str
    reason: str
    by: str = ""  # the workload the eviction makes room for (preempt, reclaim, consolidate)
    # GPU-seconds it costs: the task's share of its workload's lost work and restart, as the victim
    # order counts them (what the GPU-hour budgets add up); not part of the decision's digest
    cost: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": "evict",
            "task": self.task,
            "workload": self.workload,
            "node": self.node,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Reason:
    """One plugin's verdict: what blocked the workload and on how many nodes."""

    plugin: str
    message: str
    nodes: int = 0

    def __str__(self) -> str:
        if self.nodes:
            return f"{self.message} on {self.nodes:,} node{'s' if self.nodes != 1 else ''}"
        return self.message


def sim_time(t: float) -> str:
    """A time as the core knows it: seconds on the driver's clock (the adapter says wall-clock times)."""
    return f"t={t:,.0f} s"


# guards that hold back an eviction a waiting workload needs
MIN_RUNTIME = "min_runtime"  # the victim has not run the action's minimum runtime yet
QUANTUM = "quantum"  # time-slicing: the victim's time slice has not ended
NOT_PREEMPTIBLE = "not preemptible"  # never a victim; it ends on its own
TERMINATING = "terminating"  # evicted, still holding its devices until it is gone
DISRUPTION_BUDGET = "disruption budget"  # the eviction was refused (a PodDisruptionBudget; driver-side)
CHECKPOINT = "checkpoint"  # waits for the victim's next checkpoint (the action's checkpoint_window)
REPEAT = "repeat"  # evicted for a workload of the same shape within the action's repeat_window
QUEUE_BUDGET = "queue eviction budget"  # the victim's queue had its evictions of the last hour
CLUSTER_BUDGET = "cluster eviction budget"  # the cluster had its evictions of the last hour
QUEUE_GPU_BUDGET = "queue GPU-hour budget"  # the victim's queue lost its GPU-hours of the last hour
CLUSTER_GPU_BUDGET = "cluster GPU-hour budget"  # the cluster lost its GPU-hours of the last hour
RECLAIM_COST = "reclaim cost"  # the victims would lose more GPU time than the GPUs reclaimed are worth
_BUDGETS = (QUEUE_BUDGET, CLUSTER_BUDGET, QUEUE_GPU_BUDGET, CLUSTER_GPU_BUDGET)


@dataclass(frozen=True, slots=True)
class Hold:
    """A guard that holds back an eviction a waiting workload needs to start, and when it ends.

    `until` is on the cycle's clock (None: no known end). The text says the guard, the victim
    and the time; `when` renders the time (the core's default says seconds, the adapter a UTC time).
    """

    action: str  # preempt, reclaim, or allocate (a victim still terminating)
    guard: str  # one of the guards above
    victim: str  # the workload held (for TERMINATING and DISRUPTION_BUDGET: the pod)
    until: float | None
    limit: float = 0.0  # the guard's length in seconds (min_runtime, quantum)
    detail: str = ""  # about the victim: "priority 100", "queue team-b", the API's refusal

    @property
    def who(self) -> str:
        """The victim, with what matters about it: `default/low-0 (priority 100)`."""
        return (
            f"{self.victim} ({self.detail})"
            if self.detail and self.guard not in (DISRUPTION_BUDGET, RECLAIM_COST)
            else self.victim
        )

    def text(self, when: Callable[[float], str] = sim_time, who: str = "", many: bool = False) -> str:
        """The hold as a sentence; `who` and `many` say several victims held alike at once."""
        who = who or self.who
        end = when(self.until) if self.until is not None else ""
        verb = "reclaimed" if self.action == "reclaim" else "preempted"
        it = "they" if many else "it"
        if self.guard == MIN_RUNTIME:
            return (
                f"{self.action}: min_runtime {self.limit:g} s protects {who} until {end}; "
                f"{it} may be {verb} then"
            )
        if self.guard == QUANTUM:
            return (
                f"{self.action}: the time slice (quantum {self.limit:g} s) protects {who} until {end}; "
                f"{it} may be {verb} then"
            )
        if self.guard == NOT_PREEMPTIBLE:
            ends = f"expected to end around {end}" if end else "no known end (no run-time estimate)"
            return f"{self.action}: {who} {'are' if many else 'is'} not preemptible; {ends}"
        if self.guard == TERMINATING:
            ends = f"grace period until {end}" if end else "evicted, not gone yet"
            return f"waits for {who} to terminate ({ends})"
        if self.guard == CHECKPOINT:
            if many:
                at = f"their checkpoints line up at {end}" if end else "their checkpoints do not line up soon"
            else:
                at = f"next one at {end}" if end else "no checkpoint time known"
            return (
                f"{self.action}: {who} {'are' if many else 'is'} evicted only just after a checkpoint "
                f"(window {self.limit:g} s); {at}"
            )
        if self.guard == REPEAT:
            return (
                f"{self.action}: {who} {'were' if many else 'was'} evicted for a workload of this shape "
                f"less than {self.limit:g} s ago; {'they' if many else 'it'} may be again from {end}"
            )
        if self.guard in _BUDGETS:
            return self._budget_text(who, end, many)
        if self.guard == RECLAIM_COST:
            return (
                f"{self.action}: evicting {who} would lose {self.detail}, more than max_loss_per_gpu "
                f"allows above the queue's deserved quota ({self.limit:g} s of GPU time per GPU); "
                "no known end: waits for room, or for the victims to checkpoint"
            )
        if self.guard == DISRUPTION_BUDGET:
            why = f": {self.detail.rstrip('.')}" if self.detail else ""
            return (
                f"{self.action}: the eviction of {who} was refused{why}; "
                "retried every cycle, no known end (until the budget allows a disruption)"
            )
        return f"{self.action}: {self.guard} holds back {who}" + (f" until {end}" if end else "")

    def _budget_text(self, who: str, end: str, many: bool) -> str:
        gpu = self.guard in (QUEUE_GPU_BUDGET, CLUSTER_GPU_BUDGET)
        kind = "GPU-hour budget" if gpu else "eviction budget"
        rate = f"{self.limit:g} GPU-h lost an hour" if gpu else f"{self.limit:g} an hour"
        if not self.victim:  # no eviction at all until then
            if self.guard in (CLUSTER_BUDGET, CLUSTER_GPU_BUDGET):
                return f"{self.action}: the cluster's {kind} ({rate}) is spent until {end}"
            return f"{self.action}: the {kind}s ({rate} each) of queues {self.detail} are spent until {end}"
        queue = self.guard in (QUEUE_BUDGET, QUEUE_GPU_BUDGET)
        whose = ("their queue's" if many else "its queue's") if queue else "the cluster's"
        verb = "reclaimed" if self.action == "reclaim" else "preempted"
        if not end:  # a GPU-hour budget a victim alone would overrun
            one = "each would" if many else "it would"
            return f"{self.action}: {whose} {kind} ({rate}) holds back {who}: {one} lose more than that alone"
        return f"{self.action}: {whose} {kind} ({rate}) is spent; {who} may be {verb} from {end}"

    def lifted(self, who: str = "", many: bool = False) -> str:
        """What the guard's end allows, as the forecast says it: `when default/low-0 may be preempted`."""
        who = who or self.victim
        if self.guard in (MIN_RUNTIME, QUANTUM):
            return f"when {who} may be {'reclaimed' if self.action == 'reclaim' else 'preempted'}"
        if self.guard == NOT_PREEMPTIBLE:
            return f"when {who} {'end' if many else 'ends'}"
        if self.guard == TERMINATING:
            return f"when {who} {'have' if many else 'has'} terminated"
        if self.guard == CHECKPOINT:
            return f"when {who} {'have' if many else 'has'} just checkpointed"
        if self.guard == REPEAT:
            return f"when {who} may be evicted again for this shape"
        if self.guard == RECLAIM_COST:
            return f"when reclaiming from {who} costs less"
        if self.guard in _BUDGETS:
            return f"when the eviction budget allows evicting {who}" if who else "when the budget frees"
        return f"when the eviction of {who} is allowed"


@dataclass(frozen=True, slots=True)
class Pending:
    """A workload left waiting this cycle, with why (and what holds back the evictions it needs)."""

    workload: str
    summary: str
    reasons: tuple[Reason, ...] = ()
    # tried and did not fit: nothing will change until capacity is released
    unschedulable: bool = False
    holds: tuple[Hold, ...] = ()

    @property
    def message(self) -> str:
        return self.render()

    def render(self, when: Callable[[float], str] = sim_time) -> str:
        detail = "; ".join(str(r) for r in self.reasons)
        text = f"{self.summary} ({detail})" if detail else self.summary
        return "; ".join([text, *holds_text(self.holds, when)])

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "kind": "pending",
            "workload": self.workload,
            "summary": self.summary,
            "reasons": [{"plugin": r.plugin, "message": r.message, "nodes": r.nodes} for r in self.reasons],
        }
        if self.holds:
            d["holds"] = [
                {"action": h.action, "guard": h.guard, "victim": h.victim, "until": h.until}
                for h in self.holds
            ]
        return d


def holds_text(holds: tuple[Hold, ...], when: Callable[[float], str] = sim_time, most: int = 3) -> list[str]:
    """The holds as sentences, victims held alike (same guard, same end) in one; those without a
    known end first, then the latest-ending; at most `most` victims named per sentence."""
    alike: dict[tuple[object, ...], list[Hold]] = {}
    for h in holds:
        alike.setdefault(
            (
                h.action,
                h.guard,
                h.until,
                h.limit,
                h.detail if h.guard in (DISRUPTION_BUDGET, RECLAIM_COST) else "",
            ),
            [],
        ).append(h)
    groups = sorted(alike.values(), key=lambda g: (g[0].until is None, g[0].until or 0.0), reverse=True)
    out = []
    for g in groups:
        names = sorted(h.who for h in g)
        who = ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
        out.append(g[0].text(when, who, many=len(names) > 1))
    return out


@dataclass(frozen=True, slots=True)
class Repartition:
    """An idle MIG GPU cut anew (`actions.repartition`): its instances before and after
    (`profile@start`), and when the new ones are ready (the GPU serves nothing until then)."""

    node: str
    gpu: int  # the device index the node reports
    before: tuple[str, ...]
    after: tuple[str, ...]
    until: float
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": "repartition",
            "node": self.node,
            "gpu": self.gpu,
            "before": list(self.before),
            "after": list(self.after),
            "until": self.until,
            "reason": self.reason,
        }


@dataclass(slots=True)
class CycleResult:
    """Everything one cycle decided, in decision order."""

    binds: list[Bind] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    repartitions: list[Repartition] = field(default_factory=list)
    # when the clock alone may change what the next cycle decides (`phalanx.core.wake`); None: only
    # a change to the snapshot can
    wake: Wake | None = None

    def pending_for(self, workload: str) -> Pending | None:
        for p in self.pending:
            if p.workload == workload:
                return p
        return None

    def to_dicts(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = [e.to_dict() for e in self.evictions]
        out += [b.to_dict() for b in self.binds]
        out += [p.to_dict() for p in self.pending]
        out += [r.to_dict() for r in self.repartitions]
        return out
