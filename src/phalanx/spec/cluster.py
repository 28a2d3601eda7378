"""Cluster specs: explicit nodes, or node groups (shape x count) laid out in racks and spines."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from phalanx.core.errors import SpecError
from phalanx.core.model import Gpu, MigInstance, Nic, Node, Taint
from phalanx.core.queues import QueueTree
from phalanx.core.snapshot import Snapshot
from phalanx.spec.common import at, load_yaml, validate
from phalanx.spec.dra import NIC_DRIVERS, Devices, node_devices, parse_slices
from phalanx.spec.quantity import cpu_milli, memory_mib, size_bytes
from phalanx.spec.queues import QueueSpec, build_queues
from phalanx.spec.workloads import DraContext


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MigInstanceSpec(_Strict):
    profile: str
    start: int


class GpuSpec(_Strict):
    index: int | None = None
    model: str
    memory: int | str
    numa: int = 0
    pcie_switch: int = 0
    nvlink_group: int = 0
    mig: bool = False
    mig_instances: list[MigInstanceSpec] = Field(default_factory=list)


class GpuGroupSpec(_Strict):
    """`count` identical GPUs; `per_pcie_switch` GPUs share a switch (0: all on one)."""

    count: int = Field(ge=0)
    model: str
    memory: int | str
    per_pcie_switch: int = Field(default=0, ge=0)
    numa_nodes: int = Field(default=1, ge=1)
    nvlink_groups: int = Field(default=1, ge=1)
    mig: bool | list[int] = False


class NicSpec(_Strict):
    index: int | None = None
    numa: int = 0
    pcie_switch: int = 0
    bandwidth_gbps: float = 100.0


class NicGroupSpec(_Strict):
    """`count` NICs spread evenly over the node's PCIe switches."""

    count: int = Field(ge=0)
    bandwidth_gbps: float = 100.0


class TaintSpec(_Strict):
    key: str
    value: str = ""
    effect: str = "NoSchedule"


class NodeBody(_Strict):
    cpu: int | float | str
    memory: int | float | str
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    topology: dict[str, str] = Field(default_factory=dict)
    gpus: GpuGroupSpec | list[GpuSpec] | None = None
    nics: NicGroupSpec | list[NicSpec] | None = None
    datasets: dict[str, int | str] = Field(default_factory=dict)
    # ResourceSlice specs (resource.k8s.io/v1 shape) each node publishes; nodeName and pool are the node's
    dra_slices: list[dict[str, Any]] = Field(default_factory=list)
    # the kubelet's Topology Manager policy (core.numa) and the cores pods may have per NUMA node
    numa_policy: Literal["none", "best-effort", "restricted", "single-numa-node"] = "none"
    numa_cpus: list[int | float | str] = Field(default_factory=list)


class NodeSpec(NodeBody):
    name: str


class NodeGroupSpec(NodeBody):
    """`count` nodes named `{name}-{i}`; `layout` gives nodes per domain, e.g. {rack: 4, spine: 32}."""

    name: str
    count: int = Field(ge=1)
    layout: dict[str, int] = Field(default_factory=dict)


class ClusterSpec(_Strict):
    topology_levels: list[str] = Field(default_factory=list)
    datasets: dict[str, int | str] = Field(default_factory=dict)
    nodes: list[NodeSpec] = Field(default_factory=list)
    node_groups: list[NodeGroupSpec] = Field(default_factory=list)
    queues: list[QueueSpec] = Field(default_factory=list)
    gpu_weights: dict[str, float] = Field(default_factory=dict)
    # DeviceClasses (resource.k8s.io/v1 objects, or {name, selectors}) the workloads' claims name
    device_classes: list[dict[str, Any]] = Field(default_factory=list)


@dataclass(frozen=True)
class ClusterDef:
    """A parsed cluster: nodes, topology levels, dataset sizes and (optionally) the queue tree."""

    nodes: list[Node]
    levels: list[str]
    datasets: dict[str, int]
    queues: QueueTree | None = None
    device_classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    dra: Devices = field(default_factory=Devices)

    def dra_context(self) -> DraContext:
        devices = [d for n in self.nodes for d in n.dra] + list(self.dra.shared)
        return DraContext(self.device_classes, devices)

    def snapshot(self) -> Snapshot:
        local = {(d.driver, d.pool) for n in self.nodes for d in n.dra}
        return Snapshot(
            self.nodes,
            topology_levels=self.levels,
            datasets=self.datasets,
            queues=self.queues,
            dra_shared=self.dra.shared,
            dra_counter_sets=[cs for cs in self.dra.counter_sets if (cs.driver, cs.pool) not in local],
        )


def _gpus(
    spec: GpuGroupSpec | list[GpuSpec] | None, where: str
) -> tuple[list[Gpu], dict[int, tuple[MigInstance, ...]]]:
    if spec is None:
        return [], {}
    out: list[Gpu] = []
    if isinstance(spec, list):
        mig: dict[int, tuple[MigInstance, ...]] = {}
        for k, g in enumerate(spec):
            w = f"{where}[{k}]"
            idx = g.index if g.index is not None else k
            mem = memory_mib(g.memory, f"{w}.memory")
            with at(w):
                out.append(Gpu(idx, g.model, mem, g.numa, g.pcie_switch, g.nvlink_group, g.mig))
            if g.mig_instances:
                mig[idx] = tuple(MigInstance(m.profile, m.start) for m in g.mig_instances)
        return out, mig
    mem = memory_mib(spec.memory, f"{where}.memory")
    per = spec.per_pcie_switch or max(spec.count, 1)
    mig_set = set(range(spec.count)) if spec.mig is True else set(spec.mig or [])
    n = max(spec.count, 1)
    for j in range(spec.count):
        with at(f"{where}[{j}]"):
            out.append(
                Gpu(
                    j,
                    spec.model,
                    mem,
                    numa=j * spec.numa_nodes // n,
                    pcie_switch=j // per,
                    nvlink_group=j * spec.nvlink_groups // n,
                    mig_enabled=j in mig_set,
                )
            )
    return out, {}


def _nics(spec: NicGroupSpec | list[NicSpec] | None, gpus: list[Gpu], where: str) -> list[Nic]:
    if spec is None:
        return []
    out: list[Nic] = []
    if isinstance(spec, list):
        for k, n in enumerate(spec):
            with at(f"{where}[{k}]"):
                out.append(
                    Nic(n.index if n.index is not None else k, n.numa, n.pcie_switch, n.bandwidth_gbps)
                )
        return out
    switches = sorted({g.pcie_switch for g in gpus}) or [0]
    numa_of = {g.pcie_switch: g.numa for g in gpus}
    for k in range(spec.count):
        sw = switches[k * len(switches) // max(spec.count, 1)]
        with at(f"{where}[{k}]"):
            out.append(Nic(k, numa_of.get(sw, 0), sw, spec.bandwidth_gbps))
    return out


def _node(name: str, body: NodeBody, topology: dict[str, str], where: str) -> Node:
    gpus, mig = _gpus(body.gpus, f"{where}.gpus")
    nics = _nics(body.nics, gpus, f"{where}.nics")
    datasets = {k: size_bytes(v, f"{where}.datasets.{k}") for k, v in body.datasets.items()}
    cpu = cpu_milli(body.cpu, f"{where}.cpu")
    mem = memory_mib(body.memory, f"{where}.memory")
    with at(where):
        return Node(
            name=name,
            cpu_milli=cpu,
            memory_mib=mem,
            gpus=tuple(gpus),
            nics=tuple(nics),
            labels=dict(body.labels),
            taints=tuple(Taint(t.key, t.value, t.effect) for t in body.taints),
            topology=topology,
            datasets=datasets,
            mig_instances=mig,
            numa_policy=body.numa_policy,
            numa_cpu_milli=tuple(
                cpu_milli(c, f"{where}.numa_cpus[{k}]") for k, c in enumerate(body.numa_cpus)
            ),
        )


def build_cluster(spec: ClusterSpec, source: str = "cluster") -> ClusterDef:
    nodes: list[Node] = []
    bodies: dict[str, NodeBody] = {}
    for k, n in enumerate(spec.nodes):
        nodes.append(_node(n.name, n, dict(n.topology), f"{source}: nodes[{k}]"))
        bodies[n.name] = n
    for k, g in enumerate(spec.node_groups):
        where = f"{source}: node_groups[{k}]"
        for level in g.layout:
            if level not in spec.topology_levels:
                raise SpecError(
                    f"{where}.layout.{level}", f"not one of topology_levels {spec.topology_levels}"
                )
        width = max(2, math.ceil(math.log10(g.count + 1)))
        for i in range(g.count):
            topo = dict(g.topology)
            for level, size in g.layout.items():
                if size < 1:
                    raise SpecError(f"{where}.layout.{level}", f"nodes per {level} must be >= 1, got {size}")
                topo[level] = f"{g.name}-{level}{i // size}"
            nodes.append(_node(f"{g.name}-{i:0{width}d}", g, topo, f"{where}[{i}]"))
            bodies[nodes[-1].name] = g
    datasets = {k: size_bytes(v, f"{source}: datasets.{k}") for k, v in spec.datasets.items()}
    queues = build_queues(list(spec.queues), spec.gpu_weights, f"{source}: ") if spec.queues else None
    devices = _dra(nodes, bodies, source)
    nodes = [_with_dra(n, devices) if n.name in devices.by_node else n for n in nodes]
    classes = {}
    for k, c in enumerate(spec.device_classes):
        name = str((c.get("metadata") or {}).get("name") or c.get("name") or "")
        if not name:
            raise SpecError(f"{source}: device_classes[{k}]", "a DeviceClass needs a name")
        classes[name] = (
            c
            if "spec" in c
            else {"metadata": {"name": name}, "spec": {"selectors": c.get("selectors") or []}}
        )
    return ClusterDef(nodes, list(spec.topology_levels), datasets, queues, classes, devices)


def _dra(nodes: list[Node], bodies: dict[str, NodeBody], source: str) -> Devices:
    """Each node's `dra_slices` as ResourceSlices of its own pool (the same translation the adapter uses)."""
    slices = []
    for n in nodes:
        body = bodies.get(n.name)
        specs = body.dra_slices if body is not None else []
        per_driver: dict[str, int] = {}
        for raw in specs:
            per_driver[str(raw.get("driver", ""))] = per_driver.get(str(raw.get("driver", "")), 0) + 1
        for k, raw in enumerate(specs):
            spec = dict(raw)
            spec.setdefault("nodeName", n.name)
            count = per_driver[str(raw.get("driver", ""))]
            spec.setdefault("pool", {"name": n.name, "generation": 1, "resourceSliceCount": count})
            slices.append({"metadata": {"name": f"{n.name}-{k}"}, "spec": spec})
    devices = parse_slices(slices, NIC_DRIVERS)
    if devices.problems:
        raise SpecError(f"{source}: dra_slices", next(iter(devices.problems.values())))
    return devices


def _with_dra(n: Node, devices: Devices) -> Node:
    devs = devices.by_node[n.name]
    pools = {(d.driver, d.pool) for d in devs}
    gpus, nics = node_devices(devs)
    return replace(
        n,
        gpus=gpus or n.gpus,
        nics=nics or n.nics,
        dra=tuple(devs),
        counter_sets=tuple(cs for cs in devices.counter_sets if (cs.driver, cs.pool) in pools),
    )


def parse_cluster(data: Any, source: str = "cluster") -> ClusterDef:
    if not isinstance(data, dict):
        raise SpecError(source, "a cluster spec must be a YAML mapping with `nodes` and/or `node_groups`")
    spec = validate(ClusterSpec, data, source)
    if not spec.nodes and not spec.node_groups:
        raise SpecError(source, "the cluster has no nodes (give `nodes` or `node_groups`)")
    return build_cluster(spec, source)


def load_cluster(path: str | Path) -> ClusterDef:
    return parse_cluster(load_yaml(path), str(path))
