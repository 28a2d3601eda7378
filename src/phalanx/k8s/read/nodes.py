"""Node objects -> core `Node`: allocatable resources, GPU Feature Discovery labels, device topology.

Without the `phalanx.io/device-topology` annotation, the node's GPUs are `nvidia.com/gpu`
(or `nvidia.com/gpu.count` when MIG takes them), of the model and memory that GFD labels
give (memory unknown, 0, without the label: whole GPUs and shares still work, requests
by GPU memory wait with a reason naming the label), two per PCIe switch; RDMA NICs spread
evenly over the GPUs' switches; MIG instances are laid out from the node's
`nvidia.com/mig-*` counts, first fit over its GPUs.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from phalanx.core.errors import SpecError
from phalanx.core.mig import resolve_geometry
from phalanx.core.model import MAX_DEVICES, Gpu, MigInstance, Nic, Node, Taint
from phalanx.k8s import keys
from phalanx.k8s.config import AdapterConfig
from phalanx.spec import mig_layout
from phalanx.spec.dra import gpu_model
from phalanx.spec.quantity import cpu_milli, memory_mib, size_bytes, whole_number


class GpuTopo(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    index: int = Field(ge=0)
    uuid: str = ""  # NVML's, as `phalanx node discover` publishes it
    model: str = ""
    memory_mib: int = Field(0, alias="memoryMiB", ge=0)
    numa: int = Field(0, ge=0)
    pcie_switch: int = Field(0, alias="pcieSwitch", ge=0)
    nvlink_group: int = Field(0, alias="nvlinkGroup", ge=0)
    mig: bool = False
    mig_instances: list[str] = Field(default_factory=list, alias="migInstances")  # "1g.10gb@0"


class NicTopo(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    index: int = Field(ge=0)
    name: str = ""  # its network interface
    numa: int = Field(0, ge=0)
    pcie_switch: int = Field(0, alias="pcieSwitch", ge=0)
    bandwidth_gbps: float = Field(100.0, alias="bandwidthGbps", gt=0)


class DeviceTopology(BaseModel):
    """Schema of the `phalanx.io/device-topology` node annotation (JSON)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    gpus: list[GpuTopo] = Field(default_factory=list)
    nics: list[NicTopo] = Field(default_factory=list)
    note: str = ""  # why it is empty (no GPUs, no NVML), from `phalanx node discover`
    # the kubelet's --topology-manager-policy, and the cores pods may have on each NUMA node
    numa_policy: Literal["none", "best-effort", "restricted", "single-numa-node"] = Field(
        "none", alias="numaPolicy"
    )
    numa_cpus: list[float] = Field(default_factory=list, alias="numaCpus")


def parse_node(obj: dict[str, Any], cfg: AdapterConfig) -> Node:
    """One Node object; raises SpecError naming the field that is wrong."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    where = f"node {name}"
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    notes = meta.get("annotations") or {}
    alloc = (obj.get("status") or {}).get("allocatable") or {}
    cpu = cpu_milli(alloc.get("cpu", "0"), f"{where}: allocatable.cpu")
    mem = memory_mib(alloc.get("memory", "0"), f"{where}: allocatable.memory")
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "NoSchedule")))
        for t in (obj.get("spec") or {}).get("taints") or []
    )
    topology = {level: labels[key] for level, key in cfg.levels if key in labels}
    if keys.CACHED_DATASETS in notes:  # its dataset cache agent publishes: pods mounting a dataset may go
        labels[keys.CACHE_AGENT] = "true"
    gpus, nics, mig = _devices(name, labels, notes, alloc, cfg)
    datasets: dict[str, int] = {}
    if keys.CACHED_DATASETS in notes:
        w = f"{where}: annotation {keys.CACHED_DATASETS}"
        raw = _json(notes[keys.CACHED_DATASETS], w)
        if not isinstance(raw, dict):
            raise SpecError(w, 'expected a JSON object such as {"imagenet": "150Gi"}')
        datasets = {str(k): size_bytes(v, f"{w}.{k}") for k, v in raw.items()}
    for key, (staged, _) in staging_datasets(notes, where).items():
        datasets.setdefault(key, staged)  # being staged: counts as the part that is there
    recutting, recut_at = _recuts(name, notes, alloc, gpus, mig)
    topo = _topology(notes, where)
    numa_cpus = tuple(round(c * 1000) for c in topo.numa_cpus) if topo is not None else ()
    if any(c < 0 for c in numa_cpus):
        raise SpecError(f"{where}: annotation {keys.DEVICE_TOPOLOGY}.numaCpus", "cores must be >= 0")
    try:
        return Node(
            name,
            cpu,
            mem,
            tuple(gpus),
            tuple(nics),
            labels,
            taints,
            topology,
            datasets,
            mig,
            numa_policy=topo.numa_policy if topo is not None else "none",
            numa_cpu_milli=numa_cpus,
            mig_recutting=recutting,
            mig_recut_at=recut_at,
            distcache_mount=labels.get(keys.DISTCACHE_NODE) == "true",
        )
    except SpecError as e:
        raise e.located(where) from None


Mig = dict[int, tuple[MigInstance, ...]]


def _recuts(
    name: str, notes: dict[str, Any], alloc: dict[str, Any], gpus: list[Gpu], mig: Mig
) -> tuple[frozenset[int], dict[int, float]]:
    """The MIG GPUs being cut (`phalanx.spec.mig_layout`; `mig` then holds their new layouts), and
    when each GPU was last asked to be. A GPU is being cut from the scheduler's request until the
    node agent answers it and, once cut, until kubelet offers the new instances (the device plugin
    lists them at its next look): a pod bound before that would be refused by kubelet."""
    where = f"node {name}: annotation"
    wants = mig_layout.wants(notes.get(keys.MIG_LAYOUT), f"{where} {keys.MIG_LAYOUT}")
    if not wants:
        return frozenset(), {}
    done = mig_layout.answers(notes.get(keys.MIG_LAYOUT_STATUS), f"{where} {keys.MIG_LAYOUT_STATUS}")
    mig_gpus = {g.index for g in gpus if g.mig_enabled}
    actual = dict(mig)
    recutting: set[int] = set()
    for g, want in wants.items():
        if g not in mig_gpus:
            continue
        have = [f"{m.profile}@{m.start}" for m in mig.get(g, ())]
        answer = done.get(g)
        if answer is not None and answer.answers(want) and answer.state != "applied":
            continue  # refused or failed: the layout that is there stands
        if not want.same(have) or not _offered(actual, alloc, want.layout):
            recutting.add(g)
            mig[g] = tuple(_slice(s, f"{where} {keys.MIG_LAYOUT}.{g}") for s in want.layout)
    return frozenset(recutting), {g: w.at for g, w in wants.items()}


def _offered(mig: Mig, alloc: dict[str, Any], layout: list[str]) -> bool:
    """Whether kubelet offers as many of each of the layout's profiles as the node's GPUs have."""
    have: dict[str, int] = {}
    for instances in mig.values():
        for m in instances:
            have[m.profile] = have.get(m.profile, 0) + 1
    for profile in {s.partition("@")[0] for s in layout}:
        offered = str(alloc.get(keys.MIG_PREFIX + profile, "0"))
        if not offered.isdigit() or int(offered) < have.get(profile, 0):
            return False
    return True


def _json(text: object, where: str) -> Any:
    try:
        return json.loads(str(text))
    except json.JSONDecodeError as e:
        raise SpecError(where, f"not valid JSON: {e.msg} at character {e.pos}") from None


def _devices(
    name: str, labels: dict[str, str], notes: dict[str, Any], alloc: dict[str, Any], cfg: AdapterConfig
) -> tuple[list[Gpu], list[Nic], Mig]:
    """GPUs, RDMA NICs, and the MIG instances laid out on MIG-enabled GPUs (by GPU index)."""
    where = f"node {name}"
    mig: Mig = {}
    topo = _topology(notes, where)
    if topo is not None and (topo.gpus or not topo.note):
        w = f"{where}: annotation {keys.DEVICE_TOPOLOGY}"
        default_model = gpu_model(labels.get(keys.GFD_PRODUCT, ""))
        default_mem = whole_number(labels.get(keys.GFD_MEMORY, "0"), f"{where}: label {keys.GFD_MEMORY}")
        listed: list[Gpu] = []
        for g in topo.gpus:
            gpu = Gpu(
                g.index,
                g.model or default_model,
                g.memory_mib or default_mem,
                g.numa,
                g.pcie_switch,
                g.nvlink_group,
                g.mig,
            )
            if g.mig_instances:
                mig[g.index] = tuple(_slice(s, f"{w}.gpus[{g.index}]") for s in g.mig_instances)
            listed.append(gpu)
        nics = [Nic(n.index, n.numa, n.pcie_switch, n.bandwidth_gbps) for n in topo.nics]
        return listed, nics, mig
    model = gpu_model(labels.get(keys.GFD_PRODUCT, ""))
    mem = whole_number(labels.get(keys.GFD_MEMORY, "0"), f"{where}: label {keys.GFD_MEMORY}")
    whole = whole_number(
        alloc.get(keys.GPU_RESOURCE, "0"), f"{where}: allocatable {keys.GPU_RESOURCE}", maximum=MAX_DEVICES
    )
    migs = {
        k[len(keys.MIG_PREFIX) :]: whole_number(v, f"{where}: allocatable {k}", maximum=MAX_DEVICES)
        for k, v in alloc.items()
        if k.startswith(keys.MIG_PREFIX)
    }
    migs = {p: n for p, n in migs.items() if n > 0}
    gpus: list[Gpu] = [Gpu(j, model, mem, j // 4, j // 2, 0) for j in range(whole)]
    if migs:
        count = whole_number(
            labels.get(keys.GFD_COUNT, "0"), f"{where}: label {keys.GFD_COUNT}", maximum=MAX_DEVICES
        )
        if not mem:
            raise SpecError(
                where,
                f"MIG resources but no label {keys.GFD_MEMORY}: the MIG layout depends on the GPU memory "
                f"(run GPU Feature Discovery or set the {keys.DEVICE_TOPOLOGY} annotation)",
            )
        geo = resolve_geometry(model, mem)
        if geo is None:
            raise SpecError(
                where, f"MIG resources on GPU model {model!r} with {mem} MiB, which has no MIG table"
            )
        mig_gpus = max(count - whole, 1)
        layout = _layout(geo.profiles, migs, mig_gpus, where)
        for k in range(mig_gpus):
            idx = whole + k
            gpus.append(Gpu(idx, model, mem, idx // 4, idx // 2, 0, True))
            if layout[k]:
                mig[idx] = tuple(layout[k])
    if topo is not None and topo.nics:  # discovery saw no GPUs (its note says why): kubelet's count stands
        return gpus, [Nic(n.index, n.numa, n.pcie_switch, n.bandwidth_gbps) for n in topo.nics], mig
    n_rdma = sum(
        whole_number(alloc.get(r, "0"), f"{where}: allocatable {r}", maximum=MAX_DEVICES)
        for r in cfg.rdma_resources
    )
    switches = max(1, (len(gpus) + 1) // 2)
    nics = [
        Nic(k, (k * switches // max(n_rdma, 1)) // 2, k * switches // max(n_rdma, 1)) for k in range(n_rdma)
    ]
    return gpus, nics, mig


def _topology(notes: dict[str, Any], where: str) -> DeviceTopology | None:
    if keys.DEVICE_TOPOLOGY not in notes:
        return None
    w = f"{where}: annotation {keys.DEVICE_TOPOLOGY}"
    try:
        return DeviceTopology.model_validate(_json(notes[keys.DEVICE_TOPOLOGY], w))
    except ValidationError as e:
        err = e.errors()[0]
        raise SpecError(f"{w}.{'.'.join(str(x) for x in err['loc'])}", err["msg"]) from None


def _slice(text: str, where: str) -> MigInstance:
    prof, sep, start = text.partition("@")
    if not sep:
        raise SpecError(where, f"MIG instance must look like 1g.10gb@0, got {text!r}")
    return MigInstance(prof, whole_number(start, where))


def _layout(
    profiles: dict[str, Any], counts: dict[str, int], n_gpus: int, where: str
) -> list[list[MigInstance]]:
    """Place the node's MIG instances on its GPUs, biggest first, first fit."""
    for p in counts:
        if p not in profiles:
            raise SpecError(
                where, f"unknown MIG profile {p!r} in allocatable (known: {', '.join(sorted(profiles))})"
            )
    used = [(0, 0) for _ in range(n_gpus)]  # (slot mask, compute)
    out: list[list[MigInstance]] = [[] for _ in range(n_gpus)]
    todo = sorted(((profiles[p], n) for p, n in counts.items()), key=lambda x: (-x[0].slots, x[0].name))
    for prof, n in todo:
        for _ in range(n):
            for g in range(n_gpus):
                mask, comp = used[g]
                starts = [s for s in prof.starts if mask & prof.slot_mask(s) == 0]
                if starts and comp + prof.compute <= 7:
                    s = starts[0]
                    used[g] = (mask | prof.slot_mask(s), comp + prof.compute)
                    out[g].append(MigInstance(prof.name, s))
                    break
            else:
                raise SpecError(where, f"{n} x {prof.name} do not fit on {n_gpus} MIG GPU(s)")
    return out


def staging_datasets(notes: dict[str, str], where: str) -> dict[str, tuple[int, int]]:
    """`phalanx.io/staging-datasets`: dataset -> (bytes staged, total bytes)."""
    text = notes.get(keys.STAGING_DATASETS)
    if not text:
        return {}
    w = f"{where}: annotation {keys.STAGING_DATASETS}"
    raw = _json(text, w)
    if not isinstance(raw, dict):
        raise SpecError(w, 'expected a JSON object such as {"ns/imagenet": "1073741824/161061273600"}')
    out: dict[str, tuple[int, int]] = {}
    for k, v in raw.items():
        staged, sep, total = str(v).partition("/")
        if not sep:
            raise SpecError(f"{w}.{k}", f"expected '<staged bytes>/<total bytes>', got {v!r}")
        out[str(k)] = (size_bytes(staged, f"{w}.{k}"), size_bytes(total, f"{w}.{k}"))
    return out


def dataset_sizes(objs: list[dict[str, Any]]) -> dict[str, int]:
    """Each dataset's full size, as the nodes' caches report it (ready copies and stagings' totals)."""
    out: dict[str, int] = {}
    for obj in objs:
        meta = obj.get("metadata") or {}
        notes = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
        where = f"node {meta.get('name', '')}"
        try:
            ready = _json(notes[keys.CACHED_DATASETS], where) if keys.CACHED_DATASETS in notes else {}
            for k, v in ready.items() if isinstance(ready, dict) else ():
                out[str(k)] = max(out.get(str(k), 0), size_bytes(v, where))
            for k, (_, total) in staging_datasets(notes, where).items():
                out[k] = max(out.get(k, 0), total)
        except SpecError:
            continue  # the node itself is left out, with this reason, by parse_node
    return out
