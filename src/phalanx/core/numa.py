"""NUMA alignment, as the kubelet's Topology Manager enforces it on a node.

A node says its policy (`Node.numa_policy`, the kubelet's `--topology-manager-policy` names) and,
optionally, its allocatable CPUs per NUMA node (`Node.numa_cpu_milli`). A placement the kubelet
would refuse at admission is never made:

- `single-numa-node`: the task's GPUs, its RDMA NICs and, when they are exclusive
  (`TaskRequest.exclusive_cpu`: a Guaranteed pod's whole cores, which the static CPU manager
  pins), its CPUs all on one NUMA node;
- `restricted`: the same when the request fits one NUMA node's capacity (the narrowest
  alignment is the preferred one, and restricted admits only preferred ones); a request larger
  than any NUMA node is not constrained further;
- `best-effort`: one NUMA node preferred, any accepted; `none`: not looked at.

Among NUMA nodes that fit, the one with the fewest usable GPUs is taken (best fit, as the rest of
the device choice packs). A task's exclusive CPUs are charged to its NUMA node
(`DeviceAssignment.numa`); other CPUs come from the node's shared pool, as the kubelet's do.
"""

from __future__ import annotations

from phalanx.core.cluster import BoolArray, ClusterState, DeviceAssignment
from phalanx.core.model import NUMA_POLICIES, GpuKind, TaskRequest

NONE, BEST_EFFORT, RESTRICTED, SINGLE = range(len(NUMA_POLICIES))  # indices into NUMA_POLICIES


def _gpus(req: TaskRequest) -> int:
    claimed = bool(req.claims) and "gpu" in req.claimed  # DRA claims: their allocator places them
    return 0 if req.gpu.kind is GpuKind.NONE or claimed else req.gpu.devices


def must_align(c: ClusterState, i: int, req: TaskRequest) -> bool:
    """Whether node i refuses this task unless it is on one NUMA node."""
    p = int(c.numa_policy[i])
    if p == SINGLE:
        return True
    if p != RESTRICTED:
        return False
    d = _gpus(req)  # restricted: aligned when one NUMA node could hold it at all
    caps = [int(((c.gpu_numa[i] == z) & (c.gpu_kind[i] != 0)).sum()) for z in range(int(c.numa_zones[i]))]
    fits = any(n >= d for n in caps)
    if fits and req.exclusive_cpu and c.numa_cpu_cap[i].any():
        fits = bool((c.numa_cpu_cap[i] >= req.cpu_milli).any())
    return fits


def zones(c: ClusterState, i: int, usable: BoolArray, req: TaskRequest) -> list[int]:
    """NUMA nodes of node i that can take the task now (GPUs among `usable`, NICs, exclusive CPUs),
    best fit first."""
    d = _gpus(req)
    found = []
    for z in range(int(c.numa_zones[i])):
        here = int((usable & (c.gpu_numa[i] == z)).sum())
        if here < d:
            continue
        if req.rdma_nics and int((c.nic_free[i] & (c.nic_numa[i] == z)).sum()) < req.rdma_nics:
            continue
        if req.exclusive_cpu and c.numa_cpu_cap[i].any() and int(c.numa_cpu_free[i, z]) < req.cpu_milli:
            continue
        found.append((here, z))
    return [z for _, z in sorted(found)]


def respects(c: ClusterState, i: int, req: TaskRequest, a: DeviceAssignment) -> bool:
    """Whether devices a placement policy chose on node i keep its alignment (else the NUMA-aware
    default choice is taken instead)."""
    if int(c.numa_policy[i]) < RESTRICTED or not must_align(c, i, req):
        return True
    zs = {int(c.gpu_numa[i, j]) for j in a.gpus} | {int(c.nic_numa[i, k]) for k in a.nics}
    if len(zs) > 1:
        return False
    if req.exclusive_cpu and c.numa_cpu_cap[i].any():
        z = a.numa if a.numa >= 0 else min(zs, default=-1)
        return z >= 0 and int(c.numa_cpu_free[i, z]) >= req.cpu_milli
    return True
