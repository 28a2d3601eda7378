"""MIG geometry: the profiles each GPU model offers and where each may start.

The placement tables follow NVIDIA's `nvidia-smi mig -lgipp` output, identical for
A100, H100 and H200: eight memory slots, seven compute slices. A profile of `size`
slots may start only at its listed slots; instances never overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.core.errors import SpecError

TOTAL_SLOTS = 8
TOTAL_COMPUTE = 7

# (GI profile id, compute slices, memory slots, valid starts, instances cap or 0 = by geometry)
_SHAPES: dict[str, tuple[int, int, int, tuple[int, ...], int]] = {
    "1g": (19, 1, 1, (0, 1, 2, 3, 4, 5, 6), 0),
    "1g+me": (20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    "1g.2x": (15, 1, 2, (0, 2, 4, 6), 0),
    "2g": (14, 2, 2, (0, 2, 4), 0),
    "3g": (9, 3, 4, (0, 4), 0),
    "4g": (5, 4, 4, (0,), 0),
    "7g": (0, 7, 8, (0,), 0),
}


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one GPU model, e.g. H100-80GB `3g.40gb`."""

    name: str
    gi_profile_id: int
    compute: int
    slots: int
    starts: tuple[int, ...]
    memory_mib: int
    max_instances: int

    def slot_mask(self, start: int) -> int:
        return ((1 << self.slots) - 1) << start


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """The MIG profile table of one GPU model."""

    model: str
    profiles: dict[str, MigProfile]

    def profile(self, name: str) -> MigProfile:
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.profiles))
            raise SpecError(
                "mig_profile", f"unknown MIG profile {name!r} for {self.model} (known: {known})"
            ) from None

    def free_starts(self, profile: MigProfile, used_mask: int, used_compute: int) -> list[int]:
        """Valid starts for `profile` given the slots and compute already taken."""
        if used_compute + profile.compute > TOTAL_COMPUTE:
            return []
        return [s for s in profile.starts if used_mask & profile.slot_mask(s) == 0]


def _geometry(model: str, gb: dict[str, int]) -> MigGeometry:
    """Build a table from the memory size (GB) each shape has on this model."""
    profiles: dict[str, MigProfile] = {}
    for shape, (gi, compute, slots, starts, cap) in _SHAPES.items():
        if shape == "1g+me":
            name = f"1g.{gb['1g']}gb+me"
            mem = gb["1g"]
        elif shape == "1g.2x":
            name = f"1g.{gb['2g']}gb"
            mem = gb["2g"]
        else:
            name = f"{shape}.{gb[shape]}gb"
            mem = gb[shape]
        profiles[name] = MigProfile(name, gi, compute, slots, starts, mem * 1024, cap or len(starts))
    return MigGeometry(model, profiles)


GEOMETRIES: dict[str, MigGeometry] = {
    "A100-40GB": _geometry("A100-40GB", {"1g": 5, "2g": 10, "3g": 20, "4g": 20, "7g": 40}),
    "A100-80GB": _geometry("A100-80GB", {"1g": 10, "2g": 20, "3g": 40, "4g": 40, "7g": 80}),
    "H100-80GB": _geometry("H100-80GB", {"1g": 10, "2g": 20, "3g": 40, "4g": 40, "7g": 80}),
    "H100-94GB": _geometry("H100-94GB", {"1g": 12, "2g": 24, "3g": 47, "4g": 47, "7g": 94}),
    "H200-141GB": _geometry("H200-141GB", {"1g": 18, "2g": 35, "3g": 71, "4g": 71, "7g": 141}),
}


def resolve_geometry(model: str, memory_mib: int) -> MigGeometry | None:
    """The MIG table for a GPU model string such as `NVIDIA-H100-80GB-HBM3`, or None."""
    key = model.upper().replace("_", "-")
    if key in GEOMETRIES:
        return GEOMETRIES[key]
    gib = memory_mib / 1024
    if "A100" in key:
        return GEOMETRIES["A100-40GB" if gib < 60 else "A100-80GB"]
    if "H200" in key:
        return GEOMETRIES["H200-141GB"]
    if "H100" in key:
        return GEOMETRIES["H100-80GB" if gib < 88 else "H100-94GB"]
    return None
