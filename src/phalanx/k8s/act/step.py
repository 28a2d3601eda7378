"""What became of one pod's bind, or of a gang's GPU shares, this cycle: a typed answer rather than
a word or a reason in one string ("bound", "later", "" or why), so that a reason can never be read
as a state. A state's value is the word the executor has always used for it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class Step(StrEnum):
    # the pod is bound where the cycle chose (by this call, or an earlier one that got through)
    BOUND = "bound"
    # the gang's shares all have their GPU and ConfigMap: bind now
    READY = "ready"
    # not now (API trouble, a reservation pod waiting for its GPU): the plan stays, a cycle retries
    LATER = "later"


@dataclass(frozen=True, slots=True)
class Broke:
    """The gang cannot go where it was placed: why, as logged and written to its Events."""

    why: str


BindStep = Literal[Step.BOUND, Step.LATER] | Broke  # one pod's bind (`Executor._bind_one`)
ShareStep = Literal[Step.READY, Step.LATER] | Broke  # a gang's GPU shares (`Shares.prepare`)
