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


def brief(e: Exception) -> str:
    """An error in one line: a problem line is one line (pydantic's own are several, with a URL)."""
    errors = getattr(e, "errors", None)
    if callable(errors) and type(e).__name__ == "ValidationError":
        try:
            return "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in errors()[:3])
        except Exception:  # an errors() of another shape: the text, flattened
            pass
    return " ".join(str(e).split())


def describe(kind: str, obj: dict[str, Any], e: Exception) -> str:
    if isinstance(e, SpecError):
        return named(kind, obj, " ".join(str(e).split()))
    log.warning("%s could not be read", label(kind, obj), exc_info=e)
    return named(kind, obj, f"cannot be read ({type(e).__name__}: {brief(e)})")


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


def mapping(x: Any) -> dict[str, Any]:
    """`x` if it is a mapping, else {}: for fields read after the object's own translation passed."""
    return x if isinstance(x, dict) else {}


def mappings(x: Any) -> list[dict[str, Any]]:
    """The mappings of a list field (anything else in it, or a field that is no list: none)."""
    return [e for e in x if isinstance(e, dict)] if isinstance(x, list) else []


def shape(obj: dict[str, Any]) -> str:
    """What is wrong with an object's outline (what every reader of it takes for granted), or ""."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return "metadata is not a mapping"
    for f in ("labels", "annotations"):
        if meta.get(f) is not None and not isinstance(meta[f], dict):
            return f"metadata.{f} is not a mapping"
    for f in ("spec", "status"):
        if obj.get(f) is not None and not isinstance(obj[f], dict):
            return f"{f} is not a mapping"
    return ""


def outlined(kind: str, objs: list[dict[str, Any]], contain: Contain) -> list[dict[str, Any]]:
    """The objects whose outline can be read; the others left out, each named in one problem."""
    out = []
    for obj in objs:
        why = shape(obj) if isinstance(obj, dict) else "not a mapping"
        if not why:
            out.append(obj)
        elif isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
            contain.problems[label(kind, obj)] = f"{label(kind, obj)}: cannot be read ({why}); left out"
    return out
