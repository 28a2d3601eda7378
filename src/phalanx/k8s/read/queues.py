"""Queue objects of three dialects -> one `QueueTree`.

- Ours (`scheduling.phalanx.io/v1alpha1`, cluster-scoped): `spec.parent`, `spec.priority`,
  `spec.resources.{gpu,cpu,memory}.{quota,overQuotaWeight,limit,borrowingLimit,lendingLimit}`;
  GPU in GPUs, CPU in cores or `500m`, memory as a quantity (`512Gi`); weights are numbers.
- KAI (`scheduling.run.ai/v2`, `docs/queues/README.md` and `pkg/apis/scheduling/v2` of
  KAI-Scheduler): `spec.parentQueue`, `spec.priority` (100 when unset), and per resource
  `quota`, `overQuotaWeight`, `limit`, all plain numbers: CPU in millicores, memory in MB
  (10^6 bytes), GPU in devices; the weight has no unit. `quota: -1` is an unlimited quota;
  `limit: -1` no limit, `limit: 0` or unset "no additional resources" (capped at the quota);
  an unset `overQuotaWeight` is 0, as KAI reads it.
- Volcano (`scheduling.volcano.sh/v1beta1`): `spec.parent` (unless `root`), `spec.weight`
  (over-quota weight of every resource, 1 when unset), `spec.deserved` as quota,
  `spec.capability` as limit, `spec.guarantee.resource` as the part of the quota never lent,
  `spec.priority` (resource lists with `cpu`, `memory`, `nvidia.com/gpu`).

`docs/kubernetes.md` lists what each field becomes and where we differ.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from phalanx.core.errors import SpecError
from phalanx.core.queues import QueueTree
from phalanx.k8s.read.contain import brief
from phalanx.spec.quantity import cpu_milli, memory_mib
from phalanx.spec.queues import build_queues

log = logging.getLogger("phalanx.k8s")
_FIELDS = {
    "quota": "deserved",
    "overQuotaWeight": "over_quota_weight",
    "limit": "limit",
    "borrowingLimit": "borrowing_limit",
    "lendingLimit": "lending_limit",
}
_KAI_FIELDS = ("quota", "overQuotaWeight", "limit")
# KAI's "unlimited quota": deserves whatever it asks for (in the queue spec's units: GPUs, cores, MiB)
UNLIMITED = 1e12
KAI_DEFAULT_PRIORITY = 100


def queue_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """One Queue object as the queue spec of the cluster YAML (`phalanx.spec.queues.QueueSpec`)."""
    api = str(obj.get("apiVersion", ""))
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    spec = obj.get("spec") or {}
    where = f"Queue {name}"
    if not isinstance(spec, dict):
        raise SpecError(where, "spec must be a mapping")
    if api.startswith("scheduling.volcano.sh/"):
        return _volcano(name, spec, where)
    if api.startswith("scheduling.run.ai/"):
        return _kai(name, spec, where)
    quotas: dict[str, dict[str, Any]] = {}
    for res, body in _sections(spec, where).items():
        q: dict[str, Any] = {}
        for k, v in body.items():
            if k not in _FIELDS:
                raise SpecError(
                    f"{where}: spec.resources.{res}.{k}", f"unknown field (known: {', '.join(_FIELDS)})"
                )
            q[_FIELDS[k]] = v
        if q:
            quotas[res] = q
    return {
        "name": name,
        "parent": str(spec.get("parent") or ""),
        "priority": _int(spec, where),
        "quotas": quotas,
    }


def _sections(spec: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    resources = spec.get("resources") or {}
    if not isinstance(resources, dict):
        raise SpecError(f"{where}: spec.resources", "must be a mapping")
    for res, body in resources.items():
        if res not in ("gpu", "cpu", "memory"):
            raise SpecError(f"{where}: spec.resources.{res}", "unknown resource (known: gpu, cpu, memory)")
        if not isinstance(body, dict):
            raise SpecError(f"{where}: spec.resources.{res}", "must be a mapping")
    return resources


def _int(spec: dict[str, Any], where: str, default: int = 0) -> int:
    v = spec.get("priority")
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v):
        raise SpecError(f"{where}: spec.priority", f"must be a whole number, got {v!r}")
    return int(v)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise SpecError(where, f"must be a number, got {value!r}")
    return float(value)


def _kai(name: str, spec: dict[str, Any], where: str) -> dict[str, Any]:
    quotas: dict[str, dict[str, Any]] = {}
    for res, body in _sections(spec, where).items():
        w = f"{where}: spec.resources.{res}"
        for k in body:
            if k not in _KAI_FIELDS:
                raise SpecError(f"{w}.{k}", f"unknown field (known: {', '.join(_KAI_FIELDS)})")
        quota = _number(body.get("quota", 0), f"{w}.quota")
        limit = _number(body.get("limit", 0), f"{w}.limit")
        weight = _number(body.get("overQuotaWeight", 0), f"{w}.overQuotaWeight")
        if weight < 0:
            raise SpecError(f"{w}.overQuotaWeight", f"must be >= 0, got {weight:g}")
        for field, v in (("quota", quota), ("limit", limit)):
            if v < 0 and v != -1:
                raise SpecError(f"{w}.{field}", f"must be >= 0 or -1 (unlimited), got {v:g}")
        q: dict[str, Any] = {"over_quota_weight": weight}
        if quota == -1:
            q["deserved"] = _kai_amount(res, limit) if limit > 0 else _kai_amount(res, UNLIMITED)
        else:
            q["deserved"] = _kai_amount(res, quota)
        if limit > 0:
            q["limit"] = _kai_amount(res, max(limit, quota))
        elif limit == 0 and quota != -1:
            q["limit"] = q["deserved"]  # "no additional resources": nothing beyond the quota
        quotas[res] = q
    return {
        "name": name,
        "parent": str(spec.get("parentQueue") or ""),
        "priority": _int(spec, where, KAI_DEFAULT_PRIORITY),
        "quotas": quotas,
    }


def _kai_amount(res: str, value: float) -> Any:
    """KAI's plain numbers in our units: CPU millicores -> `4000m`, memory MB -> `4096M`, GPUs as they are."""
    if value >= UNLIMITED:
        return value if res == "gpu" else (f"{int(value)}" if res == "cpu" else f"{int(value)}Mi")
    if res == "cpu":
        return f"{round(value)}m"
    if res == "memory":
        return f"{round(value)}M"
    return value


_VOLCANO_RES = {"nvidia.com/gpu": "gpu", "cpu": "cpu", "memory": "memory"}


def _volcano(name: str, spec: dict[str, Any], where: str) -> dict[str, Any]:
    amounts: dict[str, dict[str, float]] = {}

    def put(resources: Any, field: str) -> None:
        if resources is None:
            return
        if not isinstance(resources, dict):
            raise SpecError(f"{where}: spec.{field}", "must be a resource list (a mapping)")
        for res, v in resources.items():
            r = _VOLCANO_RES.get(str(res))
            if r is None:
                continue  # other resources (NPUs, ephemeral storage) are not accounted by Phalanx
            w = f"{where}: spec.{field}.{res}"
            if r == "cpu":
                amount = float(cpu_milli(v, w))
            elif r == "memory":
                amount = float(memory_mib(v, w))
            else:
                amount = _number(float(v) if isinstance(v, str) and _numeric(v) else v, w) * 1000
            amounts.setdefault(r, {})[field] = amount

    put(spec.get("deserved"), "deserved")
    put(spec.get("capability"), "capability")
    guarantee = spec.get("guarantee") or {}
    put(guarantee.get("resource") if isinstance(guarantee, dict) else guarantee, "guarantee.resource")
    weight = spec.get("weight", 1)
    weight = _number(weight, f"{where}: spec.weight")
    quotas: dict[str, dict[str, Any]] = {}
    for r in ("gpu", "cpu", "memory"):
        a = amounts.get(r, {})
        q: dict[str, Any] = {"over_quota_weight": weight}
        deserved = a.get("deserved", 0.0)
        if "deserved" in a:
            q["deserved"] = _ours(r, deserved)
        if "capability" in a:
            q["limit"] = _ours(r, max(a["capability"], deserved))
        if "guarantee.resource" in a:  # reserved for the queue: that much of its quota is never lent
            q["lending_limit"] = _ours(r, max(deserved - a["guarantee.resource"], 0.0))
        quotas[r] = q
    parent = str(spec.get("parent") or "")
    return {
        "name": name,
        "parent": "" if parent == "root" else parent,
        "priority": _int(spec, where),
        "quotas": quotas,
    }


def _numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _ours(res: str, milli_or_mib: float) -> Any:
    """Accounting units (milli-GPU, milli-CPU, MiB) -> the queue spec's (GPUs, `m`, `Mi`)."""
    if res == "gpu":
        return milli_or_mib / 1000
    if res == "cpu":
        return f"{round(milli_or_mib)}m"
    return f"{round(milli_or_mib)}Mi"


def build_tree(
    objects: list[dict[str, Any]], default_queue: str, extra: list[dict[str, Any]] | None = None
) -> tuple[QueueTree | None, dict[str, str]]:
    """The tree of the valid Queue objects, and a message per queue left out (bad, or under a bad one).

    Ours win over the dialects on a name clash. None when there are no queues at all. Any
    error of one queue (not only a SpecError) leaves that queue out, never the cycle. `extra`:
    queue specs made elsewhere (Kueue's ClusterQueues and Cohorts, `phalanx.k8s.read.kueue`), after
    the Queue objects on a name clash.
    """
    specs: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    for spec in extra or []:
        name = str(spec["name"])
        try:
            build_queues([spec | {"parent": ""}], {}, f"Queue {name}: ")
            specs[name] = spec
        except SpecError as e:
            problems[name] = _named(name, " ".join(str(e).split()))
    ordered = sorted(
        objects, key=lambda o: not str(o.get("apiVersion", "")).startswith("scheduling.phalanx.io")
    )
    seen: set[str] = set()
    for obj in ordered:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if name in seen:
            continue
        seen.add(name)
        problems.pop(name, None)  # a Queue object of that name replaces a migrated one
        try:
            specs[name] = queue_spec(obj)
            build_queues([specs[name] | {"parent": ""}], {}, f"Queue {name}: ")  # the quotas on their own
        except SpecError as e:
            specs.pop(name, None)
            problems[name] = _named(name, " ".join(str(e).split()))
        except Exception as e:
            specs.pop(name, None)
            log.warning("Queue %s could not be read", name, exc_info=True)
            problems[name] = f"Queue {name}: cannot be read ({type(e).__name__}: {brief(e)})"
    if not specs and not problems:
        return None, {}
    if default_queue not in specs and default_queue not in problems:
        specs[default_queue] = {"name": default_queue, "parent": "", "priority": 0, "quotas": {}}
    changed = True
    while changed:  # drop queues whose parent is missing or left out, and their subtrees
        changed = False
        for name, sp in list(specs.items()):
            parent = sp["parent"]
            if parent and parent not in specs:
                why = problems.get(parent)
                problems[name] = (
                    f"Queue {name}: parent queue {parent!r} is left out ({why})"
                    if why
                    else f"Queue {name}: parent queue {parent!r} does not exist"
                )
                del specs[name]
                changed = True
    try:
        return build_queues(list(specs.values()), {}, ""), problems
    except SpecError as e:  # e.g. a cycle of parents: no tree rather than a wrong one
        return None, problems | {n: _named(n, str(e)) for n in specs}


def _named(name: str, text: str) -> str:
    return text if text.startswith(f"Queue {name}") else f"Queue {name}: {text}"
