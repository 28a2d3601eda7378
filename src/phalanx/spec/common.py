"""Shared helpers for the YAML specs: loading, and turning pydantic errors into located SpecErrors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from phalanx.core.errors import SpecError

M = TypeVar("M", bound=BaseModel)


def loc_str(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def validate(model: type[M], data: object, source: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(x for x in err["loc"] if not _is_type_tag(x))
        msg = err["msg"]
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        raise SpecError(f"{source}: {loc_str(loc)}", msg) from None


_SCALAR_TAGS = {"int", "float", "str", "bool", "list", "dict", "none"}


def _is_type_tag(part: int | str) -> bool:
    """Pydantic puts union member names (`GpuGroupSpec`, `list[GpuSpec]`, `int`) into error locations."""
    if isinstance(part, int):
        return False
    return part in _SCALAR_TAGS or any(ch.isupper() or ch in "[(" for ch in part)


@contextmanager
def at(where: str) -> Iterator[None]:
    """Prefix any SpecError raised inside with `where`."""
    try:
        yield
    except SpecError as e:
        raise e.located(where) from None


def load_yaml(path: str | Path) -> Any:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError(str(p), f"cannot read file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SpecError(str(p), "not a text file: expected YAML") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise SpecError(where, f"not valid YAML: {getattr(e, 'problem', e)}") from None


def pairs(text: str, flag: str, what: str) -> list[tuple[str, str]]:
    """`a=b,c=d` (a command-line flag) -> [(a, b), (c, d)]; `what` names the pair in errors."""
    out = []
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise SpecError(flag, f"expected {what} pairs, got {part!r}")
        k, v = (x.strip() for x in part.split("=", 1))
        if not k or not v:
            raise SpecError(flag, f"empty name or value in {part!r}")
        out.append((k, v))
    return out
