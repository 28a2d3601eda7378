"""Extended resources served by DRA (KEP-5004, `DRAExtendedResource`: beta and on in 1.36, GA in
1.37): a pod asking `nvidia.com/gpu: 2` on a cluster whose GPUs a DRA driver publishes.

A DeviceClass names the extended resource it serves in `spec.extendedResourceName`, and every
class also serves `deviceclass.resource.kubernetes.io/<class>`. Where no node advertises the
resource in its allocatable (a device plugin would), the pod's ask becomes one ResourceClaim,
made by the scheduler as kube-scheduler makes it: one request per container and resource, named
`container-<i>-request-<j>` (`i` the container's index, `j` the resource's place among the
container's sorted resource names), `ExactCount` of what the container asks, from that class.
The claim is named by the pod's `status.extendedResourceClaimStatus` once made; until then it
is known here by a key no object can have (`pending_key`). Decided for the whole cluster, not per
node as kube-scheduler does: on a cluster where some nodes advertise the resource, the pod is
served by those nodes' device plugin only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx.core.errors import SpecError
from phalanx.spec.quantity import whole_number

ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT = "deviceclass.resource.kubernetes.io/"
FINALIZER = "resource.kubernetes.io/delete-protection"
_PENDING = " (extended resources)"  # ' ' is in no object's name: the key of a claim not made yet
MAX_COUNT = 1024


def pending_key(namespace: str, pod: str) -> str:
    return f"{namespace}/{pod}{_PENDING}"


def is_pending(key: str) -> bool:
    return key.endswith(_PENDING)


def served_names(classes: list[dict[str, Any]]) -> dict[str, str]:
    """Extended resource name -> the DeviceClass that serves it. Two classes naming one resource:
    the newest wins, then the smaller name (as kube-scheduler's cache decides)."""
    out: dict[str, str] = {}
    named: dict[str, tuple[str, str]] = {}  # resource -> (creationTimestamp, class)
    for c in classes:
        meta = c.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            continue
        out[IMPLICIT + name] = name
        ext = (c.get("spec") or {}).get("extendedResourceName")
        if ext:
            stamp = str(meta.get("creationTimestamp") or "")
            best = named.get(str(ext))
            if best is None or stamp > best[0] or (stamp == best[0] and name < best[1]):
                named[str(ext)] = (stamp, name)
    out.update({ext: cls for ext, (_, cls) in named.items()})
    return out


@dataclass(frozen=True)
class ExtendedAsk:
    """What a pod's extended resources ask of DRA: the claim's spec and the pod's request mappings."""

    spec: dict[str, Any]
    mappings: tuple[dict[str, str], ...]
    resources: frozenset[str]
    existing: str = ""  # a claim made for it before, left unallocated by a bind that failed: reused


def _amounts(container: dict[str, Any]) -> dict[str, Any]:
    res = container.get("resources") or {}
    return {**(res.get("limits") or {}), **(res.get("requests") or {})}  # requests default from limits


def extended_ask(
    pod: dict[str, Any], served: dict[str, str], advertised: set[str], where: str
) -> ExtendedAsk | None:
    """The pod's extended resources that DRA serves (a class names them, no node advertises them);
    None when it asks none. Raises SpecError for what cannot be asked that way."""
    spec = pod.get("spec") or {}
    requests: list[dict[str, Any]] = []
    mappings: list[dict[str, str]] = []
    used: set[str] = set()
    inits = spec.get("initContainers") or []
    for i, c in enumerate([*inits, *(spec.get("containers") or [])]):
        asks = _amounts(c)
        names = sorted(str(k) for k in asks)
        for j, res in enumerate(names):
            cls = served.get(res)
            if cls is None or res in advertised:
                continue
            if i < len(inits):
                raise SpecError(
                    f"{where}: initContainers[{i}] resources {res}",
                    "an init container asking a resource a DRA driver serves is not supported yet",
                )
            count = whole_number(asks[res], f"{where}: resources {res}", 0, maximum=MAX_COUNT)
            if not count:
                continue
            request = f"container-{i}-request-{j}"
            requests.append(
                {
                    "name": request,
                    "exactly": {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count},
                }
            )
            mappings.append(
                {"containerName": str(c.get("name") or ""), "resourceName": res, "requestName": request}
            )
            used.add(res)
    if not requests:
        return None
    requests.sort(key=lambda r: str(r["name"]))
    mappings.sort(key=lambda m: (m["resourceName"], m["requestName"]))
    return ExtendedAsk({"devices": {"requests": requests}}, tuple(mappings), frozenset(used))


def claim_object(ask: ExtendedAsk, namespace: str, pod: str, uid: str) -> dict[str, Any]:
    """The ResourceClaim kube-scheduler would make for the pod (its name generated by the server)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod}-extended-resources-",
            "namespace": namespace,
            "annotations": {ANNOTATION: "true"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid, "controller": True}
            ],
            "finalizers": [FINALIZER],
        },
        "spec": ask.spec,
    }


def left_over(claims: dict[str, dict[str, Any]], namespace: str, uid: str) -> str:
    """An unallocated claim made for the pod's extended resources by an earlier bind that failed
    (the scheduler never deletes claims: the pod's garbage collection does): its name, or ""."""
    for _, c in sorted(claims.items()):
        meta = c.get("metadata") or {}
        if meta.get("namespace") != namespace or (meta.get("annotations") or {}).get(ANNOTATION) != "true":
            continue
        owners = meta.get("ownerReferences") or []
        mine = any(o.get("controller") and o.get("kind") == "Pod" and o.get("uid") == uid for o in owners)
        if mine and not (c.get("status") or {}).get("allocation"):
            return str(meta.get("name") or "")
    return ""


def made_claim(pod: dict[str, Any]) -> str:
    """The name of the claim made for the pod's extended resources ("" while none is)."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    return str(status.get("resourceClaimName") or "") if isinstance(status, dict) else ""


def pod_status(ask: ExtendedAsk, claim: str) -> dict[str, Any]:
    return {
        "extendedResourceClaimStatus": {"requestMappings": list(ask.mappings), "resourceClaimName": claim}
    }
