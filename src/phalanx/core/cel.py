"""CEL device selectors, as Kubernetes evaluates them for DRA (`resource.k8s.io/v1`).

An expression sees `device.driver`, `device.attributes[domain][name]`,
`device.capacity[domain][name]` and `device.allowMultipleAllocations`, with Kubernetes'
quantity and semver libraries. The evaluator is the `common-expression-language` package
(a Rust CEL engine): it gave the right answer on every selector example of the Kubernetes
and NVIDIA documentation we tried, and evaluates one selector in about a microsecond
(`cel-python`, pure Python, is two orders of magnitude slower; `cel-expr-python` needs
protobuf descriptors for every custom function).

Quantities are integers in thousandths of the unit (`quantity("1.5")` is 1500, `40Gi` is
42,949,672,960,000), so that they compare with `<` and `==` as well as with `compareTo`;
versions are strings compared as semver by the version functions. Each expression is
compiled once (`compile_selector`); a result is cached per (expression, device).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from phalanx.core.errors import SpecError

_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:[eE]([+-]?[0-9]+))?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


def milli(text: str | int | float, where: str = "quantity") -> int:
    """A Kubernetes quantity in thousandths of its unit (`500m` -> 500, `2Gi` -> 2147483648000)."""
    if isinstance(text, bool):
        raise SpecError(where, f"not a quantity: {text!r}")
    if isinstance(text, int):
        return text * 1000
    if isinstance(text, float):
        return round(text * 1000)
    m = _QUANTITY.match(text.strip())
    if not m:
        raise SpecError(where, f"not a quantity: {text!r}")
    try:
        value = Fraction(m.group(1))
    except ValueError:
        raise SpecError(where, f"not a quantity: {text!r}") from None
    if m.group(2):
        value *= Fraction(10) ** int(m.group(2))
    unit = m.group(3) or ""
    scaled = value if unit == "m" else value * 1000 * _SUFFIX[unit]
    return -(-scaled.numerator // scaled.denominator)  # rounded up, as Kubernetes rounds quantities


def semver_key(v: str) -> tuple[int, int, int, tuple[tuple[int, Any], ...], int]:
    m = _SEMVER.match(v)
    if not m:
        raise ValueError(f"not a semantic version: {v!r}")
    pre = m.group(4)
    parts: tuple[tuple[int, Any], ...] = ()
    if pre:
        parts = tuple((0, int(p)) if p.isdigit() else (1, p) for p in pre.split("."))
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), parts, 0 if pre else 1


def _cmp(a: Any, b: Any) -> int:
    if isinstance(a, str) and isinstance(b, str):
        ka, kb = semver_key(a), semver_key(b)
        return (ka > kb) - (ka < kb)
    return int((a > b) - (a < b))


def _quantity(text: str) -> int:
    try:
        return milli(text)
    except SpecError as e:
        raise ValueError(e.message) from None


def _is_quantity(text: str) -> bool:
    try:
        milli(text)
        return True
    except SpecError:
        return False


def _semver(text: str) -> str:
    semver_key(text)
    return text


def _is_semver(text: str) -> bool:
    return bool(_SEMVER.match(text))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": _cmp,
    "isLessThan": lambda a, b: _cmp(a, b) < 0,
    "isGreaterThan": lambda a, b: _cmp(a, b) > 0,
    "asInteger": lambda q: q // 1000,
    "asApproximateFloat": lambda q: q / 1000,
    "isInteger": lambda q: q % 1000 == 0,
    "sign": lambda q: (q > 0) - (q < 0),
    "add": lambda a, b: a + b,  # quantity + quantity (an integer argument counts in thousandths)
    "sub": lambda a, b: a - b,
    "major": lambda v: semver_key(v)[0],
    "minor": lambda v: semver_key(v)[1],
    "patch": lambda v: semver_key(v)[2],
}


@dataclass(frozen=True, slots=True)
class Selector:
    expression: str
    program: Any


_COMPILED: dict[str, Selector] = {}


def compile_selector(expression: str, where: str) -> Selector:
    """Compile once; a syntax error is a SpecError naming `where` (the claim or class)."""
    hit = _COMPILED.get(expression)
    if hit is not None:
        return hit
    import cel as _cel  # here, not at import: the package loads its CLI's prompt_toolkit (0.1 s of start)

    try:
        program = _cel.compile(expression)
    except Exception as e:  # the engine raises ValueError with the parser's message
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecError(where, f"CEL selector does not compile: {first}") from None
    sel = Selector(expression, program)
    _COMPILED[expression] = sel
    return sel


class CelError(Exception):
    """A selector failed at run time on a device (a missing attribute, a type mismatch)."""


def context(device: Mapping[str, Any]) -> Any:
    """The evaluation context of one device (build it once per device and reuse it)."""
    import cel as _cel

    return _cel.Context(variables={"device": dict(device)}, functions=FUNCTIONS)


def evaluate(sel: Selector, ctx: Any) -> bool:
    try:
        out = sel.program.execute(ctx)
    except Exception as e:  # the engine's own errors, as Kubernetes reports them
        raise CelError(f"{type(e).__name__}: {e}") from None
    if not isinstance(out, bool):
        raise CelError(f"the expression gave {type(out).__name__}, not a bool")
    return out
