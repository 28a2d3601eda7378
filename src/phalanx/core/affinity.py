"""Required node affinity with Kubernetes semantics, so that a pod never lands where it said it must not.

Terms are ORed, the requirements inside a term ANDed; an empty term matches no node (as in
kube-scheduler). `on_field` requirements test the node name (`matchFields` on `metadata.name`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from phalanx.core.errors import SpecError

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()
    on_field: bool = False

    def __post_init__(self) -> None:
        if not self.key:
            raise SpecError("key", "a node affinity requirement needs a key")
        if self.operator not in OPERATORS:
            raise SpecError("operator", f"must be one of {', '.join(OPERATORS)}, got {self.operator!r}")
        if self.operator in ("In", "NotIn") and not self.values:
            raise SpecError("values", f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise SpecError("values", f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (len(self.values) != 1 or not _is_int(self.values[0])):
            raise SpecError("values", f"operator {self.operator} needs exactly one integer value")
        if self.on_field and (self.key != "metadata.name" or self.operator not in ("In", "NotIn")):
            raise SpecError("matchFields", "only metadata.name with In or NotIn is supported")

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        value = name if self.on_field else labels.get(self.key)
        op = self.operator
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if value is None or not _is_int(value):
            return False
        bound = int(self.values[0])
        return int(value) > bound if op == "Gt" else int(value) < bound


NodeSelectorTerm = tuple[NodeRequirement, ...]


def affinity_matches(name: str, labels: Mapping[str, str], terms: tuple[NodeSelectorTerm, ...]) -> bool:
    """No terms: no constraint. Otherwise some non-empty term must match in full."""
    if not terms:
        return True
    return any(term and all(r.matches(name, labels) for r in term) for term in terms)


def describe(terms: tuple[NodeSelectorTerm, ...]) -> str:
    def one(r: NodeRequirement) -> str:
        vals = ",".join(r.values)
        return f"{r.key} {r.operator}" + (f" ({vals})" if vals else "")

    return " or ".join("[" + ", ".join(one(r) for r in t) + "]" for t in terms)


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
