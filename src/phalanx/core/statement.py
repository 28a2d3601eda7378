"""Undoable operations on a snapshot: the all-or-nothing machinery for gangs and evictions.

Modelled on KAI's Statement. Every allocate/evict is applied at once (so later
placements see it) and journaled; `rollback(checkpoint)` undoes back to a point,
`discard()` undoes everything, `commit()` hands the operations to the session as
decisions. The session undoes committed operations too when the cycle ends, so
`run_cycle` never changes the caller's snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

from phalanx.core.snapshot import Allocation, Snapshot


class Op(NamedTuple):
    """One journaled operation (a named tuple: made at every bind and eviction a try does or undoes,
    and a frozen dataclass costs several times as much to make)."""

    kind: Literal["bind", "evict"]
    alloc: Allocation
    reason: str = ""
    by: str = ""  # evictions: the workload they make room for
    cost: float = 0.0  # evictions: GPU-seconds lost with it (`Evict.cost`)


class Statement:
    """A journal of operations on one snapshot."""

    def __init__(
        self,
        snapshot: Snapshot,
        on_commit: list[Op] | None = None,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._ops: list[Op] = []
        self._sink = on_commit
        self._on_release = on_release
        self._closed = False

    @property
    def ops(self) -> list[Op]:
        return list(self._ops)

    def allocate(self, alloc: Allocation) -> None:
        self._check_open()
        self._snapshot._bind(alloc)
        self._ops.append(Op("bind", alloc))

    def evict(self, alloc: Allocation, reason: str, by: str = "", cost: float = 0.0) -> None:
        self._check_open()
        self._snapshot._unbind(alloc)
        self._ops.append(Op("evict", alloc, reason, by, cost))
        if self._on_release is not None:
            self._on_release()

    def checkpoint(self) -> int:
        return len(self._ops)

    def rollback(self, checkpoint: int) -> None:
        """Undo operations back to `checkpoint`, newest first."""
        self._check_open()
        while len(self._ops) > checkpoint:
            undo(self._snapshot, self._ops.pop())

    def discard(self) -> None:
        self.rollback(0)
        self._closed = True

    def commit(self) -> list[Op]:
        """Keep the operations; they become decisions of the cycle."""
        self._check_open()
        ops, self._ops = self._ops, []
        if self._sink is not None:
            self._sink.extend(ops)
        self._closed = True
        return ops

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("statement already committed or discarded")


def undo(snapshot: Snapshot, op: Op) -> None:
    if op.kind == "bind":
        snapshot._unbind(op.alloc)
    else:
        snapshot._bind(op.alloc)
