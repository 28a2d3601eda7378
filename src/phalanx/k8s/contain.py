"""Bad objects are left out, named, and never stop the cycle: the one place that decides how.

Every translation of an API object (Node, Pod, PodGroup, Queue, and the kinds added later)
runs through `Contain`. Whatever it raises, a SpecError that says what is wrong or any other
error, becomes one message that starts with the object's kind and name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from phalanx.core.errors import SpecError

log = logging.getLogger("phalanx.k8s")
T = TypeVar("T")


def label(kind: str, obj: dict[str, Any]) -> str:
    """`Pod team-a/train-0`, `Node gpu-3`: how every message names an object."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{kind} {ns}/{meta.get('name', '')}" if ns else f"{kind} {meta.get('name', '')}"


def named(kind: str, obj: dict[str, Any], text: str) -> str:
    """The message with the object's label in front (once, whatever the inner code wrote)."""
    lab = label(kind, obj)
    rest = lab.split(" ", 1)[1]
    for prefix in (lab, f"{kind.lower()} {rest}"):
        if text.startswith(prefix):
            return lab + text[len(prefix) :]
    return f"{lab}: {text}"


def describe(kind: str, obj: dict[str, Any], e: Exception) -> str:
    if isinstance(e, SpecError):
        return named(kind, obj, str(e))
    log.warning("%s could not be read", label(kind, obj), exc_info=e)
    return named(kind, obj, f"cannot be read ({type(e).__name__}: {e})")


class Contain:
    """Runs each object's translation; any error leaves that object out with a message that names it."""

    def __init__(self) -> None:
        self.problems: dict[str, str] = {}  # label -> message

    def __call__(self, kind: str, obj: dict[str, Any], fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except Exception as e:
            self.problems[label(kind, obj)] = describe(kind, obj, e)
            return None
