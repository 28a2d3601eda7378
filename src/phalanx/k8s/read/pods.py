"""Pod objects -> what one task asks for, which workload and queue it belongs to, where it runs.

Requests sum the containers (the largest init container counts if it is bigger). GPUs:
`nvidia.com/gpu: N` whole GPUs; with KAI's `gpu-fraction` (and `gpu-fraction-num-devices`)
or `gpu-memory` annotations, or HAMi's `nvidia.com/gpumem` / `nvidia.com/gpumem-percentage`,
a share of each of N GPUs; `nvidia.com/mig-<profile>: 1` a MIG slice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from phalanx.core.affinity import NodeSelectorTerm
from phalanx.core.backends import parse_override
from phalanx.core.errors import SpecError
from phalanx.core.model import MAX_DEVICES, MILLI, GpuKind, GpuRequest, TaskRequest, Toleration
from phalanx.k8s import keys
from phalanx.k8s.client.cache import object_key
from phalanx.k8s.config import AdapterConfig
from phalanx.spec.affinity import node_selector_terms
from phalanx.spec.datasets import pod_dataset
from phalanx.spec.quantity import cpu_milli, memory_mib, whole_number
from phalanx.spec.times import rfc3339

DONE_PHASES = ("Succeeded", "Failed")
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass
class PodInfo:
    key: str  # namespace/name: the task name
    namespace: str
    name: str
    uid: str
    ours: bool
    request: TaskRequest
    node: str  # spec.nodeName ("" while pending)
    intent: str  # node written by us before the bind, if any
    priority: int
    created: float
    started: float | None
    labels: dict[str, str]
    annotations: dict[str, str]
    owner: tuple[str, str] | None  # (kind, name) of the controlling owner
    deleting: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    plan_holder: str = ""  # the pod whose gang plan gave `intent`
    phase: str = ""  # status.phase (Pending, Running, ...)
    deletion: float = 0.0  # deletionTimestamp: the end of its grace period (0: not being deleted, or unknown)
    scheduling_group: str = ""  # spec.schedulingGroup.podGroupName: a Kubernetes-native PodGroup
    preempts: bool = True  # spec.preemptionPolicy (from its PriorityClass) is not Never

    def tag(self, candidates: tuple[str, ...]) -> str:
        """The first of these keys found in labels, then annotations."""
        for k in candidates:
            if k in self.labels:
                return self.labels[k]
            if k in self.annotations:
                return self.annotations[k]
        return ""


def timestamp(value: object) -> float:
    """An object's RFC 3339 time (creationTimestamp, startTime, a Lease's renewTime) -> epoch
    seconds; 0 when absent or malformed, which every reader takes as "not said"."""
    if not value:
        return 0.0
    t = rfc3339(str(value))
    return 0.0 if t is None else t


def parse_pod(obj: dict[str, Any], cfg: AdapterConfig) -> PodInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ns, name = str(meta.get("namespace", "default")), str(meta.get("name", ""))
    where = f"pod {ns}/{name}"
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    notes = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    owner = None
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            owner = (str(ref.get("kind", "")), str(ref.get("name", "")))
    info = PodInfo(
        key=object_key(obj, "default"),
        namespace=ns,
        name=name,
        uid=str(meta.get("uid", "")),
        ours=spec.get("schedulerName") == cfg.scheduler_name,
        request=TaskRequest(),
        node=str(spec.get("nodeName") or ""),
        intent=notes.get(keys.NODE_INTENT, ""),
        priority=int(spec.get("priority") or 0),
        created=timestamp(meta.get("creationTimestamp")),
        started=timestamp(status.get("startTime")) or None,
        labels=labels,
        annotations=notes,
        owner=owner,
        deleting=bool(meta.get("deletionTimestamp")),
        meta=meta,
        phase=str(status.get("phase") or ""),
        deletion=timestamp(meta.get("deletionTimestamp")),
        scheduling_group=str((spec.get("schedulingGroup") or {}).get("podGroupName") or ""),
        preempts=spec.get("preemptionPolicy") != "Never",
    )
    info.request = _request(spec, notes, cfg, where, ns)
    shared = info.request.gpu.kind in (GpuKind.FRACTION, GpuKind.MEMORY)
    if (
        cfg.gpu_shares == "reservation"
        and info.ours
        and shared
        and not info.node
        and keys.GPU_CONFIGMAP not in notes
    ):
        raise SpecError(
            where,
            f"asks for a GPU share but has no {keys.GPU_CONFIGMAP} annotation: it was created before the "
            "Phalanx admission webhook ran (the Helm chart with webhook.enabled=true), so its containers "
            "would get no GPU; recreate it with the webhook in place",
        )
    return info


def _amounts(container: dict[str, Any]) -> dict[str, Any]:
    """A container's requests, falling back to its limits (extended resources often set only limits)."""
    res = container.get("resources") or {}
    out = dict(res.get("limits") or {})
    out.update(res.get("requests") or {})
    return out


def _request(
    spec: dict[str, Any], notes: dict[str, str], cfg: AdapterConfig, where: str, namespace: str = "default"
) -> TaskRequest:
    per: dict[str, list[Any]] = {}
    for c in spec.get("containers") or []:
        for k, v in _amounts(c).items():
            per.setdefault(str(k), []).append(v)
    inits = [_amounts(c) for c in spec.get("initContainers") or []]
    cpu = sum(cpu_milli(v, f"{where}: resources.cpu") for v in per.get("cpu", []))
    mem = sum(memory_mib(v, f"{where}: resources.memory") for v in per.get("memory", []))
    for ic in inits:
        if "cpu" in ic:
            cpu = max(cpu, cpu_milli(ic["cpu"], f"{where}: initContainers resources.cpu"))
        if "memory" in ic:
            mem = max(mem, memory_mib(ic["memory"], f"{where}: initContainers resources.memory"))
    whole = sum(
        whole_number(v, f"{where}: resources {keys.GPU_RESOURCE}", maximum=MAX_DEVICES)
        for v in per.get(keys.GPU_RESOURCE, [])
    )
    migs = {
        k[len(keys.MIG_PREFIX) :]: sum(
            whole_number(v, f"{where}: resources {k}", maximum=MAX_DEVICES) for v in vs
        )
        for k, vs in per.items()
        if k.startswith(keys.MIG_PREFIX)
    }
    migs = {p: n for p, n in migs.items() if n}
    rdma = sum(
        whole_number(v, f"{where}: resources {r}", maximum=MAX_DEVICES)
        for r in cfg.rdma_resources
        for v in per.get(r, [])
    )
    try:
        gpu = _backend(_gpu(whole, migs, per, notes, where), notes, where)
    except SpecError as e:
        raise e if e.where.startswith("pod ") else e.located(where) from None
    tolerations = tuple(
        Toleration(
            str(t.get("key", "") or ""),
            str(t.get("operator", "Equal") or "Equal"),
            str(t.get("value", "") or ""),
            str(t.get("effect", "") or ""),
        )
        for t in spec.get("tolerations") or []
    )
    try:
        return TaskRequest(
            exclusive_cpu=_exclusive_cpus(spec, where),
            cpu_milli=cpu,
            memory_mib=mem,
            gpu=gpu,
            rdma_nics=rdma,
            nic_same_pcie=notes.get(keys.RDMA_SAME_PCIE, "").lower() == "true",
            node_selector=_node_selector(spec),
            tolerations=tolerations,
            dataset=dataset_of(notes, namespace),
            dataset_distributed=_mounts(spec, keys.DISTCACHE_VOLUME),
            node_affinity=_node_affinity(spec.get("affinity"), where),
        )
    except SpecError as e:
        raise e.located(where) from None


def _node_selector(spec: dict[str, Any]) -> dict[str, str]:
    """The pod's node selector; a pod that mounts its dataset from the node's cache (the webhook's
    hostPath volume) also needs a node whose dataset cache agent runs, or it would wait in
    FailedMount for a copy nothing ever makes."""
    out = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    for v in spec.get("volumes") or []:
        if isinstance(v, dict) and v.get("name") == keys.DATASET_VOLUME and v.get("hostPath"):
            out[keys.CACHE_AGENT] = "true"
    return out


def _mounts(spec: dict[str, Any], volume: str) -> bool:
    """Whether the pod has the webhook's hostPath volume `volume` (its dataset's mount)."""
    return any(
        isinstance(v, dict) and v.get("name") == volume and v.get("hostPath")
        for v in spec.get("volumes") or []
    )


def _exclusive_cpus(spec: dict[str, Any], where: str) -> bool:
    """Whether the kubelet's static CPU manager pins the pod's CPUs: a Guaranteed pod (every
    container's CPU and memory limits set, requests equal to them) whose containers ask whole cores."""
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    if not containers:
        return False
    for c in containers:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        if "cpu" not in limits or "memory" not in limits:
            return False
        cpu = cpu_milli(limits["cpu"], f"{where}: resources.limits.cpu")
        mem = memory_mib(limits["memory"], f"{where}: resources.limits.memory")
        asked_cpu = cpu_milli(requests.get("cpu", limits["cpu"]), f"{where}: resources.requests.cpu")
        asked_mem = memory_mib(
            requests.get("memory", limits["memory"]), f"{where}: resources.requests.memory"
        )
        if cpu % 1000 or asked_cpu != cpu or asked_mem != mem:
            return False
    return True


def dataset_of(notes: dict[str, str], namespace: str) -> str:
    """The pod's dataset as the caches key it: `namespace/name` (a bare name is in the pod's namespace)."""
    return pod_dataset(notes.get(keys.DATASET, ""), namespace)


def _node_affinity(affinity: Any, where: str) -> tuple[NodeSelectorTerm, ...]:
    """Required node affinity is honoured; required pod (anti-)affinity is refused rather than ignored."""
    if not affinity:
        return ()
    if not isinstance(affinity, dict):
        raise SpecError(f"{where}: spec.affinity", "must be a mapping")
    for kind in ("podAffinity", "podAntiAffinity"):
        if (affinity.get(kind) or {}).get(_REQUIRED):
            raise SpecError(
                f"{where}: spec.affinity.{kind}",
                "required pod (anti-)affinity is not supported by Phalanx yet; the pod is left pending "
                "rather than placed against it (use a node selector, node affinity or a topology constraint)",
            )
    node = affinity.get("nodeAffinity") or {}
    required = node.get(_REQUIRED) if isinstance(node, dict) else None
    if not required:
        return ()
    w = f"{where}: spec.affinity.nodeAffinity.{_REQUIRED}.nodeSelectorTerms"
    return node_selector_terms(required.get("nodeSelectorTerms") if isinstance(required, dict) else [], w)


def _share(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise SpecError(where, f"expected a number, got {text!r}") from None
    if v != v:
        raise SpecError(where, "expected a number, got NaN")
    return v


def _gpu(
    whole: int, migs: dict[str, int], per: dict[str, list[Any]], notes: dict[str, str], where: str
) -> GpuRequest:
    fraction = notes.get(keys.KAI_FRACTION)
    memory = notes.get(keys.KAI_MEMORY)
    hami_mem = per.get(keys.HAMI_GPUMEM)
    hami_pct = per.get(keys.HAMI_GPUMEM_PERCENT)
    kinds = sum(x is not None for x in (fraction, memory, hami_mem, hami_pct)) + bool(migs)
    if kinds > 1:
        raise SpecError(where, "ask for GPUs one way only: a fraction, GPU memory, or a MIG slice")
    if migs:
        if whole or len(migs) > 1 or sum(migs.values()) != 1:
            raise SpecError(where, "a pod may ask for exactly one MIG slice (nvidia.com/mig-<profile>: 1)")
        return GpuRequest.mig(next(iter(migs)))
    if fraction is not None:
        w = f"{where}: annotation {keys.KAI_FRACTION}"
        share = _share(fraction, w)
        if not 0 < share <= 1:
            raise SpecError(w, f"a GPU fraction must be in (0, 1], got {fraction!r}")
        devices = _share_devices(notes, where)
        return GpuRequest.whole(devices) if share == 1 else GpuRequest.fraction(share, devices)
    if memory is not None:
        w = f"{where}: annotation {keys.KAI_MEMORY}"
        mib = whole_number(memory, w)
        if mib <= 0:
            raise SpecError(w, "GPU memory must be > 0 MiB")
        return GpuRequest.memory(mib, whole or _share_devices(notes, where))
    if hami_mem is not None:
        mib = sum(whole_number(v, f"{where}: resources {keys.HAMI_GPUMEM}") for v in hami_mem)
        if mib <= 0:
            raise SpecError(f"{where}: resources {keys.HAMI_GPUMEM}", "GPU memory must be > 0 MiB")
        return GpuRequest.memory(mib, max(whole, 1))
    if hami_pct is not None:
        pct = sum(whole_number(v, f"{where}: resources {keys.HAMI_GPUMEM_PERCENT}") for v in hami_pct)
        if not 0 < pct <= 100:
            raise SpecError(f"{where}: resources {keys.HAMI_GPUMEM_PERCENT}", f"must be in 1..100, got {pct}")
        devices = max(whole, 1)
        return GpuRequest.whole(devices) if pct == 100 else GpuRequest.fraction(pct / 100, devices)
    return GpuRequest.whole(whole) if whole else GpuRequest.none()


def _backend(gpu: GpuRequest, notes: dict[str, str], where: str) -> GpuRequest:
    """The pod's `phalanx.io/gpu-backend`: what may serve its fraction (`auto`: the profile decides).
    A bad value is an error on any pod; a good one on a pod that asks no fraction changes nothing."""
    value = notes.get(keys.GPU_BACKEND)
    if value is None:
        return gpu
    w = f"{where}: annotation {keys.GPU_BACKEND}"
    chosen = parse_override(value, w)
    if not chosen or gpu.kind not in (GpuKind.FRACTION, GpuKind.MEMORY):
        return gpu
    try:
        return replace(gpu, backends=chosen)
    except SpecError as e:
        raise SpecError(w, e.message) from None


def _share_devices(notes: dict[str, str], where: str) -> int:
    w = f"{where}: annotation {keys.KAI_FRACTION_DEVICES}"
    devices = whole_number(notes.get(keys.KAI_FRACTION_DEVICES, "1"), w)
    if devices < 1:
        raise SpecError(w, "must be >= 1")
    return devices


def is_active(obj: dict[str, Any]) -> bool:
    """The pod holds (or will hold) resources: not finished."""
    return (obj.get("status") or {}).get("phase") not in DONE_PHASES


__all__ = ["MILLI", "PodInfo", "is_active", "parse_pod", "timestamp"]
