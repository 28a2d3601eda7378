"""Devices for a task's claims on one node, as the Kubernetes structured allocator finds them.

The same exhaustive search (`k8s.io/dynamic-resource-allocation/structured`, stable
channel): claims in order, each request in order (`firstAvailable` subrequests in order until
one works), each device of a request one at a time over the devices the node can reach;
a device is taken if it matches the class's and the request's CEL selectors, its taints are
tolerated, it is free (or, if it allows multiple allocations, has the capacity left), its
counters are left in its counter set, and every constraint of the claim still holds
(`matchAttribute`, `distinctAttribute`); the first full solution wins. Two differences, both
documented in `docs/kubernetes.md`: devices are tried in the order the caller prefers (the
placement policy's choice of GPUs first, so that FGD and topology decide which GPUs, as for
every other task), and a CEL runtime error fails the node with the error as the reason (the
Kubernetes allocator stops the whole claim with it; the outcome, an unschedulable pod that
names the error, is the same).

`DraState` keeps what is taken; `Snapshot` updates it on every bind and unbind, so a
statement's rollback gives devices back with everything else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from phalanx.core.cel import CelError, compile_selector, context, evaluate
from phalanx.core.dra import (
    RESULTS_MAX,
    Claim,
    ClaimAllocation,
    ClaimConstraint,
    CounterSet,
    DeviceResult,
    DraDevice,
    ExactRequest,
)
from phalanx.core.errors import SpecError

DeviceId = tuple[str, str, str]


class SelectorCache:
    """CEL results per (expression, device). Devices change only with their slice's generation,
    and a new generation is a new device object (a new snapshot), so entries never go stale."""

    def __init__(self) -> None:
        self.results: dict[tuple[str, DeviceId], bool | CelError] = {}
        self.contexts: dict[DeviceId, object] = {}

    def matches(self, expression: str, device: DraDevice, where: str) -> bool:
        key = (expression, device.id)
        hit = self.results.get(key)
        if hit is None:
            sel = compile_selector(expression, where)
            ctx = self.contexts.get(device.id)
            if ctx is None:
                ctx = context(device.cel_view())
                self.contexts[device.id] = ctx
            try:
                hit = evaluate(sel, ctx)
            except CelError as e:
                hit = e
            self.results[key] = hit
        if isinstance(hit, CelError):
            raise hit
        return hit


@dataclass
class DraState:
    """Devices taken by allocated claims: whole, by capacity, by counters; claims allocated."""

    exclusive: dict[DeviceId, str] = field(default_factory=dict)  # device -> claim
    consumed: dict[DeviceId, dict[str, int]] = field(default_factory=dict)
    counters: dict[tuple[str, str, str], dict[str, int]] = field(default_factory=dict)
    claims: dict[str, list[object]] = field(default_factory=dict)  # claim -> [allocation, users]
    # bumped when devices of a node (or devices reachable from many nodes) change hands
    versions: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    node_index: dict[str, int] = field(default_factory=dict)
    shared_version: int = 0

    def set_nodes(self, names: Sequence[str]) -> None:
        self.node_index = {n: i for i, n in enumerate(names)}
        self.versions = np.zeros(len(names), dtype=np.int64)

    def _touch(self, alloc: ClaimAllocation, devices: Mapping[DeviceId, DraDevice]) -> None:
        for r in alloc.results:
            d = devices.get(r.id)
            i = self.node_index.get(d.node, -1) if d is not None and d.node else -1
            if i >= 0:
                self.versions[i] += 1
            else:
                self.shared_version += 1

    def take(self, alloc: ClaimAllocation, devices: Mapping[DeviceId, DraDevice]) -> None:
        hit = self.claims.get(alloc.claim)
        if hit is not None:
            hit[1] = int(hit[1]) + 1  # type: ignore[call-overload]
            return
        self.claims[alloc.claim] = [alloc, 1]
        for r in alloc.results:
            d = devices.get(r.id)
            if d is None or r.admin_access:
                continue
            if d.multi:
                used = self.consumed.setdefault(r.id, {})
                for k, v in r.consumed.items():
                    used[k] = used.get(k, 0) + v
            else:
                self.exclusive[r.id] = alloc.claim
            for cu in d.consumes:
                cs = self.counters.setdefault((d.driver, d.pool, cu.counter_set), {})
                for k, v in cu.counters.items():
                    cs[k] = cs.get(k, 0) + v
        self._touch(alloc, devices)

    def give(self, claim: str, devices: Mapping[DeviceId, DraDevice]) -> None:
        hit = self.claims.get(claim)
        if hit is None:
            return
        hit[1] = int(hit[1]) - 1  # type: ignore[call-overload]
        if int(hit[1]) > 0:  # type: ignore[call-overload]
            return
        del self.claims[claim]
        alloc = hit[0]
        assert isinstance(alloc, ClaimAllocation)
        for r in alloc.results:
            d = devices.get(r.id)
            if d is None or r.admin_access:
                continue
            if d.multi:
                used = self.consumed.get(r.id, {})
                for k, v in r.consumed.items():
                    used[k] = used.get(k, 0) - v
            else:
                self.exclusive.pop(r.id, None)
            for cu in d.consumes:
                cs = self.counters.get((d.driver, d.pool, cu.counter_set), {})
                for k, v in cu.counters.items():
                    cs[k] = cs.get(k, 0) - v
        self._touch(alloc, devices)

    def allocation(self, claim: str) -> ClaimAllocation | None:
        hit = self.claims.get(claim)
        return hit[0] if hit is not None else None  # type: ignore[return-value]


@dataclass
class Outcome:
    allocations: list[ClaimAllocation] | None
    why: str = ""  # when None: the first obstacle, naming the claim, request and selector


class _Search:
    """One allocation attempt on one node (the allocator's inner state)."""

    def __init__(
        self,
        node: str,
        devices: Sequence[DraDevice],
        counter_sets: Mapping[tuple[str, str, str], CounterSet],
        state: DraState,
        cache: SelectorCache,
    ) -> None:
        self.node = node
        self.devices = devices
        self.counter_sets = counter_sets
        self.state = state
        self.cache = cache
        self.taken: set[DeviceId] = set()
        self.consumed: dict[DeviceId, dict[str, int]] = {}
        self.counters: dict[tuple[str, str, str], dict[str, int]] = {}
        self.why = ""

    # ---------------------------------------------------------------- device checks
    def selectable(self, claim: Claim, req: ExactRequest, d: DraDevice) -> bool:
        for expr in req.selectors:
            try:
                if not self.cache.matches(expr, d, f"claim {claim.key}, request {req.name}"):
                    return False
            except CelError as e:
                raise SpecError(
                    f"claim {claim.key}, request {req.name}",
                    f"selector {expr!r} on device {'/'.join(d.id)}: CEL runtime error: {e}",
                ) from None
        if any(_cap_key(d, k) not in d.capacity for k in req.capacity):
            return False
        return all(any(t.tolerates(taint) for t in req.tolerations) for taint in d.taints)

    def amounts(self, req: ExactRequest, d: DraDevice) -> dict[str, int] | None:
        """Capacity a shared device gives this request, or None if it cannot."""
        out: dict[str, int] = {}
        asked_by = {_cap_key(d, k): v for k, v in req.capacity.items()}
        for name, total in d.capacity.items():
            asked = asked_by.get(name)
            policy = d.policies.get(name)
            if policy is not None:
                amount = policy.amount(asked)
                if amount is None:
                    return None
            else:
                amount = asked if asked is not None else total
            used = self.state.consumed.get(d.id, {}).get(name, 0) + self.consumed.get(d.id, {}).get(name, 0)
            if used + amount > total:
                return None
            out[name] = amount
        return out

    def counters_fit(self, d: DraDevice) -> bool:
        for cu in d.consumes:
            key = (d.driver, d.pool, cu.counter_set)
            cs = self.counter_sets.get(key)
            if cs is None:
                return False
            used = self.state.counters.get(key, {})
            mine = self.counters.get(key, {})
            for k, v in cu.counters.items():
                if used.get(k, 0) + mine.get(k, 0) + v > cs.counters.get(k, 0):
                    return False
        return True

    def free(self, req: ExactRequest, d: DraDevice, claim_taken: set[DeviceId]) -> bool:
        if d.id in claim_taken:
            return False
        if req.admin_access:
            return True
        if d.multi:
            return d.id not in self.state.exclusive and d.id not in self.taken
        return d.id not in self.state.exclusive and d.id not in self.taken and not self._partly_used(d)

    def _partly_used(self, d: DraDevice) -> bool:
        used = self.state.consumed.get(d.id) or self.consumed.get(d.id) or {}
        return any(v > 0 for v in used.values())

    def hold(self, d: DraDevice, amounts: dict[str, int] | None, admin: bool) -> None:
        if not admin:
            if d.multi:
                mine = self.consumed.setdefault(d.id, {})
                for k, v in (amounts or {}).items():
                    mine[k] = mine.get(k, 0) + v
            else:
                self.taken.add(d.id)
        for cu in d.consumes:
            mine = self.counters.setdefault((d.driver, d.pool, cu.counter_set), {})
            for k, v in cu.counters.items():
                mine[k] = mine.get(k, 0) + v

    def release(self, d: DraDevice, amounts: dict[str, int] | None, admin: bool) -> None:
        if not admin:
            if d.multi:
                mine = self.consumed[d.id]
                for k, v in (amounts or {}).items():
                    mine[k] -= v
            else:
                self.taken.discard(d.id)
        for cu in d.consumes:
            mine = self.counters[(d.driver, d.pool, cu.counter_set)]
            for k, v in cu.counters.items():
                mine[k] -= v

    # ---------------------------------------------------------------- the search
    def claim(self, claim: Claim) -> list[DeviceResult] | None:
        chosen: list[tuple[str, DraDevice, dict[str, int] | None, bool]] = []
        picked: set[DeviceId] = set()
        slots: list[tuple[object, tuple[tuple[str, ExactRequest], ...]]] = [
            (r, r.options()) for r in claim.requests
        ]
        if not self._request(claim, slots, 0, chosen, picked):
            return None
        out = []
        for name, d, amounts, admin in chosen:
            share = ""
            if d.multi and not admin:
                h = hashlib.sha1(f"{claim.key}|{name}|{'/'.join(d.id)}".encode()).hexdigest()
                share = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
            out.append(
                DeviceResult(
                    name, d.driver, d.pool, d.name, dict(amounts or {}) if d.multi else {}, share, admin
                )
            )
        return out

    def _request(
        self,
        claim: Claim,
        slots: list[tuple[object, tuple[tuple[str, ExactRequest], ...]]],
        k: int,
        chosen: list[tuple[str, DraDevice, dict[str, int] | None, bool]],
        picked: set[DeviceId],
    ) -> bool:
        if k == len(slots):
            return True
        for name, req in slots[k][1]:
            candidates = [d for d in self.devices if self.selectable(claim, req, d)]
            if not candidates:
                self.why = self.why or f"claim {claim.key}, request {name}: no device matches {_sel(req)}"
                continue
            need = len(candidates) if req.all else req.count
            if req.all and any(not self.free(req, d, picked) for d in candidates):
                self.why = (
                    self.why or f"claim {claim.key}, request {name}: asks for all devices, some are in use"
                )
                continue
            if len(chosen) + need > RESULTS_MAX:
                self.why = self.why or f"claim {claim.key}, request {name}: more than {RESULTS_MAX} devices"
                continue
            if self._devices(claim, slots, k, name, req, candidates, need, 0, chosen, picked):
                return True
        return False

    def _devices(
        self,
        claim: Claim,
        slots: list[tuple[object, tuple[tuple[str, ExactRequest], ...]]],
        k: int,
        name: str,
        req: ExactRequest,
        candidates: list[DraDevice],
        need: int,
        start: int,
        chosen: list[tuple[str, DraDevice, dict[str, int] | None, bool]],
        picked: set[DeviceId],
    ) -> bool:
        if need == 0:
            return self._request(claim, slots, k + 1, chosen, picked)
        for pos in range(start, len(candidates)):
            d = candidates[pos]
            if not self.free(req, d, picked):
                continue
            amounts = self.amounts(req, d) if d.multi and not req.admin_access else None
            if d.multi and not req.admin_access and amounts is None:
                self.why = (
                    self.why
                    or f"claim {claim.key}, request {name}: not enough capacity left on shared devices"
                )
                continue
            if not self.counters_fit(d):
                self.why = (
                    self.why or f"claim {claim.key}, request {name}: the devices' shared counters are used up"
                )
                continue
            if not _constraints_hold(claim.constraints, name, d, chosen):
                self.why = (
                    self.why or f"claim {claim.key}, request {name}: no device satisfies the constraints"
                )
                continue
            self.hold(d, amounts, req.admin_access)
            chosen.append((name, d, amounts, req.admin_access))
            picked.add(d.id)
            # identical devices are interchangeable: try the next ones only after this one
            if self._devices(claim, slots, k, name, req, candidates, need - 1, pos + 1, chosen, picked):
                return True
            picked.discard(d.id)
            chosen.pop()
            self.release(d, amounts, req.admin_access)
        if not self.why:
            self.why = f"claim {claim.key}, request {name}: {need} more free device(s) needed"
        return False


def _cap_key(d: DraDevice, name: str) -> str:
    """A capacity name of a request, qualified like the device's (an unqualified one is the driver's)."""
    return name if "/" in name else f"{d.driver}/{name}"


def _sel(req: ExactRequest) -> str:
    shown = " and ".join(repr(e) for e in req.selectors)
    return f"class {req.device_class}" + (f" ({shown})" if shown else "")


def _constraints_hold(
    constraints: Iterable[ClaimConstraint],
    name: str,
    d: DraDevice,
    chosen: list[tuple[str, DraDevice, dict[str, int] | None, bool]],
) -> bool:
    for c in constraints:
        if not c.applies(name):
            continue
        attr_name = c.match_attribute or c.distinct_attribute
        a = d.attribute(attr_name)
        if a is None:
            return False
        others = [o.attribute(attr_name) for n, o, _, _ in chosen if c.applies(n)]
        if c.match_attribute and any(o is None or o != a for o in others):
            return False
        if c.distinct_attribute and any(o is not None and o.value == a.value for o in others):
            return False
    return True


def allocate(
    node: str,
    devices: Sequence[DraDevice],
    counter_sets: Mapping[tuple[str, str, str], CounterSet],
    state: DraState,
    claims: Sequence[Claim],
    cache: SelectorCache,
) -> Outcome:
    """Allocations for the claims not yet allocated, on `node` (devices in the caller's order).

    A claim already allocated (shared with a pod placed earlier) is kept as it is if its devices
    are reachable from `node`, and makes the node unfit otherwise. Raises SpecError for a
    selector that does not compile or fails at run time (the claim is a bad object).
    """
    search = _Search(node, devices, counter_sets, state, cache)
    reachable = {d.id for d in devices}
    out: list[ClaimAllocation] = []
    for claim in claims:
        done = state.allocation(claim.key)
        if done is not None:
            if (done.node and done.node != node) or any(r.id not in reachable for r in done.results):
                return Outcome(None, f"claim {claim.key} is allocated on {done.node or 'other devices'}")
            out.append(done)
            continue
        results = search.claim(claim)
        if results is None:
            return Outcome(None, search.why or f"claim {claim.key}: no devices")
        local = {d.id for d in devices if d.node}
        out.append(
            ClaimAllocation(claim.key, node if any(r.id in local for r in results) else "", tuple(results))
        )
    return Outcome(out)
