"""The optional traits a plugin declares, read by name instead of probed.

A plugin takes an optional trait (`ClassKeyed`, `NodeBound`, `CycleHooks`, `ChangeForecast`)
by subclassing its Protocol, so the claim is in the class statement and mypy checks its
signatures. `check` runs when a profile is compiled: a plugin that claims a trait has its
methods, and one that has them claims it (a `class_key` nobody declared would otherwise be
silently ignored). The core then asks `declared(...)`, not getattr.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from phalanx.core.extension import ChangeForecast, ClassKeyed, CycleHooks, NodeBound

TRAITS: tuple[type[Any], ...] = (ClassKeyed, NodeBound, CycleHooks, ChangeForecast)


def methods(trait: type[Any]) -> list[str]:
    """The methods a trait's Protocol names."""
    return [m for m, v in vars(trait).items() if not m.startswith("_") and callable(v)]


def claims(plugin: object, trait: type[Any]) -> bool:
    return trait in type(plugin).__mro__


def check(plugin: object, where: str) -> None:
    """A plugin's declared traits match the methods it has; a mismatch is a bug in the plugin."""
    check_class(type(plugin), where)


def check_class(cls: type[Any], where: str) -> None:
    for trait in TRAITS:
        claimed = trait in cls.__mro__
        for m in methods(trait):
            has = getattr(cls, m, None) not in (None, vars(trait)[m])
            if claimed and not has:
                raise TypeError(f"{where}: {cls.__name__} declares {trait.__name__} but has no {m}()")
            if has and not claimed:
                raise TypeError(f"{where}: {cls.__name__} has {m}() but does not declare {trait.__name__}")


def class_keyed(plugins: Iterable[object]) -> list[ClassKeyed]:
    return [cast(ClassKeyed, p) for p in plugins if claims(p, ClassKeyed)]


def node_bounds(plugins: Iterable[object]) -> list[NodeBound]:
    return [cast(NodeBound, p) for p in plugins if claims(p, NodeBound)]


def cycle_hooks(plugins: Iterable[object]) -> list[CycleHooks]:
    return [cast(CycleHooks, p) for p in plugins if claims(p, CycleHooks)]


def change_forecasts(plugins: Iterable[object]) -> list[ChangeForecast]:
    return [cast(ChangeForecast, p) for p in plugins if claims(p, ChangeForecast)]
