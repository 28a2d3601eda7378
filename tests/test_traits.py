"""Optional plugin traits are declared in the class statement and checked when a profile compiles."""

from __future__ import annotations

import pytest

from phalanx.core import traits
from phalanx.core.extension import ClassKeyed, CycleHooks
from phalanx.core.snapshot import WorkloadEntry
from phalanx.plugins.order import LasOrder, PriorityOrder, SrtfOrder
from phalanx.plugins.reservation import ReservationFilter
from phalanx.profiles import REGISTRIES, builtin_names, load_profile


def test_every_registered_plugin_declares_what_it_has() -> None:
    seen = 0
    for point, registry in REGISTRIES.items():
        for name, factory in registry.items():
            assert isinstance(factory, type)
            traits.check_class(factory, f"{point}.{name}")
            seen += 1
    assert seen >= 25


def test_the_core_reads_declared_traits() -> None:
    las, prio, srtf = LasOrder(), PriorityOrder(), SrtfOrder()
    assert traits.cycle_hooks([prio, las, srtf]) == [las]
    assert traits.change_forecasts([prio, las, srtf]) == [las]
    res = ReservationFilter()
    assert traits.node_bounds([res]) == [res] and traits.class_keyed([res]) == [res]
    assert (prio.static, prio.natural, srtf.cycle_static, las.natural) == (True, True, True, False)
    assert LasOrder(within="arrival").cycle_static and not LasOrder(within="queue").cycle_static


class Undeclared:
    """Has a class_key that the core would silently ignore: refused."""

    name = "undeclared"

    def class_key(self, session: object, task: object, request: object) -> int:
        return 0


class HalfHooks(CycleHooks):
    """Claims the hooks but has only one of them: refused."""

    def begin_cycle(self, entries: list[WorkloadEntry]) -> None:
        pass


class Keyed(ClassKeyed):
    def class_key(self, session: object, task: object, request: object) -> int:
        return 0


def test_a_claim_and_the_methods_must_agree() -> None:
    with pytest.raises(TypeError, match="has class_key\\(\\) but does not declare ClassKeyed"):
        traits.check(Undeclared(), "scorers[0]")
    with pytest.raises(TypeError, match="declares CycleHooks but has no end_cycle\\(\\)"):
        traits.check(HalfHooks(), "order[0]")  # type: ignore[abstract]  # mypy refuses it too
    traits.check(Keyed(), "scorers[0]")


@pytest.mark.parametrize("name", builtin_names())
def test_every_builtin_profile_compiles_with_its_traits_checked(name: str) -> None:
    assert load_profile(name).name
