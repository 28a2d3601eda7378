"""The Kubernetes side of DRA: pods' claims, claim status read and written.

The translation of ResourceSlices, DeviceClasses and claim specs is shared with the simulator
(`phalanx.spec.dra`). A pod's claims come from `spec.resourceClaims`: a ResourceClaim by name
(shared with whoever else names it), or the claim kube-controller-manager made from a
ResourceClaimTemplate (its name is in the pod's `status.resourceClaimStatuses`; until then the
pod waits).
"""

from __future__ import annotations

from typing import Any

from phalanx.core.cel import milli
from phalanx.core.dra import Claim, ClaimAllocation, DeviceResult, DraDevice
from phalanx.k8s.client.cache import object_key
from phalanx.spec.dra import parse_claim_spec


def parse_claim(obj: dict[str, Any], classes: dict[str, dict[str, Any]], shared: bool) -> Claim:
    key = object_key(obj)
    return parse_claim_spec(obj.get("spec") or {}, key, classes, shared, f"ResourceClaim {key}")


def allocation_of(obj: dict[str, Any]) -> ClaimAllocation | None:
    """The allocation in a claim's status, as the core keeps it (None when not allocated)."""
    status = obj.get("status") or {}
    alloc = status.get("allocation")
    if not alloc:
        return None
    key = object_key(obj)
    results = tuple(
        DeviceResult(
            str(r.get("request", "")),
            str(r.get("driver", "")),
            str(r.get("pool", "")),
            str(r.get("device", "")),
            {  # named as the devices' capacity is kept: qualified by the driver
                (k if "/" in k else f"{r.get('driver', '')}/{k}"): milli(
                    v, f"ResourceClaim {key}: consumedCapacity"
                )
                for k, v in (r.get("consumedCapacity") or {}).items()
            },
            str(r.get("shareID") or ""),
            bool(r.get("adminAccess")),
        )
        for r in ((alloc.get("devices") or {}).get("results") or [])
    )
    node = ""
    for term in ((alloc.get("nodeSelector") or {}).get("nodeSelectorTerms")) or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                node = str(f["values"][0])
    return ClaimAllocation(key, node, results)


def pod_claim_names(pod: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(pod's claim name, ResourceClaim name or "" if not made yet, shared) for each claim of the pod."""
    spec = pod.get("spec") or {}
    made = {
        str(s.get("name")): str(s.get("resourceClaimName") or "")
        for s in ((pod.get("status") or {}).get("resourceClaimStatuses") or [])
    }
    out = []
    for rc in spec.get("resourceClaims") or []:
        name = str(rc.get("name") or "")
        if rc.get("resourceClaimName"):
            out.append((name, str(rc["resourceClaimName"]), True))
        elif rc.get("resourceClaimTemplateName"):
            out.append((name, made.get(name, ""), False))
    return out


def status_of(
    alloc: ClaimAllocation,
    devices: dict[tuple[str, str, str], DraDevice],
    node: str,
    claim: dict[str, Any] | None = None,
    classes: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The `status.allocation` Kubernetes expects for an allocation made on `node`.

    Opaque configuration is copied as kube-scheduler copies it: each used DeviceClass's config
    (FromClass) once, naming the requests that used the class, then the claim's own (FromClaim).
    """
    results = []
    for r in alloc.results:
        out: dict[str, Any] = {"request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device}
        if r.admin_access:
            out["adminAccess"] = True
        if r.consumed:
            prefix = f"{r.driver}/"
            out["consumedCapacity"] = {k.removeprefix(prefix): _qty(v) for k, v in r.consumed.items()}
        if r.share_id:
            out["shareID"] = r.share_id
        results.append(out)
    body: dict[str, Any] = {"devices": {"results": results}}
    config = _config(alloc, claim or {}, classes or {})
    if config:
        body["devices"]["config"] = config
    if alloc.node or any((devices.get(r.id) or DraDevice("x", "x", "x")).node for r in alloc.results):
        body["nodeSelector"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    return body


def _qty(m: int) -> str:
    return str(m // 1000) if m % 1000 == 0 else f"{m}m"


def _config(alloc: ClaimAllocation, claim: dict[str, Any], classes: dict[str, dict[str, Any]]) -> list[Any]:
    spec = ((claim.get("spec") or {}).get("devices")) or {}
    class_of: dict[str, str] = {}  # request (or request/sub) name -> its device class
    for r in spec.get("requests") or []:
        if r.get("exactly"):
            class_of[str(r.get("name"))] = str(r["exactly"].get("deviceClassName", ""))
        for sub in r.get("firstAvailable") or []:
            class_of[f"{r.get('name')}/{sub.get('name')}"] = str(sub.get("deviceClassName", ""))
    used: dict[str, list[str]] = {}
    for res in alloc.results:
        cls = class_of.get(res.request)
        if cls and res.request not in used.setdefault(cls, []):
            used[cls].append(res.request)
    out: list[Any] = []
    for cls, requests in used.items():
        for c in ((classes.get(cls) or {}).get("spec") or {}).get("config") or []:
            out.append(
                {
                    "source": "FromClass",
                    "requests": requests,
                    **{k: v for k, v in c.items() if k != "requests"},
                }
            )
    for c in spec.get("config") or []:
        out.append({"source": "FromClaim", **c})
    return out
