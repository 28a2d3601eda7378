"""Queue objects of three dialects -> one `QueueTree`.

- Ours (`scheduling.phalanx.io/v1alpha1`, cluster-scoped): `spec.parent`, `spec.priority`,
  `spec.resources.{gpu,cpu,memory}.{quota,overQuotaWeight,limit,borrowingLimit,lendingLimit}`;
  GPU in GPUs, CPU in cores or `500m`, memory as a quantity (`512Gi`).
- KAI (`scheduling.run.ai/v2`): `spec.parentQueue`, `spec.priority`, `spec.resources.*.{quota,
  overQuotaWeight,limit}` with CPU in millicores, memory in MB, and -1 for "no quota" / "no limit".
- Volcano (`scheduling.volcano.sh/v1beta1`): `spec.parent` (unless `root`), `spec.weight` as
  over-quota weight, `spec.deserved` as quota and `spec.capability` as limit (resource lists).
"""

from __future__ import annotations

from typing import Any

from phalanx.core.errors import SpecError
from phalanx.core.queues import QueueTree
from phalanx.spec.quantity import cpu_milli, memory_mib
from phalanx.spec.queues import build_queues

_FIELDS = {
    "quota": "deserved",
    "overQuotaWeight": "over_quota_weight",
    "limit": "limit",
    "borrowingLimit": "borrowing_limit",
    "lendingLimit": "lending_limit",
}


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
    kai = api.startswith("scheduling.run.ai/")
    parent = spec.get("parentQueue" if kai else "parent") or ""
    quotas: dict[str, dict[str, Any]] = {}
    for res, body in (spec.get("resources") or {}).items():
        if res not in ("gpu", "cpu", "memory"):
            raise SpecError(f"{where}: spec.resources.{res}", "unknown resource (known: gpu, cpu, memory)")
        if not isinstance(body, dict):
            raise SpecError(f"{where}: spec.resources.{res}", "must be a mapping")
        q: dict[str, Any] = {}
        for k, v in body.items():
            if k not in _FIELDS:
                raise SpecError(
                    f"{where}: spec.resources.{res}.{k}", f"unknown field (known: {', '.join(_FIELDS)})"
                )
            if kai and v in (-1, "-1"):
                continue  # KAI: -1 is "no quota" / "no limit"
            q[_FIELDS[k]] = _kai_units(res, v, f"{where}: spec.resources.{res}.{k}") if kai else v
        if q:
            quotas[res] = q
    return {"name": name, "parent": str(parent), "priority": int(spec.get("priority") or 0), "quotas": quotas}


def _kai_units(res: str, value: Any, where: str) -> Any:
    if res == "cpu" and not isinstance(value, str):
        return f"{cpu_milli(f'{value}m', where)}m"  # KAI CPU is in millicores: 4000 -> 4000m
    if res == "memory" and not isinstance(value, str):
        return f"{float(value)}M"  # KAI memory is in MB
    return value


def _volcano(name: str, spec: dict[str, Any], where: str) -> dict[str, Any]:
    quotas: dict[str, dict[str, Any]] = {}

    def put(resources: Any, field: str) -> None:
        for res, v in (resources or {}).items():
            r = {"nvidia.com/gpu": "gpu", "cpu": "cpu", "memory": "memory"}.get(str(res))
            if r is None:
                continue
            if r == "cpu":
                v = f"{cpu_milli(v, f'{where}: {field}.cpu') / 1000:g}"
            elif r == "memory":
                v = f"{memory_mib(v, f'{where}: {field}.memory')}Mi"
            quotas.setdefault(r, {})["deserved" if field == "deserved" else "limit"] = v

    put(spec.get("deserved"), "deserved")
    put(spec.get("capability"), "capability")
    weight = spec.get("weight")
    if weight is not None:
        for q in quotas.values():
            q["over_quota_weight"] = weight
    parent = str(spec.get("parent") or "")
    return {"name": name, "parent": "" if parent == "root" else parent, "priority": 0, "quotas": quotas}


def build_tree(objects: list[dict[str, Any]], default_queue: str) -> tuple[QueueTree | None, dict[str, str]]:
    """The tree of the valid Queue objects, and a message per queue left out (bad, or under a bad one).

    Ours win over the dialects on a name clash. None when there are no queues at all.
    """
    specs: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    ordered = sorted(
        objects, key=lambda o: not str(o.get("apiVersion", "")).startswith("scheduling.phalanx.io")
    )
    for obj in ordered:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if name in specs or name in problems:
            continue
        try:
            specs[name] = queue_spec(obj)
            build_queues([specs[name] | {"parent": ""}], {}, "")  # the quotas on their own
        except SpecError as e:
            specs.pop(name, None)
            problems[name] = str(e)
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
        return None, problems | {n: str(e) for n in specs}
