"""What a cycle outputs: Bind, Evict and Pending decisions."""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.core.cluster import MigSlice
from phalanx.core.dra import ClaimAllocation


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


@dataclass(frozen=True, slots=True)
class Pending:
    """A workload left waiting this cycle, with why."""

    workload: str
    summary: str
    reasons: tuple[Reason, ...] = ()
    # tried and did not fit: nothing will change until capacity is released
    unschedulable: bool = False

    @property
    def message(self) -> str:
        detail = "; ".join(str(r) for r in self.reasons)
        return f"{self.summary} ({detail})" if detail else self.summary

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": "pending",
            "workload": self.workload,
            "summary": self.summary,
            "reasons": [{"plugin": r.plugin, "message": r.message, "nodes": r.nodes} for r in self.reasons],
        }


@dataclass(slots=True)
class CycleResult:
    """Everything one cycle decided, in decision order."""

    binds: list[Bind] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)

    def pending_for(self, workload: str) -> Pending | None:
        for p in self.pending:
            if p.workload == workload:
                return p
        return None

    def to_dicts(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = [e.to_dict() for e in self.evictions]
        out += [b.to_dict() for b in self.binds]
        out += [p.to_dict() for p in self.pending]
        return out
