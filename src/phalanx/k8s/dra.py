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
from phalanx.spec.dra import parse_claim_spec


def parse_claim(obj: dict[str, Any], classes: dict[str, dict[str, Any]], shared: bool) -> Claim:
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    return parse_claim_spec(obj.get("spec") or {}, key, classes, shared, f"ResourceClaim {key}")


def allocation_of(obj: dict[str, Any]) -> ClaimAllocation | None:
    """The allocation in a claim's status, as the core keeps it (None when not allocated)."""
    status = obj.get("status") or {}
    alloc = status.get("allocation")
    if not alloc:
        return None
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    results = tuple(
        DeviceResult(
            str(r.get("request", "")),
            str(r.get("driver", "")),
            str(r.get("pool", "")),
            str(r.get("device", "")),
            {
                k: milli(v, f"ResourceClaim {key}: consumedCapacity")
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
    alloc: ClaimAllocation, devices: dict[tuple[str, str, str], DraDevice], node: str
) -> dict[str, Any]:
    """The `status.allocation` Kubernetes expects for an allocation made on `node`."""
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
    if alloc.node or any((devices.get(r.id) or DraDevice("x", "x", "x")).node for r in alloc.results):
        body["nodeSelector"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    return body


def _qty(m: int) -> str:
    return str(m // 1000) if m % 1000 == 0 else f"{m}m"
