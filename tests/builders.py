"""Fluent builders and a scenario runner, after kube-scheduler's st.MakePod() and Kueue's Make*()."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import numpy as np
import yaml

from phalanx.core.affinity import NodeSelectorTerm
from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import Bind, CycleResult, Pending
from phalanx.core.model import (
    Gpu,
    GpuRequest,
    Nic,
    Node,
    PodSet,
    Taint,
    TaskRequest,
    Toleration,
    TopologyConstraint,
    Workload,
)
from phalanx.core.profile import Profile
from phalanx.core.queues import Queue, QueueTree, ResourceQuota
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import compile_profile, load_profile
from phalanx.spec.quantity import memory_mib


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._cpu = 64_000
        self._mem = 256 * 1024
        self._gpus: list[Gpu] = []
        self._nics: list[Nic] = []
        self._labels: dict[str, str] = {}
        self._taints: list[Taint] = []
        self._topology: dict[str, str] = {}
        self._datasets: dict[str, int] = {}

    def cpu(self, cores: float) -> NodeBuilder:
        self._cpu = round(cores * 1000)
        return self

    def memory(self, mem: str | int) -> NodeBuilder:
        self._mem = memory_mib(mem, "memory")
        return self

    def gpus(
        self,
        count: int,
        model: str = "H100",
        memory: str | int = "80Gi",
        per_pcie_switch: int = 0,
        nvlink_groups: int = 1,
        mig: bool = False,
    ) -> NodeBuilder:
        mem = memory_mib(memory, "gpu memory")
        per = per_pcie_switch or count
        self._gpus = [
            Gpu(
                j,
                model,
                mem,
                numa=j * 2 // max(count, 1),
                pcie_switch=j // per,
                nvlink_group=j * nvlink_groups // max(count, 1),
                mig_enabled=mig,
            )
            for j in range(count)
        ]
        return self

    def nics(self, count: int, gbps: float = 400.0) -> NodeBuilder:
        switches = sorted({g.pcie_switch for g in self._gpus}) or [0]
        self._nics = [Nic(k, 0, switches[k * len(switches) // count], gbps) for k in range(count)]
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self._labels[key] = value
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> NodeBuilder:
        self._taints.append(Taint(key, value, effect))
        return self

    def rack(self, rack: str, spine: str = "s0") -> NodeBuilder:
        self._topology.update(rack=rack, spine=spine)
        return self

    def dataset(self, name: str, size: int) -> NodeBuilder:
        self._datasets[name] = size
        return self

    def build(self) -> Node:
        return Node(
            self._name,
            self._cpu,
            self._mem,
            tuple(self._gpus),
            tuple(self._nics),
            dict(self._labels),
            tuple(self._taints),
            dict(self._topology),
            dict(self._datasets),
        )


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


class WorkloadBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._podsets: list[PodSet] = []
        self._kw: dict[str, Any] = {}

    def podset(
        self,
        name: str,
        count: int = 1,
        *,
        cpu: float = 1,
        memory: str | int = "1Gi",
        gpu: int = 0,
        fraction: float | None = None,
        gpu_memory: int | None = None,
        devices: int = 1,
        mig: str | None = None,
        models: str = "",
        nics: int = 0,
        same_pcie: bool = False,
        selector: dict[str, str] | None = None,
        tolerations: tuple[Toleration, ...] = (),
        dataset: str = "",
        affinity: tuple[NodeSelectorTerm, ...] = (),
    ) -> WorkloadBuilder:
        if fraction is not None:
            g = GpuRequest.fraction(fraction, devices)
        elif gpu_memory is not None:
            g = GpuRequest.memory(gpu_memory, devices)
        elif mig is not None:
            g = GpuRequest.mig(mig)
        else:
            g = GpuRequest.whole(gpu) if gpu else GpuRequest.none()
        req = TaskRequest(
            round(cpu * 1000),
            memory_mib(memory, "memory"),
            g,
            frozenset(m for m in models.split("|") if m),
            nics,
            same_pcie,
            dict(selector or {}),
            tolerations,
            dataset,
            affinity,
        )
        self._podsets.append(PodSet(name, count, req))
        return self

    def min_available(self, n: int) -> WorkloadBuilder:
        self._kw["min_available"] = n
        return self

    def queue(self, q: str) -> WorkloadBuilder:
        self._kw["queue"] = q
        return self

    def priority(self, p: int) -> WorkloadBuilder:
        self._kw["priority"] = p
        return self

    def checkpoints(self, every_s: float) -> WorkloadBuilder:
        self._kw["checkpoint_interval"] = every_s
        return self

    def created(self, t: float) -> WorkloadBuilder:
        self._kw["creation_time"] = t
        return self

    def runtime(self, seconds: float) -> WorkloadBuilder:
        self._kw["estimated_runtime"] = seconds
        return self

    def preemptible(self, flag: bool) -> WorkloadBuilder:
        self._kw["preemptible"] = flag
        return self

    def topology(self, level: str, required: bool = False) -> WorkloadBuilder:
        self._kw["topology"] = TopologyConstraint(level, required)
        return self

    def build(self) -> Workload:
        return Workload(self._name, tuple(self._podsets), **self._kw)


def make_workload(name: str) -> WorkloadBuilder:
    return WorkloadBuilder(name)


@dataclass
class Scenario:
    """A cluster, workloads and a profile; run cycles and inspect the outcome."""

    nodes: list[Node]
    workloads: list[Workload] = field(default_factory=list)
    profile: str | Profile = "phalanx"
    seed: int = 0
    topology_levels: tuple[str, ...] = ("spine", "rack")
    datasets: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.snapshot = Snapshot(
            self.nodes, self.workloads, topology_levels=self.topology_levels, datasets=self.datasets
        )
        self.prof = load_profile(self.profile) if isinstance(self.profile, str) else self.profile
        self.rng = np.random.default_rng(self.seed)
        self.clock = 0.0
        self.history: list[CycleResult] = []

    def cycle(self) -> CycleResult:
        self.clock += 1.0
        result = run_cycle(self.snapshot, self.prof, self.clock, self.rng)
        self.snapshot.apply(result, self.clock)
        self.snapshot.cluster.check_invariants()
        self.history.append(result)
        return result

    def run(self, max_cycles: int = 50) -> CycleResult:
        """Cycle until a cycle changes nothing; return the last result."""
        result = CycleResult()
        for _ in range(max_cycles):
            result = self.cycle()
            if not result.binds and not result.evictions:
                break
        return result

    def complete(self, workload: str) -> None:
        self.snapshot.remove_workload(workload)

    def add(self, workload: Workload) -> None:
        self.snapshot.add_workload(workload)

    def bound(self, workload: str) -> int:
        return len(self.snapshot.workloads[workload].bound)

    def binds(self) -> list[Bind]:
        return [self.snapshot.bind_of(a) for a in self.snapshot.allocations.values()]

    def bind_of(self, task: str) -> Bind:
        return self.snapshot.bind_of(self.snapshot.allocations[task])

    def pending(self, workload: str) -> Pending | None:
        return self.history[-1].pending_for(workload) if self.history else None


def dgx(name: str, rack: str = "r0", spine: str = "s0") -> Node:
    """A DGX-like node: 8 H100, 4 NICs, 2 GPUs and 1 NIC per PCIe switch."""
    return make_node(name).cpu(112).memory("2Ti").gpus(8, per_pcie_switch=2).nics(4).rack(rack, spine).build()


__all__ = ["Scenario", "dgx", "make_node", "make_workload", "replace"]


def reclaiming(args: dict[str, Any]) -> Profile:
    """allocate + reclaim with these arguments, quota admission, fair-share queue order."""
    return compile_profile(
        {
            "name": "r",
            "tie_break": "name",
            "actions": [{"name": "allocate"}, {"name": "reclaim", "args": args}],
            "order": [{"name": "priority"}],
            "admission": [{"name": "quota"}],
            "queue_order": {"name": "fairshare"},
        }
    )


def two_queues(gpus: int, profile: Profile) -> Scenario:
    """One node of `gpus` GPUs, queues a and b deserving half of them each."""
    half = {"gpu": ResourceQuota(gpus * 1000 // 2)}
    sc = Scenario([make_node("n").cpu(64).memory("256Gi").gpus(gpus).build()], [], profile=profile)
    sc.snapshot = Snapshot(
        sc.nodes, queues=QueueTree([Queue("a", quotas=dict(half)), Queue("b", quotas=dict(half))])
    )
    return sc


def default_profile_data() -> dict[str, Any]:
    """The built-in default profile (`phalanx-queues`) as YAML data, for a test to change one knob."""
    text = (resources.files("phalanx.profiles") / "phalanx-queues.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def time_slicing_data() -> dict[str, Any]:
    """The default as it was before restarts were counted (issue 40): LAS time-slicing after a 4 h
    quantum, the reservation at once, no reclaim hysteresis."""
    data = default_profile_data()
    data["name"] = "phalanx-queues+time-slicing"
    for a in data["actions"]:
        if a["name"] == "preempt":
            a["args"].update(by="order", quantum=14400)
        for key in ("min_wait", "margin"):
            a.get("args", {}).pop(key, None)
    return data
