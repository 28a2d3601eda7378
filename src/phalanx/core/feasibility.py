"""Which nodes can host a task now, as vector operations; and, when none can, why.

Reasons follow kube-scheduler's convention: each node is counted once, under the
first check it fails, and the message names the plugin and the node count.
"""

from __future__ import annotations

import numpy as np

from phalanx.core import drafit, numa
from phalanx.core.cluster import KIND_MIG, KIND_SHARED, BoolArray, ClusterState, IntArray
from phalanx.core.decisions import Reason
from phalanx.core.devices import gpu_usable, gpu_usable_on, model_ok
from phalanx.core.model import MIG_BACKEND, GpuKind, GpuRequest, TaskRequest
from phalanx.core.snapshot import Snapshot

GPU_MEMORY_UNKNOWN = "GPU memory unknown (the node reports no memory for its GPUs)"


class Candidates:
    """Nodes that can host the task; per-GPU usability is computed on demand, row by row."""

    __slots__ = ("_rows", "cluster", "nodes", "request")

    def __init__(
        self, cluster: ClusterState, request: TaskRequest, nodes: IntArray, usable: BoolArray | None = None
    ) -> None:
        self.cluster = cluster
        self.request = request
        self.nodes = nodes
        self._rows: dict[int, BoolArray] = {}
        if usable is not None:
            for k in range(len(nodes)):
                self._rows[k] = usable[k]

    def __len__(self) -> int:
        return len(self.nodes)

    def usable(self, k: int) -> BoolArray:
        """Per-GPU usability of candidate k (array positions of its node)."""
        row = self._rows.get(k)
        if row is None:
            row = gpu_usable_on(self.cluster, int(self.nodes[k]), self.request)
            self._rows[k] = row
        return row

    def narrow(self, k: int, mask: BoolArray) -> None:
        """Restrict candidate k to the GPUs in `mask` (a filter's verdict on single devices)."""
        self._rows[k] = self.usable(k) & mask

    def usable_all(self) -> BoolArray:
        """Per-GPU usability of every candidate (rows aligned with `nodes`)."""
        out = gpu_usable(self.cluster, self.nodes, self.request)
        for k, row in self._rows.items():
            out[k] = row
        return out

    def narrow_all(self, mask: BoolArray) -> BoolArray:
        """Restrict every candidate to the GPUs in `mask`; return which candidates keep a usable GPU."""
        rows = self.usable_all() & mask
        for k in range(len(self.nodes)):
            self._rows[k] = rows[k]
        return np.asarray(rows.any(axis=1), dtype=np.bool_)

    def subset(self, keep: BoolArray) -> Candidates:
        idx = np.nonzero(keep)[0]
        out = Candidates(self.cluster, self.request, self.nodes[idx])
        if not self._rows:  # no row worked out yet (the common case): nothing to carry over
            return out
        for new, old in enumerate(idx):
            row = self._rows.get(int(old))
            if row is not None:
                out._rows[new] = row
        return out


ALL = slice(None)
Rows = IntArray | slice


def _prefilter(s: Snapshot, req: TaskRequest, rows: Rows = ALL) -> BoolArray:
    """Aggregate checks over the nodes `rows` (all by default): one entry per row."""
    c = s.cluster
    m = c.node_ready[rows] & (c.cpu_free[rows] >= req.cpu_milli) & (c.mem_free[rows] >= req.memory_mib)
    if req.node_selector or req.node_affinity or s.has_taints:
        m &= s.static_mask(req)[rows]
    g = req.gpu
    if s.has_dra and g.kind is not GpuKind.NONE:
        m &= ~s.dra_gpu_nodes[rows]
    if g.kind is GpuKind.WHOLE:
        m &= c.gpu_whole_free[rows] >= g.devices
    elif on_mig(g):  # a share, or a MIG instance that serves the fraction
        share = c.gpu_free_total[rows] >= g.milli if g.kind is GpuKind.FRACTION else c.shared_count[rows] >= 1
        m &= share | (c.gpu_kind[rows] == KIND_MIG).any(axis=1)
    elif g.kind is GpuKind.FRACTION:
        m &= c.gpu_free_total[rows] >= g.milli * g.devices
    elif g.kind is GpuKind.MEMORY:
        m &= c.shared_count[rows] >= g.devices
    elif g.kind is GpuKind.MIG:
        m &= (c.gpu_kind[rows] == KIND_MIG).any(axis=1)
    if req.rdma_nics:
        m &= c.nic_free[rows].sum(axis=1) >= req.rdma_nics
    return m


def on_mig(g: GpuRequest) -> bool:
    """A fractional ask that a MIG instance may serve (`core.backends`)."""
    return MIG_BACKEND in g.backends and g.kind in (GpuKind.FRACTION, GpuKind.MEMORY)


def _node_models_ok(c: ClusterState, models: frozenset[str], rows: Rows = ALL) -> BoolArray:
    ids = [c.model_id[m] for m in models if m in c.model_id]
    return np.asarray(np.isin(c.node_model[rows], ids), dtype=np.bool_)


def _dra_prefilter(s: Snapshot, req: TaskRequest) -> BoolArray:
    """A task with claims: CPU, memory, labels and taints here; the claims' devices are the allocator's
    to find. GPUs or NICs the pod asks for classically (a device plugin's) are checked as usual."""
    c = s.cluster
    m = c.node_ready & (c.cpu_free >= req.cpu_milli) & (c.mem_free >= req.memory_mib)
    if req.node_selector or req.node_affinity or s.has_taints:
        m &= s.static_mask(req)
    if "gpu" not in req.claimed and req.gpu.kind is not GpuKind.NONE:
        m &= _prefilter(s, TaskRequest(gpu=req.gpu, gpu_models=req.gpu_models))
        m &= gpu_usable(c, np.arange(len(c)), req).sum(axis=1) >= max(req.gpu.devices, 1)
    if "nic" not in req.claimed and req.rdma_nics:
        m &= c.nic_free.sum(axis=1) >= req.rdma_nics
    return np.asarray(m, dtype=np.bool_)


def find_candidates(
    s: Snapshot,
    req: TaskRequest,
    restrict: BoolArray | None = None,
    within: IntArray | None = None,
    numa_check: bool = True,
) -> Candidates:
    """All nodes where the task fits now, optionally within `restrict` (a mask) or `within` (sorted indices).

    Whole GPUs and single shares are decided from per-node aggregates when every node's
    GPUs are of one model; other requests check GPU by GPU. A task with DRA claims is
    checked by the claim allocator on each node (cached until that node's devices change).
    Every check is per node, so the nodes `within` get the verdicts a pass over all would give.
    """
    if req.claims:
        m = _dra_prefilter(s, req)
        if restrict is not None:
            m &= restrict
        if within is not None:
            m &= np.isin(np.arange(len(m)), within)
        rows = np.nonzero(m)[0]
        ok, _ = drafit.feasible(s, req, rows)
        return Candidates(s.cluster, req, rows[ok])
    sel: Rows = ALL if within is None else within
    c = s.cluster
    g = req.gpu
    if (
        g.kind is GpuKind.WHOLE
        and c.homogeneous
        and g.devices > 0
        and req.cpu_milli > 0
        and req.memory_mib > 0
        and not (req.gpu_models or req.rdma_nics or s.has_dra)
    ):
        # the aggregate checks of `_prefilter` are then exactly "room for one more" in
        # `node_capacity` (ready, labels and taints, CPU, memory, whole GPUs free), kept up to
        # date from the cluster's change log: one comparison instead of a dozen array operations
        if within is not None and len(within) <= SCALAR_ROWS:  # a node or two: worked out directly
            m = node_capacity(s, req, within) >= 1
        else:
            m = capacity_of(s, req, s.capacity_memo, private=True)[0][sel] >= 1
    else:
        m = _prefilter(s, req, sel)
    if restrict is not None:
        m &= restrict[sel]
    # aggregates decide alone unless a share's backend narrows its GPUs (MPS and time-slice apart)
    fast = c.homogeneous and (
        g.kind is GpuKind.WHOLE
        or (g.kind is GpuKind.FRACTION and g.devices == 1 and not g.backends and not c.mps_shares)
    )
    if fast:
        if g.kind is GpuKind.FRACTION:
            m &= c.gpu_frac_max[sel] >= g.milli
        if req.gpu_models:
            m &= _node_models_ok(c, req.gpu_models, sel)
    rows = np.nonzero(m)[0] if within is None else within[m]
    if g.kind is GpuKind.NONE or fast:
        cand = Candidates(c, req, rows)
    else:
        usable = gpu_usable(c, rows, req)
        keep = usable.sum(axis=1) >= g.devices
        cand = Candidates(c, req, rows[keep], usable[keep])
    if req.rdma_nics and len(cand):
        cand = cand.subset(_nics_may_fit(c, cand, req))
    if numa_check and c.numa_aligned and len(cand):
        cand = _numa_fit(c, cand, req)
    return cand


def _numa_fit(c: ClusterState, cand: Candidates, req: TaskRequest) -> Candidates:
    """Drop the nodes whose Topology Manager would refuse the task: no NUMA node of theirs can take it."""
    strict = c.numa_policy[cand.nodes] >= numa.RESTRICTED
    if not strict.any():
        return cand
    keep = np.ones(len(cand), dtype=np.bool_)
    for k in np.nonzero(strict)[0].tolist():
        i = int(cand.nodes[k])
        if numa.must_align(c, i, req):
            keep[k] = bool(numa.zones(c, i, cand.usable(k), req))
    return cand if keep.all() else cand.subset(keep)


def _nics_may_fit(c: ClusterState, cand: Candidates, req: TaskRequest) -> BoolArray:
    """Nodes with enough free NICs and, for NICs beside the GPUs, a usable GPU on a switch with one.

    A vector check over every candidate (it was one device choice per candidate node: 4,000
    tasks on 1,000 nodes took minutes); the device choice itself, on the node picked, decides.
    """
    rows = cand.nodes
    free = c.nic_free[rows]
    keep = free.sum(axis=1) >= req.rdma_nics
    if req.nic_same_pcie and req.gpu.kind is not GpuKind.NONE:
        usable = cand.usable_all()
        nic_sw = np.where(free, c.nic_pcie[rows], -2)  # (n, K): switches of the free NICs
        beside = (c.gpu_pcie[rows][:, :, None] == nic_sw[:, None, :]).any(axis=2)  # (n, G)
        keep &= (usable & beside).any(axis=1)
    return np.asarray(keep, dtype=np.bool_)


EXPLAIN_MEMO = "explain"


def explain_kept(
    s: Snapshot, req: TaskRequest, memo: dict[object, object], restrict: BoolArray | None = None
) -> list[Reason]:
    """`explain(s, req, restrict)`, kept in `memo` while no node changed (the cluster's mark).

    A backlog in a full cluster asks why after every failed gang, many of them alike; what
    `explain` reads is the cluster, the nodes in `restrict` and the request's `fit_key` (its
    dataset is not among them). A new list each time: callers add the filters' reasons to it.
    """
    if req.claims:
        return explain(s, req, restrict)
    key = (EXPLAIN_MEMO, req.fit_key, None if restrict is None else restrict.tobytes())
    c = s.cluster
    mark = c.mark()
    hit = memo.get(key)
    if isinstance(hit, tuple) and hit[0] is c and hit[1] == mark:
        return list(hit[2])
    out = explain(s, req, restrict)
    memo[key] = (c, mark, tuple(out))
    return out


def explain(s: Snapshot, req: TaskRequest, restrict: BoolArray | None = None) -> list[Reason]:
    """Count nodes under the first check they fail, in a fixed order."""
    c = s.cluster
    n = len(c)
    alive = np.ones(n, dtype=np.bool_) if restrict is None else restrict.copy()
    reasons: list[Reason] = []
    if restrict is not None and (~restrict).any():
        reasons.append(Reason("topology", "outside the chosen topology domain", int((~restrict).sum())))

    def step(ok: BoolArray | np.bool_, plugin: str, message: str) -> None:
        nonlocal alive
        bad = alive & ~ok
        count = int(bad.sum())
        if count:
            reasons.append(Reason(plugin, message, count))
        alive = alive & ok

    step(c.node_ready, "nodeready", "node not ready")
    if req.node_selector or req.node_affinity:
        asked = ", ".join(f"{k}={v}" for k, v in sorted(req.node_selector.items()))
        what = f"node selector ({asked}) or affinity" if asked else "node affinity"
        step(s.selector_mask(req), "nodeaffinity", f"{what} does not match")
    step(s.static_mask(req) | ~s.selector_mask(req), "tainttoleration", "taint not tolerated")
    step(c.cpu_free >= req.cpu_milli, "resources", "insufficient CPU")
    step(c.mem_free >= req.memory_mib, "resources", "insufficient memory")
    if req.claims:
        rows = np.nonzero(alive)[0]
        _, why = drafit.feasible(s, req, rows)
        reasons += [Reason("dra", msg, count) for msg, count in sorted(why.items(), key=lambda x: -x[1])]
        return reasons
    g = req.gpu
    if g.kind is not GpuKind.NONE:
        if s.has_dra:
            step(~s.dra_gpu_nodes, "dra", "GPUs published by a DRA driver: ask for them with a ResourceClaim")
        all_rows = np.arange(n)
        if req.gpu_models:
            has_model = model_ok(c, all_rows, req.gpu_models).any(axis=1)
            step(has_model, "gpumodel", f"GPU model not in {'|'.join(sorted(req.gpu_models))}")
        if on_mig(g):
            step(c.gpu_count > 0, "gpu", "no GPUs on the node")
            ok = gpu_usable(c, all_rows, req).any(axis=1)
            step(ok, "gpu", f"no free GPU share or MIG instance for {g.describe()} ({', '.join(g.backends)})")
        elif g.kind is GpuKind.MIG:
            has_mig = (c.gpu_kind == KIND_MIG).any(axis=1)
            step(has_mig, "gpu", "no MIG-enabled GPU")
            step(gpu_usable(c, all_rows, req).any(axis=1), "gpu", f"no free MIG slot for {g.mig_profile}")
        else:
            step(c.gpu_count > 0, "gpu", "no GPUs on the node")
            has_shared = (c.gpu_kind == KIND_SHARED).sum(axis=1) >= g.devices
            step(has_shared, "gpu", "not enough GPUs")
            if g.kind is GpuKind.MEMORY:
                known = ((c.gpu_kind == KIND_SHARED) & (c.gpu_mem_cap > 0)).sum(axis=1) >= g.devices
                step(known, "gpu", GPU_MEMORY_UNKNOWN)
            ok = gpu_usable(c, all_rows, req).sum(axis=1) >= g.devices
            what = {"whole": "free GPU", "fraction": "GPU share", "memory": "GPU memory"}.get(
                g.kind.value, "GPU"
            )
            step(ok, "gpu", f"insufficient {what} ({g.describe()})")
    if req.rdma_nics:
        step(c.nic_free.sum(axis=1) >= req.rdma_nics, "rdma", f"fewer than {req.rdma_nics} free RDMA NIC(s)")
        rows = np.nonzero(alive)[0]
        if len(rows):
            cand = find_candidates(s, req, alive, numa_check=False)
            ok = np.zeros(n, dtype=np.bool_)
            ok[cand.nodes] = True
            step(
                ok, "rdma", "no free NIC on the GPUs' PCIe switch" if req.nic_same_pcie else "NICs do not fit"
            )
    if c.numa_aligned and alive.any():
        ok = np.zeros(n, dtype=np.bool_)
        ok[find_candidates(s, req, alive).nodes] = True
        what = "its GPUs, NICs and exclusive CPUs" if req.exclusive_cpu else "its GPUs and NICs"
        step(
            ok,
            "numa",
            f"no NUMA node can take {what} (Topology Manager policy restricted or single-numa-node)",
        )
    return reasons


UNBOUNDED = 1 << 30


def node_capacity(s: Snapshot, req: TaskRequest, rows: Rows = ALL) -> IntArray:
    """How many tasks of `req` each node (of `rows`, all by default) could still take (an upper
    bound, cheap to compute). Each node's figure depends on that node alone."""
    c = s.cluster
    g = req.gpu
    if (
        not isinstance(rows, slice)
        and len(rows) <= SCALAR_ROWS
        and g.kind is GpuKind.WHOLE
        and g.devices > 0
        and not (req.claims or req.rdma_nics)
    ):
        return _whole_capacity(s, req, rows)
    cpu_free = c.cpu_free[rows]
    cap = np.full(len(cpu_free), UNBOUNDED, dtype=np.int64)
    if req.cpu_milli:
        cap = np.minimum(cap, cpu_free // req.cpu_milli)
    if req.memory_mib:
        cap = np.minimum(cap, c.mem_free[rows] // req.memory_mib)
    if req.claims:  # devices are the allocator's: no bound from the GPU arrays
        ok = c.node_ready[rows] & s.static_mask(req)[rows]
        return np.asarray(np.where(ok, cap, 0), dtype=np.int64)
    if g.kind is GpuKind.WHOLE:
        cap = np.minimum(cap, c.gpu_whole_free[rows] // g.devices)
    elif on_mig(g):  # shares plus MIG instances (at most 7 a GPU)
        share = (
            c.gpu_milli_free[rows] // g.milli
            if g.kind is GpuKind.FRACTION
            else c.gpu_mem_free[rows] // g.memory_mib
        )
        mig = ((c.gpu_kind[rows] == KIND_MIG) & (c.mig_compute[rows] < 7)) * 7
        cap = np.minimum(cap, (share + mig).sum(axis=1))
    elif g.kind is GpuKind.FRACTION:
        cap = np.minimum(cap, (c.gpu_milli_free[rows] // g.milli).sum(axis=1) // g.devices)
    elif g.kind is GpuKind.MEMORY:
        cap = np.minimum(cap, (c.gpu_mem_free[rows] // g.memory_mib).sum(axis=1) // g.devices)
    elif g.kind is GpuKind.MIG:
        cap = np.minimum(cap, ((c.gpu_kind[rows] == KIND_MIG) & (c.mig_compute[rows] < 7)).sum(axis=1) * 7)
    if req.rdma_nics:
        cap = np.minimum(cap, c.nic_free[rows].sum(axis=1) // req.rdma_nics)
    ok = c.node_ready[rows] & s.static_mask(req)[rows]
    return np.asarray(np.where(ok, cap, 0), dtype=np.int64)


CAPACITY_MEMO = "node-capacity"
CATCH_UP_MAX = 64  # changes logged since: beyond this a capacity is worked out anew
CAPACITY_KEPT = 256  # requests kept per memo


def capacity_of(
    s: Snapshot, req: TaskRequest, memo: dict[object, object], private: bool = False
) -> tuple[IntArray, int]:
    """`node_capacity(s, req)` and its sum, kept in `memo` (a session's, or the snapshot's).

    Upper bounds are asked after every victim an eviction loop tries, and feasibility at every
    placement, when one or two nodes changed: the nodes changed since (the cluster's change log;
    every change to a node is logged) are worked out again, the rest kept. The same integers as
    `node_capacity`; read-only: a caller may hold an older one, unless the memo is `private` to
    callers that read the answer at once (then it is brought up to date in place, not copied).
    """
    table = memo.get(CAPACITY_MEMO)
    if not isinstance(table, dict):
        table = memo[CAPACITY_MEMO] = {}
    c = s.cluster
    mark = c.mark()
    hit = table.get(id(req))
    if hit is not None and hit[0] is req and hit[4] is c:
        _, cap, total, at, _ = hit
        if at == mark:
            return cap, total
        if at[1] == mark[1] and mark[2] - at[2] <= CATCH_UP_MAX:
            rows = np.array(c.changed_since(at), dtype=np.int64)
            if len(rows):
                new = node_capacity(s, req, rows)
                total += sum(new.tolist()) - sum(cap[rows].tolist())  # a node or two: no numpy sums
                if private:
                    cap.flags.writeable = True
                else:
                    cap = cap.copy()
                cap[rows] = new
                cap.flags.writeable = False
            table[id(req)] = (req, cap, total, mark, c)
            return cap, total
    cap = node_capacity(s, req)
    cap.flags.writeable = False
    total = int(cap.sum())
    if len(table) >= (CAPACITY_KEPT // 4 if private else CAPACITY_KEPT):
        table.clear()
    table[id(req)] = (req, cap, total, mark, c)
    return cap, total


SCALAR_ROWS = 8  # up to this many nodes, `node_capacity` of a whole-GPU ask is worked out in Python


def _whole_capacity(s: Snapshot, req: TaskRequest, rows: IntArray) -> IntArray:
    """`node_capacity` of a whole-GPU ask on a few nodes, node by node: the same integers
    (Python's // floors as numpy's does) without a dozen array operations for one or two nodes."""
    c = s.cluster
    ready, static = c.node_ready, s.static_mask(req)
    cpu_free, mem_free, whole = c.cpu_free, c.mem_free, c.gpu_whole_free
    cpu, mem, d = req.cpu_milli, req.memory_mib, req.gpu.devices
    out = []
    for i in rows.tolist():
        if not (ready.item(i) and static.item(i)):
            out.append(0)
            continue
        cap = UNBOUNDED
        if cpu:
            cap = min(cap, cpu_free.item(i) // cpu)
        if mem:
            cap = min(cap, mem_free.item(i) // mem)
        out.append(min(cap, whole.item(i) // d))
    return np.array(out, dtype=np.int64)


def may_host(s: Snapshot, req: TaskRequest, i: int) -> bool:
    """False only if `find_candidates` would leave node i out (its aggregate checks, scalar).

    A cheap first look where one node is asked about many times (consolidate asks after every
    move); True says nothing: the full check decides then.
    """
    if req.claims:
        return True
    c = s.cluster
    if not c.node_ready[i] or c.cpu_free[i] < req.cpu_milli or c.mem_free[i] < req.memory_mib:
        return False
    g = req.gpu
    return not (g.kind is GpuKind.WHOLE and c.gpu_whole_free[i] < g.devices)
