"""DRA objects (resource.k8s.io/v1 shapes) -> the core's DRA model, for both drivers.

The Kubernetes adapter reads them from the API server, the simulator from cluster and
workload YAML; both translate here, so a replay of a DRA cluster runs the same code.

- ResourceSlices are grouped into pools (driver, pool name). Only the newest generation of a
  pool counts, and only when all its slices are there (`resourceSliceCount`), as kube-scheduler
  does; a pool with a device name twice is invalid. Such pools are left out and named.
- Devices get fully qualified attribute and capacity names (an unqualified name is in the
  driver's domain), capacities as thousandths, and a role when the core models them: a GPU or a
  MIG slice of NVIDIA's GPU driver (`type` attribute), an RDMA NIC of a NIC driver. The node's
  `Gpu` and `Nic` objects are then made from them.
- A claim's requests get their DeviceClass's selectors in front of their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from phalanx.core.affinity import NodeSelectorTerm
from phalanx.core.cel import compile_selector, milli
from phalanx.core.dra import (
    GPU_ROLE,
    MIG_ROLE,
    NIC_ROLE,
    Attr,
    CapacityPolicy,
    Claim,
    ClaimConstraint,
    CounterSet,
    CounterUse,
    DeviceRequest,
    DeviceTaint,
    DeviceToleration,
    DraDevice,
    ExactRequest,
)
from phalanx.core.errors import SpecError
from phalanx.core.model import Gpu, Nic
from phalanx.spec.affinity import node_selector_terms

NIC_DRIVERS = ("dra.net", "rdma.nvidia.com", "sriovnetwork.k8snetworkplumbingwg.io")

_MODELS = (
    "GB200",
    "B200",
    "H200",
    "H100",
    "H800",
    "A100",
    "A800",
    "L40S",
    "L40",
    "A10G",
    "A10",
    "L4",
    "T4",
    "V100",
)


def gpu_model(product: str) -> str:
    """`NVIDIA-H100-80GB-HBM3` -> `H100`; unknown products are kept as they are."""
    up = product.upper()
    for m in _MODELS:
        if m in up:
            return m
    return product or "unknown"


NVIDIA = "gpu.nvidia.com"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
_GPU_NAME = re.compile(r"^gpu-(\d+)")


@dataclass
class Devices:
    """What the cluster's ResourceSlices publish, by node, and what is left out."""

    by_node: dict[str, list[DraDevice]] = field(default_factory=dict)
    shared: list[DraDevice] = field(default_factory=list)  # reachable by node selector or from all nodes
    counter_sets: list[CounterSet] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)


def _qualify(driver: str, name: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _attr(raw: Any, where: str) -> Attr:
    if not isinstance(raw, dict) or len(raw) != 1:
        raise SpecError(where, "an attribute has exactly one of string, int, bool, version (or their lists)")
    kind, value = next(iter(raw.items()))
    if kind in ("string", "int", "bool"):
        return Attr(value)
    if kind == "version":
        return Attr(str(value), version=True)
    if kind in ("strings", "ints", "bools", "versions") and isinstance(value, list):
        return Attr(tuple(value), version=kind == "versions")
    raise SpecError(where, f"unknown attribute type {kind!r}")


def _policy(raw: Any, where: str) -> CapacityPolicy:
    rng = raw.get("validRange") or {}
    return CapacityPolicy(
        default=milli(raw["default"], f"{where}.default") if "default" in raw else None,
        valid_values=tuple(milli(v, f"{where}.validValues") for v in raw.get("validValues") or []),
        min=milli(rng["min"], f"{where}.validRange.min") if "min" in rng else None,
        max=milli(rng["max"], f"{where}.validRange.max") if "max" in rng else None,
        step=milli(rng["step"], f"{where}.validRange.step") if "step" in rng else None,
    )


def _role(driver: str, attrs: dict[str, Attr], name: str, nic_drivers: tuple[str, ...]) -> tuple[str, int]:
    if driver == NVIDIA:
        kind = attrs.get(f"{NVIDIA}/type")
        index = attrs.get(f"{NVIDIA}/index")
        m = _GPU_NAME.match(name)
        idx = (
            int(index.value)
            if index is not None and isinstance(index.value, int)
            else int(m.group(1))
            if m
            else -1
        )
        if kind is not None and kind.value == "gpu" and idx >= 0:
            return GPU_ROLE, idx
        if kind is not None and kind.value == "mig" and m:
            return MIG_ROLE, int(m.group(1))
        return "", -1
    if driver in nic_drivers:
        rdma = attrs.get(f"{driver}/rdma")
        if rdma is None or rdma.value is True:
            return NIC_ROLE, -1  # numbered per node, in publication order, below
    return "", -1


def parse_device(
    raw: dict[str, Any], driver: str, pool: str, node: str, nic_drivers: tuple[str, ...], where: str
) -> DraDevice:
    name = str(raw.get("name") or "")
    w = f"{where}: device {name}"
    attrs = {
        _qualify(driver, k): _attr(v, f"{w}: attributes.{k}")
        for k, v in (raw.get("attributes") or {}).items()
    }
    capacity: dict[str, int] = {}
    policies: dict[str, CapacityPolicy] = {}
    for k, v in (raw.get("capacity") or {}).items():
        q = _qualify(driver, k)
        if not isinstance(v, dict) or "value" not in v:
            raise SpecError(f"{w}: capacity.{k}", "needs a value")
        capacity[q] = milli(v["value"], f"{w}: capacity.{k}.value")
        if v.get("requestPolicy"):
            policies[q] = _policy(v["requestPolicy"], f"{w}: capacity.{k}.requestPolicy")
    consumes = tuple(
        CounterUse(
            str(c["counterSet"]),
            {
                ck: milli(cv["value"], f"{w}: consumesCounters")
                for ck, cv in (c.get("counters") or {}).items()
            },
        )
        for c in raw.get("consumesCounters") or []
    )
    taints = tuple(
        DeviceTaint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "NoSchedule")))
        for t in raw.get("taints") or []
        if t.get("effect") != "None"
    )
    role, index = _role(driver, attrs, name, nic_drivers)
    mig = None
    if role == MIG_ROLE:
        profile = attrs.get(f"{NVIDIA}/profile")
        slices = sorted(
            int(k.rsplit("-", 1)[1]) for c in consumes for k in c.counters if k.startswith("memory-slice-")
        )
        if profile is None or not slices:
            role, index = "", -1  # a MIG device without its placement: a plain device to us
        else:
            mig = (str(profile.value), slices[0])
    dev_node = str(raw.get("nodeName") or node)
    selector: tuple[NodeSelectorTerm, ...] = ()
    if raw.get("nodeSelector"):
        selector = node_selector_terms(
            (raw["nodeSelector"] or {}).get("nodeSelectorTerms"), f"{w}: nodeSelector"
        )
    return DraDevice(
        driver,
        pool,
        name,
        attrs,
        capacity,
        consumes,
        bool(raw.get("allowMultipleAllocations")),
        policies,
        taints,
        role,
        index,
        mig,
        dev_node,
        bool(raw.get("allNodes")),
        selector,
    )


def parse_slices(slices: Iterable[dict[str, Any]], nic_drivers: tuple[str, ...]) -> Devices:
    """Complete pools' devices by node; incomplete or invalid pools are left out and named."""
    out = Devices()
    pools: dict[tuple[str, str], list[tuple[dict[str, Any], int]]] = {}
    for s in slices:
        try:
            spec = s.get("spec") or {}
            pool = spec.get("pool") or {}
            key, gen = (
                (str(spec.get("driver", "")), str(pool.get("name", ""))),
                int(pool.get("generation") or 0),
            )
        except Exception as e:  # the API server checks these; a test double or a future field may not
            name = (
                str((s.get("metadata") or {}).get("name", "")) if isinstance(s.get("metadata"), dict) else ""
            )
            out.problems[f"ResourceSlice {name}"] = (
                f"ResourceSlice {name}: cannot be read ({type(e).__name__}: {e}); left out"
            )
            continue
        pools.setdefault(key, []).append((s, gen))
    for (driver, pool), entries in sorted(pools.items()):
        label = f"ResourcePool {driver}/{pool}"
        gen = max(g for _, g in entries)
        current = [s for s, g in entries if g == gen]
        try:
            want = int(((current[0].get("spec") or {}).get("pool") or {}).get("resourceSliceCount") or 1)
            if len(current) < want:
                out.problems[label] = (
                    f"{label}: incomplete, {len(current)} of {want} slices of generation {gen}; left out"
                )
                continue
            devices, counter_sets = _pool(current, driver, pool, nic_drivers)
        except SpecError as e:
            out.problems[label] = f"{label}: {e}; left out"
            continue
        except Exception as e:  # whatever field broke it: the pool is left out and named, never the cycle
            out.problems[label] = f"{label}: cannot be read ({type(e).__name__}: {e}); left out"
            continue
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            out.problems[label] = f"{label}: invalid, a device name appears twice; left out"
            continue
        out.counter_sets += counter_sets
        for d in devices:
            if d.node and not d.all_nodes and not d.node_selector:
                out.by_node.setdefault(d.node, []).append(d)
            else:
                out.shared.append(d)
    for devs in out.by_node.values():  # NICs without an index of their own: numbered per node
        k = 0
        for j, d in enumerate(devs):
            if d.role == NIC_ROLE and d.index < 0:
                devs[j] = _with_index(d, k)
                k += 1
    return out


def _with_index(d: DraDevice, k: int) -> DraDevice:
    return replace(d, index=k)


def _pool(
    slices: list[dict[str, Any]], driver: str, pool: str, nic_drivers: tuple[str, ...]
) -> tuple[list[DraDevice], list[CounterSet]]:
    devices: list[DraDevice] = []
    counter_sets: list[CounterSet] = []
    for s in sorted(slices, key=lambda x: str((x.get("metadata") or {}).get("name", ""))):
        spec = s.get("spec") or {}
        where = f"ResourceSlice {(s.get('metadata') or {}).get('name', '')}"
        node = spec.get("nodeName") or ""
        all_nodes = bool(spec.get("allNodes"))
        selector = spec.get("nodeSelector")
        if not isinstance(node, str):
            raise SpecError(f"{where}: spec.nodeName", f"must be a node's name, got {node!r:.40}")
        if not (node or all_nodes or selector or spec.get("perDeviceNodeSelection")):
            # the API requires one; without it the devices would look reachable from every node
            raise SpecError(
                f"{where}: spec", "names no node (nodeName, allNodes, nodeSelector or perDeviceNodeSelection)"
            )
        for cs in spec.get("sharedCounters") or []:
            counters = {
                k: milli(v["value"], f"{where}: sharedCounters")
                for k, v in (cs.get("counters") or {}).items()
            }
            counter_sets.append(CounterSet(driver, pool, str(cs["name"]), counters))
        for raw in spec.get("devices") or []:
            dev = dict(raw)
            if not spec.get("perDeviceNodeSelection"):
                dev["nodeName"] = node
                dev["allNodes"] = all_nodes
                dev["nodeSelector"] = selector
            devices.append(parse_device(dev, driver, pool, node, nic_drivers, where))
    return devices, counter_sets


def node_devices(devs: list[DraDevice]) -> tuple[tuple[Gpu, ...], tuple[Nic, ...]]:
    """The node's GPUs and NICs, made from its published devices (a GPU with MIG partitions is a MIG GPU)."""
    roots: dict[str, int] = {}

    def root(d: DraDevice) -> int:
        a = d.attribute(PCIE_ROOT)
        return roots.setdefault(str(a.value) if a is not None else f"?{d.name}", len(roots))

    mig_parents = {d.index for d in devs if d.role == MIG_ROLE}
    gpus = []
    for d in sorted((d for d in devs if d.role == GPU_ROLE), key=lambda d: d.index):
        product = d.attribute(f"{NVIDIA}/productName")
        model = gpu_model(str(product.value)) if product is not None else "unknown"
        mem = next((v for k, v in d.capacity.items() if k.rsplit("/", 1)[-1] == "memory"), 0) // 1000 // 2**20
        numa = d.attribute("numa") or d.attribute(f"{d.driver}/numaNode")
        gpus.append(
            Gpu(
                d.index,
                model,
                int(mem),
                int(numa.value) if numa is not None and isinstance(numa.value, int) else 0,
                root(d),
                0,
                d.index in mig_parents,
            )
        )
    nics = tuple(
        Nic(d.index, 0, root(d))
        for d in sorted((d for d in devs if d.role == NIC_ROLE), key=lambda d: d.index)
    )
    return tuple(gpus), nics


# ------------------------------------------------------------------ claims


def _tolerations(raw: Any) -> tuple[DeviceToleration, ...]:
    return tuple(
        DeviceToleration(
            str(t.get("key", "") or ""),
            str(t.get("operator", "Equal") or "Equal"),
            str(t.get("value", "") or ""),
            str(t.get("effect", "") or ""),
        )
        for t in raw or []
    )


def _exact(raw: dict[str, Any], name: str, classes: dict[str, dict[str, Any]], where: str) -> ExactRequest:
    cls_name = str(raw.get("deviceClassName") or "")
    cls = classes.get(cls_name)
    if cls is None:
        raise SpecError(f"{where}: deviceClassName", f"DeviceClass {cls_name!r} does not exist")
    selectors = []
    for src, w in (
        ((cls.get("spec") or {}).get("selectors"), f"DeviceClass {cls_name}"),
        (raw.get("selectors"), where),
    ):
        for sel in src or []:
            expr = str(((sel or {}).get("cel") or {}).get("expression") or "")
            if not expr:
                raise SpecError(w, "a selector needs a CEL expression")
            compile_selector(expr, w)  # a selector that does not compile makes the claim a bad object
            selectors.append(expr)
    mode = str(raw.get("allocationMode") or "ExactCount")
    if mode not in ("ExactCount", "All"):
        raise SpecError(f"{where}: allocationMode", f"must be ExactCount or All, got {mode!r}")
    capacity = {  # names qualify against each device's driver when matched (core.allocator)
        str(k): milli(v, f"{where}: capacity.requests.{k}")
        for k, v in ((raw.get("capacity") or {}).get("requests") or {}).items()
    }
    return ExactRequest(
        name,
        cls_name,
        tuple(selectors),
        mode == "All",
        int(raw.get("count") or 1),
        capacity,
        bool(raw.get("adminAccess")),
        _tolerations(raw.get("tolerations")),
    )


def parse_claim_spec(
    spec: dict[str, Any], key: str, classes: dict[str, dict[str, Any]], shared: bool, where: str
) -> Claim:
    """A ResourceClaim's spec (or a template's) as a core Claim; each request gets its class's selectors."""
    devices = (spec or {}).get("devices") or {}
    requests = []
    for r in devices.get("requests") or []:
        name = str(r.get("name") or "")
        w = f"{where}: request {name}"
        if r.get("exactly"):
            requests.append(DeviceRequest(name, _exact(r["exactly"], name, classes, w)))
        elif r.get("firstAvailable"):
            subs = tuple(
                _exact(s, str(s.get("name") or ""), classes, f"{w}/{s.get('name')}")
                for s in r["firstAvailable"]
            )
            requests.append(DeviceRequest(name, first_available=subs))
        else:
            raise SpecError(w, "needs exactly or firstAvailable")
    constraints = tuple(
        ClaimConstraint(
            tuple(str(x) for x in c.get("requests") or []),
            str(c.get("matchAttribute") or ""),
            str(c.get("distinctAttribute") or ""),
        )
        for c in devices.get("constraints") or []
    )
    for c in constraints:
        if not (c.match_attribute or c.distinct_attribute):
            raise SpecError(f"{where}: constraints", "a constraint needs matchAttribute or distinctAttribute")
    return Claim(key, tuple(requests), constraints, shared)
