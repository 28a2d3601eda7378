"""The two Node annotations through which the scheduler's MIG repartitions reach the node (issue 42).

- `phalanx.io/mig-layout`, written by the scheduler: per GPU index, the instances it wants and when it
  asked (`{"0": {"layout": ["1g.10gb@0", ...], "at": 1765000000.0}}`).
- `phalanx.io/mig-layout-status`, written by the node agent (`phalanx node discover --mig-recut`):
  per GPU index, its answer to the request of that time (`{"0": {"at": ..., "state": "applied",
  "reason": ""}}`; state `applied`, `refused` (an instance in use) or `failed` (NVML refused)).

A GPU is being cut while the request has no answer; the time in both says which request an answer is
for, so an old answer never stands for a new request. Both sides read them here, so they agree.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from phalanx.core.errors import SpecError
from phalanx.spec.common import validate

LAYOUT = "phalanx.io/mig-layout"
STATUS = "phalanx.io/mig-layout-status"


class Want(BaseModel):
    model_config = ConfigDict(extra="forbid")
    layout: list[str] = Field(default_factory=list)
    at: float

    def same(self, instances: list[str] | tuple[str, ...]) -> bool:
        return sorted(self.layout) == sorted(instances)


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at: float
    state: Literal["applied", "refused", "failed"]
    reason: str = ""

    def answers(self, want: Want) -> bool:
        return self.at == want.at


def _read(text: str | None, model: type[Want] | type[Answer], where: str) -> dict[int, Want | Answer]:
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(where, f"not valid JSON: {e.msg} at character {e.pos}") from None
    if not isinstance(raw, dict):
        raise SpecError(where, 'expected a JSON object by GPU index, such as {"0": {...}}')
    out: dict[int, Want | Answer] = {}
    for k, v in raw.items():
        if not str(k).isdigit():
            raise SpecError(f"{where}.{k}", "expected a GPU index")
        out[int(k)] = validate(model, v, f"{where}.{k}")
    return out


def wants(text: str | None, where: str) -> dict[int, Want]:
    """The layouts the scheduler asked for, by GPU index (SpecError naming `where` when malformed)."""
    return {k: v for k, v in _read(text, Want, where).items() if isinstance(v, Want)}


def answers(text: str | None, where: str) -> dict[int, Answer]:
    """The agent's answers, by GPU index."""
    return {k: v for k, v in _read(text, Answer, where).items() if isinstance(v, Answer)}


def dump(items: dict[int, Want] | dict[int, Answer]) -> str:
    return json.dumps(
        {str(k): v.model_dump() for k, v in sorted(items.items())}, separators=(",", ":"), sort_keys=True
    )
