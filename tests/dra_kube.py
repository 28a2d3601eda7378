"""ResourceSlices, DeviceClasses and claim templates for the DRA e2e tests, as the drivers publish them.

GPUs are shaped after NVIDIA's GPU DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu:
docs/reference/resourceslice-attributes.md for the attributes, the helm chart's DeviceClasses
`gpu.nvidia.com` and `mig.nvidia.com`, cmd/gpu-kubelet-plugin/partitions.go for MIG devices
consuming a per-GPU counter set with one `memory-slice-N` counter per memory slice, and
consumable_shares.go for memory shares). NICs after DraNet (kubernetes-sigs/dranet: driver
`dra.net`, attributes `rdma`, `ifName`, the standard `resource.kubernetes.io/pcieRoot`).
"""

from __future__ import annotations

from typing import Any

R = "resource.k8s.io/v1"


def device_classes() -> list[dict[str, Any]]:
    def cls(name: str, expr: str) -> dict[str, Any]:
        return {"apiVersion": R, "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expr}}]}}  # fmt: skip

    return [
        cls(
            "gpu.nvidia.com",
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        ),
        cls(
            "mig.nvidia.com",
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        ),
        cls("dranet", 'device.driver == "dra.net"'),
    ]


def gpu_device(k: int, root: int, node: str, shares: bool = False) -> dict[str, Any]:
    dev: dict[str, Any] = {
        "name": f"gpu-{k}",
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "architecture": {"string": "Hopper"},
            "brand": {"string": "Nvidia"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.126.20"},
            "uuid": {"string": f"GPU-{node}-{k:04d}"},
            "index": {"int": k},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{root:02x}"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    if shares:  # the driver's --consumable-shares=memory: a GPU shared by memory, in 1Mi steps
        dev["allowMultipleAllocations"] = True
        dev["capacity"]["memory"]["requestPolicy"] = {
            "default": "80Gi",
            "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"},
        }
    return dev


def nic_device(k: int, root: int) -> dict[str, Any]:
    return {
        "name": f"nic-{k}",
        "attributes": {
            "rdma": {"bool": True},
            "ifName": {"string": f"eth{k + 1}"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{root:02x}"},
        },
    }


def slice_(
    name: str, driver: str, node: str, devices: list[dict[str, Any]], counters: Any = None, count: int = 1
) -> dict[str, Any]:
    """One slice of the node's pool; counters go in a slice of their own (the API allows one or the other)."""
    spec: dict[str, Any] = {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
    }
    if counters:
        spec["sharedCounters"] = counters
    else:
        spec["devices"] = devices
    return {"apiVersion": R, "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def dgx_slices(node: str, shares: bool = False) -> list[dict[str, Any]]:
    """8 GPUs and 4 RDMA NICs, 2 GPUs and 1 NIC per PCIe root."""
    gpus = [gpu_device(k, k // 2, node, shares) for k in range(8)]
    nics = [nic_device(k, k) for k in range(4)]
    return [slice_(f"{node}-gpu", "gpu.nvidia.com", node, gpus), slice_(f"{node}-nic", "dra.net", node, nics)]


def mig_slices(node: str) -> list[dict[str, Any]]:
    """One A100 80GB with its full device and two 3g.40gb partitions on one counter set."""
    counters = {"multiprocessors": {"value": "98"}} | {f"memory-slice-{i}": {"value": "1"} for i in range(8)}
    base = {
        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        "uuid": {"string": f"GPU-{node}-0000"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
    }
    devices = [
        {
            "name": "gpu-0",
            "attributes": base | {"type": {"string": "gpu"}},
            "capacity": {"memory": {"value": "80Gi"}},
            "consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": counters}],
        }
    ]
    for start in (0, 4):
        use = {"multiprocessors": {"value": "42"}} | {
            f"memory-slice-{i}": {"value": "1"} for i in range(start, start + 4)
        }
        devices.append(
            {
                "name": f"gpu-0-mig-3g40gb-9-{start}",  # the driver's name: profile without dots, id, start
                "attributes": base | {"type": {"string": "mig"}, "profile": {"string": "3g.40gb"}},
                "capacity": {"memory": {"value": "40Gi"}},
                "consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": use}],
            }
        )
    sets = [{"name": "gpu-0-counter-set", "counters": counters}]
    return [
        slice_(f"{node}-counters", "gpu.nvidia.com", node, [], sets, count=2),
        slice_(f"{node}-gpu", "gpu.nvidia.com", node, devices, count=2),
    ]


def pairs_template(name: str, pairs: int = 4, ns: str = "default") -> dict[str, Any]:
    """Per pod: `pairs` x (2 GPUs + 1 NIC on one PCIe root)."""
    requests, constraints = [], []
    for p in range(pairs):
        requests += [
            {"name": f"gpus-{p}", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
            {"name": f"nic-{p}", "exactly": {"deviceClassName": "dranet", "count": 1}},
        ]
        constraints.append(
            {"requests": [f"gpus-{p}", f"nic-{p}"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
        )
    return {
        "apiVersion": R,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": requests, "constraints": constraints}}},
    }


def template(name: str, request: dict[str, Any], ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": R,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def with_claim(pod: dict[str, Any], template_name: str, claim: str = "devices") -> dict[str, Any]:
    pod["spec"]["resourceClaims"] = [{"name": claim, "resourceClaimTemplateName": template_name}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": claim}]
    return pod
