"""Dynamic Resource Allocation in the core: devices as ResourceSlices publish them, and claims.

A `DraDevice` is one published device: driver, pool, name, typed attributes, capacities,
counters it consumes from a shared counter set (partitionable devices), whether it may be
allocated to several claims at once (consumable capacity), taints, and where it is
reachable (one node, a node selector, or every node). Devices that are GPUs, MIG slices or
RDMA NICs also name the core device they are (`role` + `index`): a GPU published by a DRA
driver is a `Gpu` of its node like any other, so FGD, bin-packing and topology see it; the
DRA side only adds which published device, which claim, which share.

A `Claim` holds requests (`exactly`, or `firstAvailable` subrequests) and constraints
(`matchAttribute`, `distinctAttribute`). `phalanx.core.allocator` finds devices for a task's
claims on one node, as the Kubernetes structured allocator does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx.core.affinity import NodeSelectorTerm
from phalanx.core.errors import SpecError

GPU_ROLE, MIG_ROLE, NIC_ROLE = "gpu", "mig", "nic"
RESULTS_MAX = 32  # devices per claim (resourceapi.AllocationResultsMaxSize)


@dataclass(frozen=True, slots=True)
class Attr:
    value: str | int | bool | tuple[str | int | bool, ...]  # a tuple for the list types (strings, ints...)
    version: bool = False  # a semantic version (compared as one by the CEL version functions)


@dataclass(frozen=True, slots=True)
class CapacityPolicy:
    """How much of a consumable capacity one allocation takes (resource.k8s.io CapacityRequestPolicy)."""

    default: int | None = None  # thousandths of the unit
    valid_values: tuple[int, ...] = ()
    min: int | None = None
    max: int | None = None
    step: int | None = None

    def amount(self, asked: int | None) -> int | None:
        """The amount actually taken for `asked` (None: not asked), or None if no valid amount fits it."""
        want = self.default if asked is None else asked
        if want is None:
            return None
        if self.valid_values:
            fits = [v for v in sorted(self.valid_values) if v >= want]
            return fits[0] if fits else None
        lo = self.min or 0
        want = max(want, lo)
        if self.step:
            want = lo + -(-(want - lo) // self.step) * self.step
        if self.max is not None and want > self.max:
            return None
        return want


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, t: DeviceTaint) -> bool:
        if self.effect and self.effect != t.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == t.key
        return self.key == t.key and self.value == t.value


@dataclass(frozen=True, slots=True)
class CounterUse:
    counter_set: str  # name of a counter set of the same pool
    counters: Mapping[str, int]  # thousandths


@dataclass(frozen=True, slots=True)
class DraDevice:
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, Attr] = field(default_factory=dict)  # fully qualified names
    capacity: Mapping[str, int] = field(default_factory=dict)  # fully qualified, thousandths
    consumes: tuple[CounterUse, ...] = ()
    multi: bool = False  # allowMultipleAllocations
    policies: Mapping[str, CapacityPolicy] = field(default_factory=dict)
    taints: tuple[DeviceTaint, ...] = ()
    role: str = ""  # gpu, mig, nic, or "" for a device the core does not model
    index: int = -1  # the GPU or NIC index on its node (gpu, mig, nic)
    mig: tuple[str, int] | None = None  # (profile, start slot) of a MIG device
    node: str = ""  # the node it belongs to ("" when reachable by selector or from every node)
    all_nodes: bool = False
    node_selector: tuple[NodeSelectorTerm, ...] = ()

    def __post_init__(self) -> None:
        if not (self.driver and self.pool and self.name):
            raise SpecError("device", "a device needs a driver, a pool and a name")
        if self.role and self.role not in (GPU_ROLE, MIG_ROLE, NIC_ROLE):
            raise SpecError(f"device {self.name}", f"unknown role {self.role!r}")
        if self.role == MIG_ROLE and self.mig is None:
            raise SpecError(f"device {self.name}", "a MIG device needs its profile and start slot")

    @property
    def id(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)

    def attribute(self, qualified: str) -> Attr | None:
        """By fully qualified name; an unqualified one in the driver's own domain is found too."""
        a = self.attributes.get(qualified)
        if a is None and "/" not in qualified:
            a = self.attributes.get(f"{self.driver}/{qualified}")
        return a

    def cel_view(self) -> dict[str, Any]:
        """`device` as a CEL selector sees it: attributes and capacity by domain, then name."""
        attrs: dict[str, dict[str, Any]] = {}
        for k, a in self.attributes.items():
            dom, _, nm = k.rpartition("/")
            attrs.setdefault(dom or self.driver, {})[nm] = (
                list(a.value) if isinstance(a.value, tuple) else a.value
            )
        caps: dict[str, dict[str, int]] = {}
        for k, v in self.capacity.items():
            dom, _, nm = k.rpartition("/")
            caps.setdefault(dom or self.driver, {})[nm] = v
        return {
            "driver": self.driver,
            "attributes": attrs,
            "capacity": caps,
            "allowMultipleAllocations": self.multi,
        }


@dataclass(frozen=True, slots=True)
class CounterSet:
    driver: str
    pool: str
    name: str
    counters: Mapping[str, int]  # thousandths

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


@dataclass(frozen=True, slots=True)
class ExactRequest:
    """One way to satisfy a request: a device class, selectors, how many, how much capacity."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()  # CEL; the class's selectors first
    all: bool = False  # allocationMode All
    count: int = 1
    capacity: Mapping[str, int] = field(default_factory=dict)  # fully qualified, thousandths
    admin_access: bool = False
    tolerations: tuple[DeviceToleration, ...] = ()

    def __post_init__(self) -> None:
        if self.count < 1 and not self.all:
            raise SpecError(f"request {self.name}", f"count must be >= 1, got {self.count}")


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    name: str
    exact: ExactRequest | None = None
    first_available: tuple[ExactRequest, ...] = ()

    def __post_init__(self) -> None:
        if (self.exact is None) == (not self.first_available):
            raise SpecError(f"request {self.name}", "needs exactly one of exactly or firstAvailable")

    def options(self) -> tuple[tuple[str, ExactRequest], ...]:
        """(result name, subrequest) in order: `req` alone, or `req/sub` for each subrequest."""
        if self.exact is not None:
            return ((self.name, self.exact),)
        return tuple((f"{self.name}/{s.name}", s) for s in self.first_available)


@dataclass(frozen=True, slots=True)
class ClaimConstraint:
    requests: tuple[str, ...] = ()  # empty: every request of the claim
    match_attribute: str = ""
    distinct_attribute: str = ""

    def applies(self, request: str) -> bool:
        if not self.requests:
            return True
        return request in self.requests or request.split("/", 1)[0] in self.requests


@dataclass(frozen=True, slots=True)
class Claim:
    key: str  # namespace/name
    requests: tuple[DeviceRequest, ...]
    constraints: tuple[ClaimConstraint, ...] = ()
    shared: bool = False  # a ResourceClaim named by several pods (allocated once, for all of them)


@dataclass(frozen=True, slots=True)
class DeviceResult:
    request: str  # `req` or `req/sub`
    driver: str
    pool: str
    device: str
    consumed: Mapping[str, int] = field(default_factory=dict)  # thousandths, for shared devices
    share_id: str = ""
    admin_access: bool = False

    @property
    def id(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    claim: str
    node: str  # where its devices are ("" if they are reachable from every node)
    results: tuple[DeviceResult, ...]
