"""Per-node and per-device free capacity as numpy arrays (struct of arrays).

Filtering and scoring thousands of nodes are vector operations over these arrays;
only `take`/`give` (and `set_ready`) mutate them, one node at a time, and each mutation
stamps the node's version and logs the node, so that caches keyed by node state know
what to refresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from phalanx.core.mig import GEOMETRIES, MigGeometry, resolve_geometry
from phalanx.core.model import MILLI, MPS_BACKEND, NUMA_POLICIES, Node

KIND_ABSENT = 0
KIND_SHARED = 1
KIND_MIG = 2

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

GEOMETRY_LIST: list[MigGeometry] = list(GEOMETRIES.values())
_GEOMETRY_ID = {g.model: i for i, g in enumerate(GEOMETRY_LIST)}


@dataclass(frozen=True, slots=True)
class MigSlice:
    """A MIG instance: profile and start slot on one GPU."""

    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    """Which devices of a node a task gets. GPU and NIC entries are array positions."""

    gpus: tuple[int, ...] = ()
    milli: int = 0
    gpu_memory_mib: tuple[int, ...] = ()
    mig: MigSlice | None = None
    mig_compute: int = 0
    mig_mask: int = 0
    nics: tuple[int, ...] = ()
    whole: bool = False
    # what serves a share: "mps" or "time-slice" (a MIG-served fraction: "mig", with `mig` set);
    # "" for a share no backend policy chose (a time-slice share, as always)
    backend: str = ""
    numa: int = -1  # the NUMA node its exclusive CPUs are charged to (core.numa); -1: the shared pool


EMPTY_ASSIGNMENT = DeviceAssignment()


class ClusterState:
    """Free capacity of every node and device."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        n = len(self.nodes)
        g = max((len(x.gpus) for x in self.nodes), default=0) or 1
        k = max((len(x.nics) for x in self.nodes), default=0) or 1
        self.max_gpus = g
        self.max_nics = k
        self.index = {x.name: i for i, x in enumerate(self.nodes)}
        self.models: list[str] = sorted({gp.model for x in self.nodes for gp in x.gpus})
        self.model_id = {m: i for i, m in enumerate(self.models)}

        self.cpu_cap = np.array([x.cpu_milli for x in self.nodes], dtype=np.int64)
        self.mem_cap = np.array([x.memory_mib for x in self.nodes], dtype=np.int64)
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.node_ready = np.ones(n, dtype=np.bool_)
        self.node_version = np.zeros(n, dtype=np.int64)
        self._stamp = 0

        self.gpu_kind = np.zeros((n, g), dtype=np.int8)
        self.gpu_model = np.full((n, g), -1, dtype=np.int32)
        self.gpu_milli_free = np.zeros((n, g), dtype=np.int64)
        self.gpu_mem_cap = np.zeros((n, g), dtype=np.int64)
        self.gpu_mem_free = np.zeros((n, g), dtype=np.int64)
        self.gpu_pcie = np.full((n, g), -1, dtype=np.int32)
        self.gpu_nvlink = np.full((n, g), -1, dtype=np.int32)
        self.gpu_numa = np.full((n, g), -1, dtype=np.int32)
        self.mig_geo = np.full((n, g), -1, dtype=np.int16)
        self.mig_used = np.zeros((n, g), dtype=np.int64)
        self.mig_compute = np.zeros((n, g), dtype=np.int64)
        # MPS shares per GPU: a GPU that serves MPS clients serves no time-slice share, and back
        # (its MPS server runs it in exclusive-process mode); `mps_shares` is their total
        self.gpu_mps = np.zeros((n, g), dtype=np.int64)
        self.mps_shares = 0
        # static MIG layouts: allowed (profile, start) pairs per GPU position, else dynamic
        self.mig_static: dict[tuple[int, int], frozenset[tuple[str, int]]] = {}

        self.nic_present = np.zeros((n, k), dtype=np.bool_)
        self.nic_free = np.zeros((n, k), dtype=np.bool_)
        self.nic_pcie = np.full((n, k), -1, dtype=np.int32)
        self.nic_numa = np.full((n, k), -1, dtype=np.int32)
        self.nic_bw = np.zeros((n, k), dtype=np.float64)
        # NUMA (core.numa): the Topology Manager policy (index into NUMA_POLICIES), NUMA nodes, CPUs
        self.numa_policy = np.array([NUMA_POLICIES.index(x.numa_policy) for x in self.nodes], dtype=np.int8)
        self.numa_zones = np.array(
            [
                max(
                    len(x.numa_cpu_milli),
                    1 + max([d.numa for d in x.gpus] + [d.numa for d in x.nics], default=0),
                )
                for x in self.nodes
            ],
            dtype=np.int64,
        )
        z = int(self.numa_zones.max(initial=1))
        self.numa_cpu_cap = np.zeros((n, z), dtype=np.int64)
        for i, x in enumerate(self.nodes):
            self.numa_cpu_cap[i, : len(x.numa_cpu_milli)] = x.numa_cpu_milli
        self.numa_cpu_free = self.numa_cpu_cap.copy()
        self.numa_aligned = bool((self.numa_policy >= 2).any())  # a node refuses unaligned tasks
        self.numa_any = bool((self.numa_policy >= 1).any())

        for i, node in enumerate(self.nodes):
            for j, gpu in enumerate(node.gpus):
                self.gpu_model[i, j] = self.model_id[gpu.model]
                self.gpu_mem_cap[i, j] = gpu.memory_mib
                self.gpu_pcie[i, j] = gpu.pcie_switch
                self.gpu_nvlink[i, j] = gpu.nvlink_group
                self.gpu_numa[i, j] = gpu.numa
                if gpu.mig_enabled:
                    geo = resolve_geometry(gpu.model, gpu.memory_mib)
                    assert geo is not None
                    self.gpu_kind[i, j] = KIND_MIG
                    self.mig_geo[i, j] = _GEOMETRY_ID[geo.model]
                    static = node.mig_instances.get(gpu.index)
                    if static:
                        self.mig_static[(i, j)] = frozenset((s.profile, s.start) for s in static)
                    if gpu.index in node.mig_recutting:  # serves nothing until its new layout is there
                        self.mig_used[i, j] = (1 << 8) - 1
                        self.mig_compute[i, j] = 7
                else:
                    self.gpu_kind[i, j] = KIND_SHARED
                    self.gpu_milli_free[i, j] = MILLI
                    self.gpu_mem_free[i, j] = gpu.memory_mib
            for j, nic in enumerate(node.nics):
                self.nic_present[i, j] = True
                self.nic_free[i, j] = True
                self.nic_pcie[i, j] = nic.pcie_switch
                self.nic_numa[i, j] = nic.numa
                self.nic_bw[i, j] = nic.bandwidth_gbps

        self.gpu_count = (self.gpu_kind != KIND_ABSENT).sum(axis=1).astype(np.int64)
        self.shared_count = (self.gpu_kind == KIND_SHARED).sum(axis=1).astype(np.int64)
        self.node_model = np.where(self.gpu_count > 0, self.gpu_model[:, 0], -1).astype(np.int32)
        present = self.gpu_kind != KIND_ABSENT
        self.homogeneous = bool(((self.gpu_model == self.node_model[:, None]) | ~present).all())
        self.gpu_free_total = np.zeros(n, dtype=np.int64)
        self.gpu_whole_free = np.zeros(n, dtype=np.int64)
        self.whole_free_sum = 0  # gpu_whole_free.sum(), kept by _refresh (the whole-GPU guard asks often)
        self.shared_sum = int(self.shared_count.sum())
        # largest share one GPU can still give, by compute and by memory (see fraction_cap)
        self.gpu_frac_cap = np.zeros((n, g), dtype=np.int64)
        self.gpu_frac_max = np.zeros(n, dtype=np.int64)
        self.shared_pos = [np.nonzero(self.gpu_kind[i] == KIND_SHARED)[0].tolist() for i in range(n)]
        self._mem_cap_rows = self.gpu_mem_cap.tolist()
        # nodes in the order they changed, for caches that refresh only what changed (`changed_since`)
        self.log: list[int] = []
        self.log_epoch = 0
        self._log_cap = 4 * n + 64
        for i in range(n):
            self._refresh(i)
        self.log.clear()

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def total_gpus(self) -> int:
        return int(self.gpu_count.sum())

    @property
    def total_shared_milli(self) -> int:
        return int(self.shared_count.sum()) * MILLI

    def _refresh(self, i: int) -> None:
        """Recompute node i's aggregates (plain Python: rows are a handful of GPUs)."""
        free = self.gpu_milli_free[i].tolist()
        mem_free = self.gpu_mem_free[i].tolist()
        cap = self._mem_cap_rows[i]
        total = whole = fmax = 0
        frac = [0] * self.max_gpus
        for j in self.shared_pos[i]:
            f = free[j]
            total += f
            if f == MILLI and mem_free[j] == cap[j]:
                whole += 1
            # a share m fits iff free >= m and mem_free >= floor(cap * m / 1000)
            fc = min(f, ((mem_free[j] + 1) * MILLI - 1) // max(cap[j], 1))
            frac[j] = fc
            if fc > fmax:
                fmax = fc
        self.gpu_free_total[i] = total
        self.whole_free_sum += whole - int(self.gpu_whole_free[i])
        self.gpu_whole_free[i] = whole
        self.gpu_frac_cap[i] = frac
        self.gpu_frac_max[i] = fmax
        self._touch(i)

    def _touch(self, i: int) -> None:
        """Stamp node i's version and log it (every change to a node goes through here)."""
        self._stamp += 1
        self.node_version[i] = self._stamp
        if len(self.log) >= self._log_cap:  # bounded: readers behind a reset scan the versions
            self.log.clear()
            self.log_epoch += 1
        self.log.append(i)

    def mark(self) -> tuple[int, int, int]:
        """Where the change log stands now: (stamp, epoch, position)."""
        return (self._stamp, self.log_epoch, len(self.log))

    def changed_since(self, mark: tuple[int, int, int]) -> list[int]:
        """Nodes changed since `mark`, in index order (from the log, else from the versions)."""
        stamp, epoch, pos = mark
        if stamp == self._stamp:
            return []
        if epoch == self.log_epoch:
            return sorted(set(self.log[pos:]))
        return [int(i) for i in np.nonzero(self.node_version > stamp)[0]]

    def take(self, i: int, cpu: int, mem: int, a: DeviceAssignment) -> None:
        """Charge a task's resources to node `i` (the caller checked that they fit)."""
        self.cpu_free[i] -= cpu
        self.mem_free[i] -= mem
        if a.numa >= 0:
            self.numa_cpu_free[i, a.numa] -= cpu
        if a.mig is not None:
            j = a.gpus[0]
            self.mig_used[i, j] |= a.mig_mask
            self.mig_compute[i, j] += a.mig_compute
        else:
            for j, gmem in zip(a.gpus, a.gpu_memory_mib, strict=True):
                self.gpu_milli_free[i, j] -= a.milli
                self.gpu_mem_free[i, j] -= gmem
            if a.backend == MPS_BACKEND:
                self.gpu_mps[i, list(a.gpus)] += 1
                self.mps_shares += len(a.gpus)
        for j in a.nics:
            self.nic_free[i, j] = False
        self._refresh(i)

    def give(self, i: int, cpu: int, mem: int, a: DeviceAssignment) -> None:
        """Return what `take` charged."""
        self.cpu_free[i] += cpu
        self.mem_free[i] += mem
        if a.numa >= 0:
            self.numa_cpu_free[i, a.numa] += cpu
        if a.mig is not None:
            j = a.gpus[0]
            self.mig_used[i, j] &= ~a.mig_mask
            self.mig_compute[i, j] -= a.mig_compute
        else:
            for j, gmem in zip(a.gpus, a.gpu_memory_mib, strict=True):
                self.gpu_milli_free[i, j] += a.milli
                self.gpu_mem_free[i, j] += gmem
            if a.backend == MPS_BACKEND:
                self.gpu_mps[i, list(a.gpus)] -= 1
                self.mps_shares -= len(a.gpus)
        for j in a.nics:
            self.nic_free[i, j] = True
        self._refresh(i)

    def pinned(self, i: int, exclusive_cpu: bool, a: DeviceAssignment) -> DeviceAssignment:
        """A task recorded from its bind: where a node accounts CPUs per NUMA node, its exclusive CPUs
        are on the NUMA node of its first GPU (else the one with the most free CPUs)."""
        if a.numa >= 0 or not exclusive_cpu or not self.numa_policy[i] or not self.numa_cpu_cap[i].any():
            return a
        z = int(self.gpu_numa[i, a.gpus[0]]) if a.gpus else int(np.argmax(self.numa_cpu_free[i]))
        return replace(a, numa=z)

    def recut(self, i: int, j: int, layout: frozenset[tuple[str, int]]) -> None:
        """Start cutting idle MIG GPU (i, j) into `layout` ((profile, start) pairs): until
        `recut_done`, all its slots and compute are taken, so nothing is placed on it."""
        assert self.mig_used[i, j] == 0 and self.mig_compute[i, j] == 0, "only an idle GPU is recut"
        self.mig_static[(i, j)] = layout
        self.mig_used[i, j] = (1 << 8) - 1
        self.mig_compute[i, j] = 7
        self._touch(i)

    def recut_done(self, i: int, j: int) -> None:
        """The new instances of (i, j) exist: it serves its new layout."""
        self.mig_used[i, j] = 0
        self.mig_compute[i, j] = 0
        self._touch(i)

    def set_ready(self, i: int, ready: bool) -> None:
        self.node_ready[i] = ready
        self._touch(i)

    def gpu_index(self, i: int, j: int) -> int:
        """The device index a node reports for GPU array position `j`."""
        return self.nodes[i].gpus[j].index

    def nic_index(self, i: int, j: int) -> int:
        return self.nodes[i].nics[j].index

    def geometry(self, i: int, j: int) -> MigGeometry | None:
        g = int(self.mig_geo[i, j])
        return GEOMETRY_LIST[g] if g >= 0 else None

    def check_invariants(self) -> None:
        """Raise AssertionError if any node or device is over capacity (used by tests)."""
        assert (self.cpu_free >= 0).all(), "CPU over capacity"
        assert (self.mem_free >= 0).all(), "memory over capacity"
        assert (self.numa_cpu_free >= 0).all(), "CPU of a NUMA node over capacity"
        assert (self.gpu_milli_free >= 0).all(), "GPU milli over capacity"
        assert (self.gpu_mem_free >= 0).all(), "GPU memory over capacity"
        assert (self.gpu_milli_free <= MILLI).all(), "GPU milli above total"
        assert (self.mig_compute <= 7).all(), "MIG compute over capacity"
        assert (self.mig_used < 256).all(), "MIG slots out of range"
        assert (self.gpu_mps >= 0).all() and self.mps_shares == int(self.gpu_mps.sum()), "MPS count"
        assert self.whole_free_sum == int(self.gpu_whole_free.sum()), "whole-GPU total out of step"
