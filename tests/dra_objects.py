"""Builders of DRA devices and claims for the core tests, shaped as the drivers publish them.

GPUs as NVIDIA's GPU DRA driver (`gpu.nvidia.com`, kubernetes-sigs/dra-driver-nvidia-gpu,
docs/reference/resourceslice-attributes.md): attributes `type`, `productName`,
`architecture`, `cudaComputeCapability` (version), `uuid`, the standard
`resource.kubernetes.io/pcieRoot`; capacity `memory`. MIG partitions consume a per-GPU
counter set (one counter per capacity, one `memory-slice-N` per memory slice). RDMA NICs as
DraNet (`dra.net`, kubernetes-sigs/dranet): `rdma`, `ifName`, the same PCIe-root attribute.
"""

from __future__ import annotations

from phalanx.core.dra import (
    Attr,
    CapacityPolicy,
    Claim,
    ClaimConstraint,
    CounterSet,
    CounterUse,
    DeviceRequest,
    DraDevice,
    ExactRequest,
)
from phalanx.core.model import Gpu, Nic, Node

GPU_CLASS = ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",)
MIG_CLASS = ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",)
NIC_CLASS = ('device.driver == "dra.net"',)
ROOT = "resource.kubernetes.io/pcieRoot"
GI = 2**30


def gpu(
    node: str, k: int, root: int, product: str = "NVIDIA H100 80GB HBM3", multi: bool = False
) -> DraDevice:
    attrs = {
        "gpu.nvidia.com/type": Attr("gpu"),
        "gpu.nvidia.com/productName": Attr(product),
        "gpu.nvidia.com/architecture": Attr("Hopper"),
        "gpu.nvidia.com/cudaComputeCapability": Attr("9.0.0", version=True),
        "gpu.nvidia.com/uuid": Attr(f"GPU-{node}-{k}"),
        "gpu.nvidia.com/index": Attr(k),
        ROOT: Attr(f"pci0000:{root:02x}"),
    }
    policies = (
        {"gpu.nvidia.com/memory": CapacityPolicy(default=0, min=0, max=80 * GI * 1000, step=2**20 * 1000)}
        if multi
        else {}
    )
    return DraDevice(
        "gpu.nvidia.com",
        node,
        f"gpu-{k}",
        attrs,
        {"gpu.nvidia.com/memory": 80 * GI * 1000},
        multi=multi,
        policies=policies,
        role="gpu",
        index=k,
        node=node,
    )


def nic(node: str, k: int, root: int) -> DraDevice:
    attrs = {
        "dra.net/rdma": Attr(True),
        "dra.net/ifName": Attr(f"eth{k + 1}"),
        ROOT: Attr(f"pci0000:{root:02x}"),
    }
    return DraDevice("dra.net", node, f"nic-{k}", attrs, role="nic", index=k, node=node)


def dgx(name: str, gpus: int = 8, nics: int = 4, multi: bool = False, rack: str = "") -> Node:
    """8 GPUs and 4 NICs on 4 PCIe roots (2 GPUs + 1 NIC per root), published through DRA."""
    per_root = max(1, gpus // max(nics, 1))
    devs = [gpu(name, k, k // per_root, multi=multi) for k in range(gpus)]
    devs += [nic(name, k, k) for k in range(nics)]
    return Node(
        name,
        128_000,
        1024 * 1024,
        tuple(Gpu(k, "H100", 81920, numa=k // 4, pcie_switch=k // per_root) for k in range(gpus)),
        tuple(Nic(k, numa=k // 2, pcie_switch=k) for k in range(nics)),
        topology={"rack": rack} if rack else {},
        dra=tuple(devs),
    )


def mig_node(name: str) -> Node:
    """One A100 80GB whose MIG partitions are published beside the full GPU (partitionable devices)."""
    counters = {"multiprocessors": 98_000, **{f"memory-slice-{i}": 1000 for i in range(8)}}
    cs = CounterSet("gpu.nvidia.com", name, "gpu-0-counter-set", counters)
    base = {
        "gpu.nvidia.com/productName": Attr("NVIDIA A100-SXM4-80GB"),
        "gpu.nvidia.com/uuid": Attr(f"GPU-{name}-0"),
        ROOT: Attr("pci0000:00"),
    }
    full = DraDevice(
        "gpu.nvidia.com",
        name,
        "gpu-0",
        base | {"gpu.nvidia.com/type": Attr("gpu")},
        {"gpu.nvidia.com/memory": 80 * GI * 1000},
        consumes=(CounterUse(cs.name, counters),),
        role="gpu",
        index=0,
        node=name,
    )
    migs = []
    for start in (0, 4):
        use = {"multiprocessors": 42_000, **{f"memory-slice-{i}": 1000 for i in range(start, start + 4)}}
        migs.append(
            DraDevice(
                "gpu.nvidia.com",
                name,
                f"gpu-0-mig-3g.40gb-{start}",
                base | {"gpu.nvidia.com/type": Attr("mig"), "gpu.nvidia.com/profile": Attr("3g.40gb")},
                {"gpu.nvidia.com/memory": 40 * GI * 1000},
                consumes=(CounterUse(cs.name, use),),
                role="mig",
                index=0,
                mig=("3g.40gb", start),
                node=name,
            )
        )
    gpus = (Gpu(0, "A100", 81920, mig_enabled=True),)
    return Node(name, 64_000, 512 * 1024, gpus, dra=(full, *migs), counter_sets=(cs,))


def request(
    name: str,
    selectors: tuple[str, ...] = GPU_CLASS,
    count: int = 1,
    cls: str = "gpu.nvidia.com",
    **kw: object,
) -> DeviceRequest:
    return DeviceRequest(name, ExactRequest(name, cls, selectors, count=count, **kw))  # type: ignore[arg-type]


def claim(
    key: str, *requests: DeviceRequest, constraints: tuple[ClaimConstraint, ...] = (), shared: bool = False
) -> Claim:
    return Claim(key, tuple(requests), constraints, shared)


def paired(key: str, pairs: int = 4) -> Claim:
    """8 GPUs and 4 NICs: per pair, 2 GPUs and 1 NIC on one PCIe root (one constraint per pair)."""
    reqs, cons = [], []
    for p in range(pairs):
        reqs += [request(f"gpus-{p}", count=2), request(f"nic-{p}", NIC_CLASS, cls="dranet")]
        cons.append(ClaimConstraint((f"gpus-{p}", f"nic-{p}"), match_attribute=ROOT))
    return claim(key, *reqs, constraints=tuple(cons))
