"""Which backend serves a fractional GPU request: a MIG instance, an MPS share or a time-slice share.

A profile's `fraction_backend` policy lists the backends in order; a request is served by the
first that can place it now (`Session.place` tries them in turn). A pod may name one backend
itself (`phalanx.io/gpu-backend`), and then only that one serves it. Without a policy a fraction
is a time-slice share, as it always was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from phalanx.core.cluster import GEOMETRY_LIST, KIND_MIG, ClusterState
from phalanx.core.errors import SpecError
from phalanx.core.mig import MigGeometry, MigProfile
from phalanx.core.model import (
    GPU_BACKENDS,
    MIG_BACKEND,
    MILLI,
    TIME_SLICE_BACKEND,
    GpuKind,
    GpuRequest,
)

AUTO = "auto"  # the annotation value that leaves the choice to the profile
MigFor = Literal["memory", "fraction", "any"]


@dataclass(frozen=True, slots=True)
class FractionBackend:
    """A profile's policy: the backends in order; which asks MIG may serve (`memory`: only
    `gpu-memory` asks, whose size a MIG instance matches; `fraction`: only `gpu-fraction`; `any`)."""

    order: tuple[str, ...] = (TIME_SLICE_BACKEND,)
    mig_for: MigFor = "any"

    def __post_init__(self) -> None:
        bad = [b for b in self.order if b not in GPU_BACKENDS]
        if bad or not self.order or len(set(self.order)) != len(self.order):
            known = ", ".join(GPU_BACKENDS)
            raise SpecError("fraction_backend.order", f"must list distinct backends of {known}")

    @property
    def is_default(self) -> bool:
        return self.order == (TIME_SLICE_BACKEND,)


DEFAULT = FractionBackend()


def parse_override(value: str, where: str) -> tuple[str, ...]:
    """A pod's `phalanx.io/gpu-backend` annotation: one backend, or () for `auto`."""
    v = value.strip()
    if v == AUTO or v == "":
        return ()
    if v not in GPU_BACKENDS:
        raise SpecError(where, f"unknown GPU backend {value!r} (one of {', '.join((*GPU_BACKENDS, AUTO))})")
    return (v,)


def resolve(policy: FractionBackend, g: GpuRequest) -> tuple[str, ...]:
    """The backends that may serve `g`, in order: the pod's own choice, else the policy's
    (MIG only for the asks it is for, and only for one device: an instance is one device)."""
    if g.kind not in (GpuKind.FRACTION, GpuKind.MEMORY) or g.backends or policy.is_default:
        return g.backends
    kind = "memory" if g.kind is GpuKind.MEMORY else "fraction"
    mig_ok = g.devices == 1 and policy.mig_for in (kind, "any")
    return tuple(b for b in policy.order if b != MIG_BACKEND or mig_ok)


def serves(profile: MigProfile, geometry: MigGeometry, g: GpuRequest) -> bool:
    """A MIG instance serves the ask when its memory holds it (a fraction: that share of the whole
    GPU's memory) and, for a fraction, its compute is at least that share of the GPU's."""
    if profile.name.endswith("+me"):  # the media-engine variant: one per GPU, kept for media work
        return False
    if g.kind is GpuKind.MEMORY:
        return profile.memory_mib >= g.memory_mib
    whole = max(p.memory_mib for p in geometry.profiles.values())
    return profile.memory_mib * MILLI >= whole * g.milli and profile.compute * MILLI >= 7 * g.milli


def mig_profiles(c: ClusterState, g: GpuRequest) -> list[str]:
    """Profiles of the cluster's MIG GPUs that serve `g`, smallest (memory, then compute) first."""
    if g.devices != 1:
        return []
    geos = {int(x) for x in np.unique(c.mig_geo[c.gpu_kind == KIND_MIG])}
    fit: dict[str, tuple[int, int]] = {}
    for gid in sorted(geos):
        geo = GEOMETRY_LIST[gid]
        for p in geo.profiles.values():
            if serves(p, geo, g):
                fit[p.name] = (p.memory_mib, p.compute)
    return sorted(fit, key=lambda n: (*fit[n], n))
