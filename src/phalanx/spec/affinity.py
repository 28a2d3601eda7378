"""Kubernetes-shaped `nodeSelectorTerms` (pod specs and workload YAML) -> core node affinity terms."""

from __future__ import annotations

from typing import Any

from phalanx.core.affinity import NodeRequirement, NodeSelectorTerm
from phalanx.core.errors import SpecError


def node_selector_terms(raw: Any, where: str) -> tuple[NodeSelectorTerm, ...]:
    """Each term: {matchExpressions: [{key, operator, values}], matchFields: [...]}; terms are ORed."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise SpecError(where, "nodeSelectorTerms must be a non-empty list")
    terms = []
    for i, term in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(term, dict):
            raise SpecError(w, "a node selector term must be a mapping")
        unknown = set(term) - {"matchExpressions", "matchFields"}
        if unknown:
            raise SpecError(w, f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        reqs = [
            _requirement(e, f"{w}.{part}[{j}]", part == "matchFields")
            for part in ("matchExpressions", "matchFields")
            for j, e in enumerate(_list(term.get(part), f"{w}.{part}"))
        ]
        terms.append(tuple(reqs))
    return tuple(terms)


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError(where, "must be a list")
    return value


def _requirement(e: Any, where: str, on_field: bool) -> NodeRequirement:
    if not isinstance(e, dict):
        raise SpecError(where, "a requirement must be a mapping with key, operator and values")
    values = _list(e.get("values"), f"{where}.values")
    try:
        return NodeRequirement(
            str(e.get("key") or ""), str(e.get("operator") or ""), tuple(str(v) for v in values), on_field
        )
    except SpecError as err:
        raise err.located(where) from None
