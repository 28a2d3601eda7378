"""Kubernetes-style quantities: CPU as cores or millicores, memory as MiB or with binary/decimal suffixes."""

from __future__ import annotations

import math
import re

from phalanx.core.errors import SpecError

_MEM_UNITS = {
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
}
_QTY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def cpu_milli(value: object, where: str) -> int:
    """`8` or `8.5` cores, or `500m` millicores -> millicores."""
    if isinstance(value, bool):
        raise SpecError(where, f"CPU must be a number of cores or millicores like 500m, got {value!r}")
    if isinstance(value, int | float):
        out = float(value) * 1000
    elif isinstance(value, str):
        m = _QTY.match(value)
        if not m or m.group(2) not in ("", "m"):
            raise SpecError(where, f"CPU must be cores (8, 0.5) or millicores (500m), got {value!r}")
        out = float(m.group(1)) * (1 if m.group(2) == "m" else 1000)
    else:
        raise SpecError(where, f"CPU must be a number or a string, got {type(value).__name__}")
    if out < 0 or math.isnan(out) or math.isinf(out):
        raise SpecError(where, f"CPU must be >= 0, got {value!r}")
    return round(out)


def _binary(value: object, where: str, what: str, example: str, plain_bytes: float) -> float:
    """A number (in units of `plain_bytes` bytes) or a quantity with a suffix, in bytes."""
    if isinstance(value, bool):
        raise SpecError(where, f"{what} must be a number or a quantity like {example}, got {value!r}")
    if isinstance(value, int | float):
        out = float(value) * plain_bytes
    elif isinstance(value, str):
        m = _QTY.match(value)
        if not m or m.group(2) not in _MEM_UNITS:
            raise SpecError(where, f"{what} must be a number or a quantity like {example}, got {value!r}")
        unit = m.group(2)
        out = float(m.group(1)) * (plain_bytes if unit == "" else _MEM_UNITS[unit])
    else:
        raise SpecError(where, f"{what} must be a number or a string, got {type(value).__name__}")
    if out < 0 or math.isnan(out) or math.isinf(out):
        raise SpecError(where, f"{what} must be >= 0, got {value!r}")
    return out


def memory_mib(value: object, where: str) -> int:
    """A plain number is MiB; strings take Kubernetes suffixes (Gi, Mi, G, ...). Result in MiB."""
    return round(_binary(value, where, "memory (MiB)", "64Gi / 512Mi / 80G", 1024**2) / 1024**2)


def size_bytes(value: object, where: str) -> int:
    """Bytes as a number, or a quantity like 150Gi / 2T."""
    return round(_binary(value, where, "size (bytes)", "150Gi", 1.0))


def whole_number(value: object, where: str, minimum: int = 0, maximum: int | None = None) -> int:
    """A count such as `8`, `"8"` or `"8.0"`; anything else, or outside [minimum, maximum], is an error."""
    if isinstance(value, bool):
        raise SpecError(where, f"expected a whole number, got {value!r}")
    try:
        out = float(str(value))
    except ValueError:
        raise SpecError(where, f"expected a whole number, got {value!r}") from None
    if not math.isfinite(out) or out != int(out):
        raise SpecError(where, f"expected a whole number, got {value!r}")
    if out < minimum:
        raise SpecError(where, f"must be >= {minimum}, got {value!r}")
    if maximum is not None and out > maximum:
        raise SpecError(where, f"must be <= {maximum}, got {value!r:.40}")
    return int(out)
