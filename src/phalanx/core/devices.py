"""Which devices of one node a task gets: GPUs (whole, fraction, memory, MIG) and RDMA NICs.

Vectorised per-GPU usability lives here too, so filtering and device choice agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from phalanx.core import numa
from phalanx.core.backends import serves
from phalanx.core.cluster import (
    GEOMETRY_LIST,
    KIND_MIG,
    KIND_SHARED,
    BoolArray,
    ClusterState,
    DeviceAssignment,
    IntArray,
    MigSlice,
)
from phalanx.core.mig import MigProfile
from phalanx.core.model import MIG_BACKEND, MILLI, MPS_BACKEND, GpuKind, GpuRequest, TaskRequest


def fraction_memory(milli: int, mem_cap: IntArray | int) -> IntArray | int:
    """GPU memory charged for a compute fraction (KAI `gpu-fraction` shares memory too)."""
    return (
        (np.asarray(mem_cap) * milli) // MILLI
        if isinstance(mem_cap, np.ndarray)
        else mem_cap * milli // MILLI
    )


def memory_milli(mib: int, mem_cap: IntArray) -> IntArray:
    """Compute share charged for a memory request (KAI `gpu-memory`): ceil(mib / capacity)."""
    cap = np.maximum(mem_cap, 1)
    return -((-mib * MILLI) // cap)


def model_ok(c: ClusterState, rows: IntArray, models: frozenset[str]) -> BoolArray:
    """Per-GPU: the GPU's model is one the request allows."""
    if not models:
        return np.asarray(c.gpu_kind[rows] != 0, dtype=np.bool_)
    ids = [c.model_id[m] for m in models if m in c.model_id]
    if not ids:
        return np.zeros((len(rows), c.max_gpus), dtype=np.bool_)
    return np.asarray(np.isin(c.gpu_model[rows], ids), dtype=np.bool_)


def gpu_usable(c: ClusterState, rows: IntArray, req: TaskRequest) -> BoolArray:
    """Per-GPU (rows x max_gpus): could this GPU serve one device of the request right now?"""
    g = req.gpu
    kind = c.gpu_kind[rows]
    ok = model_ok(c, rows, req.gpu_models)
    if g.kind is GpuKind.WHOLE:
        mem_free = c.gpu_mem_free[rows]
        out = (
            ok & (kind == KIND_SHARED) & (c.gpu_milli_free[rows] == MILLI) & (mem_free == c.gpu_mem_cap[rows])
        )
        return np.asarray(out, dtype=np.bool_)
    if g.kind is GpuKind.FRACTION:
        need_mem = (c.gpu_mem_cap[rows] * g.milli) // MILLI
        out = (
            ok
            & (kind == KIND_SHARED)
            & (c.gpu_milli_free[rows] >= g.milli)
            & (c.gpu_mem_free[rows] >= need_mem)
        )
        return _by_backend(c, rows, g, ok, out)
    if g.kind is GpuKind.MEMORY:
        need_milli = memory_milli(g.memory_mib, c.gpu_mem_cap[rows])
        out = ok & (kind == KIND_SHARED) & (c.gpu_mem_free[rows] >= g.memory_mib)
        out &= c.gpu_milli_free[rows] >= need_milli
        return _by_backend(c, rows, g, ok, out)
    if g.kind is GpuKind.MIG:
        out = np.asarray(ok & (kind == KIND_MIG), dtype=np.bool_)
        for r, j in zip(*np.nonzero(out), strict=True):
            out[r, j] = bool(mig_starts(c, int(rows[r]), int(j), g.mig_profile))
        return out
    return np.zeros((len(rows), c.max_gpus), dtype=np.bool_)


def gpu_usable_on(c: ClusterState, i: int, req: TaskRequest) -> BoolArray:
    """`gpu_usable` for node i alone (one row): asked once per placement, on the node picked.

    A whole-GPU ask that names no model is checked on the node's row directly (no fancy
    indexing), with `gpu_usable`'s verdicts (a GPU of kind shared is never absent).
    """
    g = req.gpu
    if g.kind is GpuKind.WHOLE and not req.gpu_models:
        out: BoolArray = (
            (c.gpu_kind[i] == KIND_SHARED)
            & (c.gpu_milli_free[i] == MILLI)
            & (c.gpu_mem_free[i] == c.gpu_mem_cap[i])
        )
        return out
    row: BoolArray = gpu_usable(c, np.array([i], dtype=np.int64), req)[0]
    return row


def share_mode_ok(c: ClusterState, rows: IntArray, backend: str) -> BoolArray:
    """Per-GPU: may a share of this backend go there? A GPU serves MPS clients or time-slice
    shares, never both (an MPS server holds its GPU in exclusive-process mode)."""
    mps = c.gpu_mps[rows]
    if backend == MPS_BACKEND:
        untouched = (c.gpu_milli_free[rows] == MILLI) & (c.gpu_mem_free[rows] == c.gpu_mem_cap[rows])
        return np.asarray((mps > 0) | untouched, dtype=np.bool_)
    return np.asarray(mps == 0, dtype=np.bool_)


def _by_backend(c: ClusterState, rows: IntArray, g: GpuRequest, ok: BoolArray, share: BoolArray) -> BoolArray:
    """Share-usable GPUs narrowed to the request's backends, plus MIG GPUs with an instance that
    serves it when MIG may (`core.backends`)."""
    if not g.backends:
        return np.asarray(share & (c.gpu_mps[rows] == 0) if c.mps_shares else share, dtype=np.bool_)
    mode = np.zeros(share.shape, dtype=np.bool_)
    for b in g.backends:
        if b != MIG_BACKEND:
            mode |= share_mode_ok(c, rows, b)
    out = share & mode
    if MIG_BACKEND in g.backends and g.devices == 1:
        mig = ok & (c.gpu_kind[rows] == KIND_MIG)
        for r, j in zip(*np.nonzero(mig), strict=True):
            out[r, j] = bool(mig_fraction_profiles(c, int(rows[r]), int(j), g))
    return np.asarray(out, dtype=np.bool_)


def mig_fraction_profiles(c: ClusterState, i: int, j: int, g: GpuRequest) -> list[str]:
    """Profiles of MIG GPU (i, j) that serve fractional ask `g` and have a free start, smallest first."""
    geo_id = int(c.mig_geo[i, j])
    if geo_id < 0:
        return []
    geo = GEOMETRY_LIST[geo_id]
    fit = [p for p in geo.profiles.values() if serves(p, geo, g) and mig_starts(c, i, j, p.name)]
    return [p.name for p in sorted(fit, key=lambda p: (p.memory_mib, p.compute, p.name))]


def mig_profile_of(c: ClusterState, i: int, j: int, name: str) -> MigProfile | None:
    geo_id = int(c.mig_geo[i, j])
    if geo_id < 0:
        return None
    return GEOMETRY_LIST[geo_id].profiles.get(name)


def mig_starts(c: ClusterState, i: int, j: int, name: str) -> list[int]:
    """Free valid starts of MIG profile `name` on GPU (i, j)."""
    prof = mig_profile_of(c, i, j, name)
    if prof is None:
        return []
    geo = GEOMETRY_LIST[int(c.mig_geo[i, j])]
    starts = geo.free_starts(prof, int(c.mig_used[i, j]), int(c.mig_compute[i, j]))
    static = c.mig_static.get((i, j))
    if static is not None:
        starts = [s for s in starts if (prof.name, s) in static]
    return starts


def _mig_room(c: ClusterState, i: int, j: int, used: int, compute: int) -> int:
    """How many placements (weighted by size) remain open on a MIG GPU; higher keeps more options."""
    geo = GEOMETRY_LIST[int(c.mig_geo[i, j])]
    static = c.mig_static.get((i, j))
    room = 0
    for prof in geo.profiles.values():
        for s in geo.free_starts(prof, used, compute):
            if static is None or (prof.name, s) in static:
                room += prof.slots
    return room


def choose_mig(c: ClusterState, i: int, usable: BoolArray, name: str) -> DeviceAssignment | None:
    """Fullest usable MIG GPU first; on it, the start that keeps the most larger placements open."""
    best: tuple[tuple[int, int, int], int, MigProfile, int] | None = None
    for pos in np.nonzero(usable)[0]:
        j = int(pos)
        prof = mig_profile_of(c, i, j, name)
        if prof is None:
            continue
        used = int(c.mig_used[i, j])
        comp = int(c.mig_compute[i, j])
        for s in mig_starts(c, i, j, name):
            room = _mig_room(c, i, j, used | prof.slot_mask(s), comp + prof.compute)
            key = (-comp, -room, j)
            if best is None or key < best[0]:
                best = (key, j, prof, s)
    if best is None:
        return None
    _, j, prof, s = best
    return DeviceAssignment(
        gpus=(j,), mig=MigSlice(prof.name, s), mig_compute=prof.compute, mig_mask=prof.slot_mask(s)
    )


def _group_pick(positions: Sequence[int], keys: Sequence[int], d: int) -> list[int] | None:
    """Smallest group (by key) holding at least `d` of `positions`; lowest positions within it."""
    groups: dict[int, list[int]] = {}
    for p, k in zip(positions, keys, strict=True):
        groups.setdefault(k, []).append(p)
    fitting = [g for g in groups.values() if len(g) >= d]
    if not fitting:
        return None
    fitting.sort(key=lambda g: (len(g), g[0]))
    return fitting[0][:d]


def choose_whole(
    c: ClusterState, i: int, usable: BoolArray, d: int, prefer_pcie: Sequence[int] = ()
) -> list[int]:
    """d free GPUs, packed into one PCIe switch, else one NVLink group, else the fewest groups."""
    pos: list[int] = np.flatnonzero(usable).tolist()
    if len(pos) <= d:
        return pos[:d]
    row_pcie: list[int] = c.gpu_pcie[i].tolist()  # one conversion, not one numpy scalar per GPU
    pcie = [row_pcie[j] for j in pos]
    if prefer_pcie:
        preferred = [p for p, k in zip(pos, pcie, strict=True) if k in prefer_pcie]
        pick = _group_pick(preferred, [row_pcie[j] for j in preferred], d)
        if pick is not None:
            return pick
    row_nvlink: list[int] = c.gpu_nvlink[i].tolist()
    for keys in (pcie, [row_nvlink[j] for j in pos]):
        pick = _group_pick(pos, keys, d)
        if pick is not None:
            return pick
    # spread over the fewest NVLink groups: largest groups first
    groups: dict[int, list[int]] = {}
    for j in pos:
        groups.setdefault(row_nvlink[j], []).append(j)
    out: list[int] = []
    for g in sorted(groups.values(), key=lambda g: (-len(g), g[0])):
        out.extend(g[: d - len(out)])
        if len(out) == d:
            break
    return sorted(out)


def choose_best_fit(c: ClusterState, i: int, usable: BoolArray, d: int, by_memory: bool = False) -> list[int]:
    """The d usable GPUs with the least free capacity (first index on ties): fills holes first."""
    pos = np.nonzero(usable)[0]
    free = c.gpu_mem_free[i, pos] if by_memory else c.gpu_milli_free[i, pos]
    order = np.lexsort((pos, free))
    return [int(pos[k]) for k in order[:d]]


def charge(c: ClusterState, i: int, gpus: Sequence[int], g: GpuRequest) -> DeviceAssignment:
    """The assignment for chosen GPU positions: milli and memory per device (and the share's
    backend, when the request names one)."""
    gl = tuple(gpus)
    if len(g.backends) == 1 and g.backends[0] != MIG_BACKEND:
        return replace(_charge(c, i, gl, g), backend=g.backends[0])
    return _charge(c, i, gl, g)


def _charge(c: ClusterState, i: int, gl: tuple[int, ...], g: GpuRequest) -> DeviceAssignment:
    if g.kind is GpuKind.WHOLE:
        row: list[int] = c.gpu_mem_cap[i].tolist()
        return DeviceAssignment(gpus=gl, milli=MILLI, gpu_memory_mib=tuple(row[j] for j in gl), whole=True)
    if g.kind is GpuKind.FRACTION:
        return DeviceAssignment(
            gpus=gl,
            milli=g.milli,
            gpu_memory_mib=tuple(int(c.gpu_mem_cap[i, j]) * g.milli // MILLI for j in gl),
        )
    if g.kind is GpuKind.MEMORY:
        caps = c.gpu_mem_cap[i, list(gl)]
        milli = int(memory_milli(g.memory_mib, caps).max()) if len(gl) else 0
        return DeviceAssignment(gpus=gl, milli=milli, gpu_memory_mib=(g.memory_mib,) * len(gl))
    raise ValueError(f"charge() does not handle {g.kind}")


def choose_nics(
    c: ClusterState, i: int, gpus: Sequence[int], req: TaskRequest, zone: int = -1
) -> tuple[int, ...] | None:
    """RDMA NICs on the chosen GPUs' PCIe switches first, then their NUMA nodes, then any (only
    those of NUMA node `zone` if given)."""
    want = req.rdma_nics
    if want == 0:
        return ()
    free_mask = c.nic_free[i] if zone < 0 else c.nic_free[i] & (c.nic_numa[i] == zone)
    free = [int(k) for k in np.nonzero(free_mask)[0]]
    switches = {int(c.gpu_pcie[i, j]) for j in gpus}
    numas = {int(c.gpu_numa[i, j]) for j in gpus}
    same = [k for k in free if int(c.nic_pcie[i, k]) in switches]
    if req.nic_same_pcie and gpus:
        return tuple(same[:want]) if len(same) >= want else None
    near = [k for k in free if k not in same and int(c.nic_numa[i, k]) in numas]
    rest = [k for k in free if k not in same and k not in near]
    ordered = same + near + rest
    return tuple(ordered[:want]) if len(ordered) >= want else None


def nic_switches(c: ClusterState, i: int, want: int) -> list[int]:
    """PCIe switches of node i with at least `want` free NICs."""
    counts: dict[int, int] = {}
    for k in np.nonzero(c.nic_free[i])[0]:
        s = int(c.nic_pcie[i, k])
        counts[s] = counts.get(s, 0) + 1
    return sorted(s for s, n in counts.items() if n >= want)


def default_assignment(
    c: ClusterState, i: int, usable: BoolArray, req: TaskRequest, gpu_choice: Sequence[int] | None = None
) -> DeviceAssignment | None:
    """Pick devices on node i: topology-aware for whole GPUs, best fit for shares, NICs beside the GPUs;
    on one NUMA node where the node's Topology Manager policy asks it (`core.numa`)."""
    if c.numa_any and c.numa_policy[i] != numa.NONE:
        return _numa_assignment(c, i, usable, req, gpu_choice)
    return _assignment(c, i, usable, req, gpu_choice)


def _numa_assignment(
    c: ClusterState, i: int, usable: BoolArray, req: TaskRequest, gpu_choice: Sequence[int] | None
) -> DeviceAssignment | None:
    """The devices on the best-fitting NUMA node that can take the task; a node that must align
    it and has none: None; best-effort: anywhere then."""
    must = numa.must_align(c, i, req)
    for z in numa.zones(c, i, usable, req):
        if gpu_choice is not None and any(int(c.gpu_numa[i, j]) != z for j in gpu_choice):
            continue
        a = _assignment(c, i, usable & (c.gpu_numa[i] == z), req, gpu_choice, zone=z if must else -1)
        if a is not None:
            pin = req.exclusive_cpu and bool(c.numa_cpu_cap[i].any())
            return replace(a, numa=z) if pin else a
    return None if must else _assignment(c, i, usable, req, gpu_choice)


def _assignment(
    c: ClusterState,
    i: int,
    usable: BoolArray,
    req: TaskRequest,
    gpu_choice: Sequence[int] | None = None,
    zone: int = -1,
) -> DeviceAssignment | None:
    g = req.gpu
    if req.rdma_nics and req.nic_same_pcie and g.kind is not GpuKind.NONE:
        usable = usable & np.isin(c.gpu_pcie[i], nic_switches(c, i, 1))
    if g.kind is GpuKind.NONE:
        gpus: list[int] = []
        base = DeviceAssignment()
    elif g.kind is GpuKind.MIG:
        mig = choose_mig(c, i, usable, g.mig_profile)
        if mig is None:
            return None
        gpus = list(mig.gpus)
        base = mig
    elif gpu_choice is None and (len(g.backends) > 1 or MIG_BACKEND in g.backends):
        chosen = _by_order(c, i, usable, g)
        if chosen is None:
            return None
        gpus = list(chosen.gpus)
        base = chosen
    else:
        if gpu_choice is not None:
            gpus = list(gpu_choice)
        elif g.kind is GpuKind.WHOLE:
            prefer = nic_switches(c, i, req.rdma_nics) if req.rdma_nics else []
            gpus = choose_whole(c, i, usable, g.devices, prefer)
        else:
            gpus = choose_best_fit(c, i, usable, g.devices, by_memory=g.kind is GpuKind.MEMORY)
        if len(gpus) < g.devices:
            return None
        base = charge(c, i, gpus, g)
    nics = choose_nics(c, i, gpus, req, zone)
    if nics is None:
        return None
    if not nics:
        return base
    return DeviceAssignment(
        gpus=base.gpus,
        milli=base.milli,
        gpu_memory_mib=base.gpu_memory_mib,
        mig=base.mig,
        mig_compute=base.mig_compute,
        mig_mask=base.mig_mask,
        nics=nics,
        whole=base.whole,
        backend=base.backend,
    )


def _by_order(c: ClusterState, i: int, usable: BoolArray, g: GpuRequest) -> DeviceAssignment | None:
    """A fractional ask with several backends, on one node: the first backend, in its order, that
    fits here (the session tries them cluster-wide in that order; this serves a caller that did not)."""
    for b in g.backends:
        if b == MIG_BACKEND:
            on_mig = usable & (c.gpu_kind[i] == KIND_MIG)
            names = sorted(
                {n for j in np.nonzero(on_mig)[0] for n in mig_fraction_profiles(c, i, int(j), g)},
                key=lambda n: _size(c, i, on_mig, n),
            )
            for name in names:
                mig = choose_mig(c, i, on_mig, name)
                if mig is not None:
                    return replace(mig, backend=MIG_BACKEND)
            continue
        one = replace(g, backends=(b,))
        here = usable & (c.gpu_kind[i] == KIND_SHARED) & share_mode_ok(c, np.array([i]), b)[0]
        gpus = choose_best_fit(c, i, here, g.devices, by_memory=g.kind is GpuKind.MEMORY)
        if len(gpus) == g.devices:
            return charge(c, i, gpus, one)
    return None


def _size(c: ClusterState, i: int, on_mig: BoolArray, name: str) -> tuple[int, int, str]:
    for j in np.nonzero(on_mig)[0]:
        p = mig_profile_of(c, i, int(j), name)
        if p is not None:
            return (p.memory_mib, p.compute, name)
    return (0, 0, name)
