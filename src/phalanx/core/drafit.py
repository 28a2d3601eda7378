"""Tasks with DRA claims: which nodes can hold them, which devices they get, what they amount to.

Feasibility runs the allocator per node and caches the answer per (claims' shape, node) until
a device of that node changes hands, so a thousand identical claims cost about one search per
node and one per placement. The chosen devices become a `DeviceAssignment` on the node's GPU
and NIC arrays (a published GPU is a `Gpu` of its node), so every other plugin sees them used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from phalanx.core.allocator import Outcome, allocate
from phalanx.core.cluster import KIND_MIG, BoolArray, DeviceAssignment, IntArray, MigSlice
from phalanx.core.decisions import Bind
from phalanx.core.dra import GPU_ROLE, MIG_ROLE, NIC_ROLE, Claim, ClaimAllocation, DraDevice
from phalanx.core.errors import SpecError
from phalanx.core.mig import resolve_geometry
from phalanx.core.model import MILLI, GpuRequest, TaskRequest, claims_shape
from phalanx.core.snapshot import Snapshot

MEMORY = "memory"


def _shape(claims: Sequence[Claim]) -> str:
    return claims_shape(tuple(claims))


def try_node(s: Snapshot, i: int, claims: Sequence[Claim], prefer: Sequence[DraDevice] = ()) -> Outcome:
    """The allocator on node i, the devices in `prefer` first (they must be the node's)."""
    devices = s.node_dra[i]
    if prefer:
        first = {d.id for d in prefer}
        devices = tuple(prefer) + tuple(d for d in devices if d.id not in first)
    try:
        return allocate(s.nodes[i].name, devices, s.dra_counter_sets, s.dra, claims, s.selector_cache)
    except SpecError as e:
        return Outcome(None, str(e))


@dataclass
class _Fit:
    """For one claims' shape: which nodes can allocate them, as of which of each node's DRA versions."""

    ok: npt.NDArray[np.bool_]
    stamp: npt.NDArray[np.int64]
    why: list[str]
    shared: int


def feasible(s: Snapshot, req: TaskRequest, rows: IntArray) -> tuple[BoolArray, dict[str, int]]:
    """Which of `rows` can allocate the request's claims now, and why the others cannot (message -> nodes).

    The allocator runs again only on nodes whose devices changed hands since it last ran for
    this shape of claims: after one placement, one node.
    """
    shape = _shape(req.claims)
    n = len(s.nodes)
    fit = s.dra_fit.get(shape)
    if not isinstance(fit, _Fit) or fit.shared != s.dra.shared_version:
        fit = _Fit(
            np.zeros(n, dtype=np.bool_), np.full(n, -1, dtype=np.int64), [""] * n, s.dra.shared_version
        )
        s.dra_fit[shape] = fit
    versions = s.dra.versions
    stale = rows[fit.stamp[rows] != versions[rows]]
    for i in stale:
        out = try_node(s, int(i), req.claims)
        fit.ok[i] = out.allocations is not None
        fit.why[i] = out.why
        fit.stamp[i] = versions[i]
    ok = fit.ok[rows].copy()
    why: dict[str, int] = {}
    for i in rows[~ok]:
        why[fit.why[i]] = why.get(fit.why[i], 0) + 1
    return ok, why


def assign(
    s: Snapshot, i: int, claims: Sequence[Claim], preferred: DeviceAssignment | None
) -> tuple[DeviceAssignment, tuple[ClaimAllocation, ...]] | None:
    """Devices on node i for the claims, the placement policy's GPUs and NICs first; None if none fit."""
    node = s.nodes[i]
    prefer: list[DraDevice] = []
    if preferred is not None:
        gidx = {node.gpus[j].index for j in preferred.gpus}
        nidx = {node.nics[j].index for j in preferred.nics}
        prefer = [
            d
            for d in s.node_dra[i]
            if (d.role in (GPU_ROLE, MIG_ROLE) and d.index in gidx)
            or (d.role == NIC_ROLE and d.index in nidx)
        ]
    out = try_node(s, i, claims, prefer)
    if out.allocations is None:
        return None
    allocs = tuple(out.allocations)
    fresh = [a for a in allocs if s.dra.allocation(a.claim) is None]
    devices = assignment(s, i, fresh)
    return (devices, allocs) if devices is not None else None


def merged(
    got: tuple[DeviceAssignment, tuple[ClaimAllocation, ...]],
    classic: DeviceAssignment | None,
    claimed: frozenset[str],
) -> tuple[DeviceAssignment, tuple[ClaimAllocation, ...]] | None:
    """The claims' devices plus the GPUs or NICs the pod asks for classically (the policy's choice)."""
    devices, allocs = got
    if claimed >= {"gpu", "nic"}:
        return got
    if classic is None:
        return None
    gpu_side = devices if "gpu" in claimed else classic
    nics = devices.nics if "nic" in claimed else classic.nics
    return replace(gpu_side, nics=nics), allocs


def assignment(s: Snapshot, i: int, allocs: Sequence[ClaimAllocation]) -> DeviceAssignment | None:
    """What the claims' devices take of node i's GPU and NIC arrays (None if the arrays disagree)."""
    node = s.nodes[i]
    whole: list[int] = []
    shares: dict[int, int] = {}  # GPU index -> MiB
    mig: tuple[int, MigSlice] | None = None
    nics: list[int] = []
    for a in allocs:
        for r in a.results:
            d = s.dra_devices.get(r.id)
            if d is None or r.admin_access or d.index < 0:
                continue
            if d.role == NIC_ROLE:
                nics.append(d.index)
            elif d.role == MIG_ROLE and d.mig is not None:
                mig = (d.index, MigSlice(d.mig[0], d.mig[1]))
            elif d.role == GPU_ROLE:
                mem = next((v for k, v in r.consumed.items() if k.rsplit("/", 1)[-1] == MEMORY), None)
                if d.multi and mem is not None:
                    shares[d.index] = shares.get(d.index, 0) + mem // 1000 // 2**20
                else:
                    whole.append(d.index)
    gpos = {g.index: j for j, g in enumerate(node.gpus)}
    if mig is not None and not whole and not shares:
        gpu = node.gpus[gpos[mig[0]]]
        b = Bind("", "", node.name, (mig[0],), 0, 0, mig[1], tuple(nics))
        if not gpu.mig_enabled:
            return None
        return s.assignment_of(b)
    for g in whole:  # a full GPU published beside its MIG partitions takes the whole MIG GPU
        if node.gpus[gpos[g]].mig_enabled:
            geo = resolve_geometry(node.gpus[gpos[g]].model, node.gpus[gpos[g]].memory_mib)
            if geo is None:
                return None
            full = max(geo.profiles.values(), key=lambda p: (p.slots, p.compute))
            return s.assignment_of(Bind("", "", node.name, (g,), 0, 0, MigSlice(full.name, 0), tuple(nics)))
    c = s.cluster
    if shares and not whole and len(set(shares.values())) == 1:
        mib = next(iter(shares.values()))
        gl = tuple(gpos[g] for g in sorted(shares))
        caps = c.gpu_mem_cap[i, list(gl)]
        milli = int(-((-mib * MILLI) // max(int(caps.max()), 1)))
        return DeviceAssignment(
            gpus=gl, milli=min(milli, MILLI), gpu_memory_mib=(mib,) * len(gl), nics=_npos(node, nics)
        )
    gl = tuple(sorted(gpos[g] for g in {*whole, *shares}))  # mixed: charged as whole GPUs
    if any(c.gpu_kind[i, j] == KIND_MIG for j in gl):
        return None
    return DeviceAssignment(
        gpus=gl,
        milli=MILLI if gl else 0,
        gpu_memory_mib=tuple(int(c.gpu_mem_cap[i, j]) for j in gl),
        nics=_npos(node, nics),
        whole=bool(gl),
    )


def _npos(node: object, nics: list[int]) -> tuple[int, ...]:
    npos = {x.index: j for j, x in enumerate(node.nics)}  # type: ignore[attr-defined]
    return tuple(sorted(npos[n] for n in nics if n in npos))


def footprint(
    claims: Sequence[Claim], devices: Sequence[DraDevice], s_cache: object
) -> tuple[GpuRequest, int]:
    """What the claims amount to in GPUs and NICs (for scoring, quotas and FGD), from the first device
    each request's first option can match anywhere. Unknown or mixed kinds amount to nothing."""
    from phalanx.core.allocator import SelectorCache

    cache = s_cache if isinstance(s_cache, SelectorCache) else SelectorCache()
    whole = 0
    mem_share = 0
    mig = ""
    nics = 0
    for c in claims:
        for r in c.requests:
            _, req = r.options()[0]
            match = None
            for d in devices:
                if req.capacity and not d.multi:
                    continue  # asking for capacity: what it amounts to is a share of a shared device
                try:
                    if all(cache.matches(e, d, f"claim {c.key}") for e in req.selectors):
                        match = d
                        break
                except Exception:  # a bad selector makes the claim unplaceable later, with its message
                    break
            if match is None or req.all:
                continue
            if match.role == NIC_ROLE:
                nics += req.count
            elif match.role == MIG_ROLE and match.mig is not None:
                mig = match.mig[0]
            elif match.role == GPU_ROLE:
                asked = next((v for k, v in req.capacity.items() if k.rsplit("/", 1)[-1] == MEMORY), None)
                if match.multi and asked is not None:
                    mem_share = max(mem_share, asked // 1000 // 2**20)
                else:
                    whole += req.count
    if mig and not whole and not mem_share:
        return GpuRequest.mig(mig), nics
    if whole:
        return GpuRequest.whole(whole), nics
    if mem_share:
        return GpuRequest.memory(mem_share), nics
    return GpuRequest.none(), nics
