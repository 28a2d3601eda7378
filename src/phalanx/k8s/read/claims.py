"""The DRA objects a cycle reads, and pods' ResourceClaims against the snapshot.

Allocated claims hold their devices in the snapshot; our pods' claims become their requests
(what the claims amount to in GPUs and NICs), or the reason the pod waits (a claim not made yet,
or one that cannot be read). A native PodGroup's claims are shared by its pods and reserved for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from phalanx.core import drafit
from phalanx.core.errors import SpecError
from phalanx.core.model import GpuKind, Node
from phalanx.core.snapshot import Snapshot
from phalanx.k8s import keys
from phalanx.k8s.client.cache import object_key
from phalanx.k8s.read import extended, native
from phalanx.k8s.read.contain import Contain, brief, label, mapping, mappings
from phalanx.k8s.read.dra import allocation_of, parse_claim, pod_claim_names
from phalanx.k8s.read.pods import PodInfo
from phalanx.spec.dra import Devices, node_devices, parse_claim_spec


@dataclass
class DraObjects:
    """The resource.k8s.io objects a cycle reads (empty on a cluster without DRA)."""

    classes: list[dict[str, Any]] = field(default_factory=list)
    slices: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)


def with_dra(n: Node, devices: Devices) -> Node:
    """The node with the devices its DRA drivers publish (its GPUs and NICs made from them)."""
    devs = devices.by_node[n.name]
    pools = {(d.driver, d.pool) for d in devs}
    sets = tuple(cs for cs in devices.counter_sets if (cs.driver, cs.pool) in pools)
    gpus, nics = node_devices(devs)
    return replace(
        n,
        gpus=gpus if gpus else n.gpus,
        nics=nics if nics else n.nics,
        mig_instances={} if gpus else n.mig_instances,
        dra=tuple(devs),
        counter_sets=sets,
    )


class Claims:
    """Pods' ResourceClaims: allocated ones held in the snapshot, our pods' claims on their requests."""

    def __init__(
        self, dra: DraObjects, snap: Snapshot, contain: Contain, nodes: list[dict[str, Any]] | None = None
    ) -> None:
        self.snap = snap
        self.contain = contain
        self.classes = {str((c.get("metadata") or {}).get("name", "")): c for c in dra.classes}
        self.objects = {object_key(c): c for c in dra.claims}
        self.waiting: dict[str, str] = {}  # pod -> why it waits (claim not made yet, or bad)
        self.group_reserved: dict[str, dict[str, str]] = {}  # claims of native PodGroups -> reservedFor
        self.served = extended.served_names(dra.classes)  # extended resources DeviceClasses serve
        self.nodes = nodes or []
        self._advertised: set[str] | None = None
        self.extended: dict[str, extended.ExtendedAsk] = {}  # pending claim key -> what it asks

    @property
    def advertised(self) -> set[str]:
        """Resources some node has in its allocatable (a device plugin serves them there)."""
        if self._advertised is None:
            self._advertised = {
                str(k)
                for n in self.nodes
                for k, v in (mapping(mapping(n.get("status")).get("allocatable"))).items()
                if str(k) in self.served and str(v) not in ("0", "")
            }
        return self._advertised

    def _extended(
        self, p: PodInfo, obj: dict[str, Any]
    ) -> tuple[list[tuple[str, str, bool]], list[Any], bool]:
        """The pod's extended resources served by DRA: (the claim made for them, as a named claim;
        the claim still to make, as a core Claim; whether they include its GPUs)."""
        if not self.served:
            return [], [], False
        ask = extended.extended_ask(obj, self.served, self.advertised, f"pod {p.key}")
        if ask is None:
            return [], [], False
        gpus = any(r == keys.GPU_RESOURCE or r.startswith(keys.MIG_PREFIX) for r in ask.resources)
        made = extended.made_claim(obj)
        if made and (f"{p.namespace}/{made}" in self.objects or p.node):
            return [("(extended resources)", made, False)], [], gpus
        if p.node:  # bound without a claim: what it runs with is not DRA's to say
            return [], [], gpus
        key = extended.pending_key(p.namespace, p.name)
        uid = str(mapping(obj.get("metadata")).get("uid") or "")
        self.extended[key] = replace(ask, existing=extended.left_over(self.objects, p.namespace, uid))
        where = f"pod {p.key}: extended resources {', '.join(sorted(ask.resources))}"
        return [], [parse_claim_spec(ask.spec, key, self.classes, False, where)], gpus

    def reserve(self, our_bound: set[str]) -> None:
        """Allocated claims hold their devices; their GPUs count as used unless one of our bound pods
        holds them (its annotations already account for them)."""
        for obj in self.objects.values():
            alloc = self.contain("ResourceClaim", obj, partial(allocation_of, obj))
            if alloc is None:
                continue
            self.snap.reserve_claim(alloc)
            users = {str(r.get("uid", "")) for r in mappings(mapping(obj.get("status")).get("reservedFor"))}
            if users & our_bound or not alloc.node or alloc.node not in self.snap.cluster.index:
                continue
            i = self.snap.node_index(alloc.node)
            held = drafit.assignment(self.snap, i, [alloc])
            if held is not None:
                self.snap.hold_devices(i, held)

    def attach(self, p: PodInfo, obj: dict[str, Any], pg: dict[str, Any] | None = None) -> PodInfo:
        try:
            names = pod_claim_names(obj)
        except Exception as e:  # a pod's own fields: it waits, and says why
            self.waiting[p.key] = f"pod {p.key}: its resourceClaims cannot be read ({type(e).__name__}: {e})"
            return p
        try:
            made, pending, dra_gpus = self._extended(p, obj)
        except Exception as e:
            self.waiting[p.key] = brief(e) if isinstance(e, SpecError) else f"pod {p.key}: {brief(e)}"
            return p
        names += made
        if not names and not pending:
            return p
        if pg is not None:  # the PodGroup's claims: shared by its pods, reserved for the PodGroup
            theirs = native.group_claims(obj, pg)
            names = [(pc, theirs[pc], True) if pc in theirs else (pc, cn, sh) for pc, cn, sh in names]
            for claim_name in theirs.values():
                if claim_name:
                    self.group_reserved[f"{p.namespace}/{claim_name}"] = native.reference(pg)
        out = list(pending)
        for pod_claim, claim_name, shared in names:
            if not claim_name:
                why = f"waiting for the ResourceClaim of {pod_claim!r} to be made from its template"
                self.waiting[p.key] = f"pod {p.key}: {why}"
                return p
            key = f"{p.namespace}/{claim_name}"
            cobj = self.objects.get(key)
            if cobj is None:
                self.waiting[p.key] = f"pod {p.key}: ResourceClaim {key} does not exist (yet)"
                return p
            c = self.contain("ResourceClaim", cobj, partial(parse_claim, cobj, self.classes, shared))
            if c is None:
                self.waiting[p.key] = self.contain.problems[label("ResourceClaim", cobj)]
                return p
            out.append(c)
        claims = tuple(out)
        try:  # what the claims amount to (a claim asking 10**6 GPUs is no request): the pod waits, says why
            gpu, nics = drafit.footprint(
                claims, list(self.snap.dra_devices.values()), self.snap.selector_cache
            )
            req = p.request
            classic = {"gpu": req.gpu.kind is not GpuKind.NONE and not dra_gpus, "nic": req.rdma_nics > 0}
            claimed = frozenset(
                r for r, asked in classic.items() if not asked
            )  # device-plugin asks stay classic
            return replace(
                p,
                request=replace(
                    req,
                    claims=claims,
                    claimed=claimed,
                    gpu=gpu if "gpu" in claimed else req.gpu,
                    rdma_nics=nics if "nic" in claimed else req.rdma_nics,
                    nic_same_pcie=req.nic_same_pcie and "nic" not in claimed,
                ),
            )
        except Exception as e:
            self.waiting[p.key] = (
                f"pod {p.key}: its ResourceClaims cannot be placed ({type(e).__name__}: {brief(e)})"
            )
            return p
