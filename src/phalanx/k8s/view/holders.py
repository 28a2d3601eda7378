"""Who holds each GPU: one table for the operator's two views (the dashboard's node details and
`phalanx status`), each of which says it its own way (JSON for the browser, text for a table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx.core.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Holder:
    """One of our pods on one GPU: the whole GPU, a MIG slice of it or a share of it."""

    pod: str
    workload: str
    mig: str | None = None  # "3g.40gb@4": the slice's profile and start slot
    share: float | None = None  # 0.5: the fraction of the GPU (a share, not a MIG slice)

    def as_json(self) -> dict[str, Any]:
        """`{"pod", "workload"}` and `mig` or `share` where it holds part of the GPU (the dashboard)."""
        out: dict[str, Any] = {"pod": self.pod, "workload": self.workload}
        if self.mig is not None:
            out["mig"] = self.mig
        elif self.share is not None:
            out["share"] = self.share
        return out

    def label(self) -> str:
        """`train-0`, `train-0 (MIG 3g.40gb@4)`, `infer-1 (0.5)` (`phalanx status`)."""
        if self.mig is not None:
            return f"{self.pod} (MIG {self.mig})"
        if self.share is not None:
            return f"{self.pod} ({self.share:g})"
        return self.pod


Holders = dict[tuple[int, int], list[Holder]]  # (node index, GPU index) -> who holds it


def gpu_holders(s: Snapshot) -> Holders:
    """Every allocation's pod on each GPU it holds, in the snapshot's allocation order."""
    holders: Holders = {}
    for a in s.allocations.values():
        d = a.devices
        for j in d.gpus:
            if d.mig is not None:
                h = Holder(a.task.name, a.task.workload, mig=f"{d.mig.profile}@{d.mig.start}")
            elif d.milli < 1000:
                h = Holder(a.task.name, a.task.workload, share=d.milli / 1000)
            else:
                h = Holder(a.task.name, a.task.workload)
            holders.setdefault((a.node, j), []).append(h)
    return holders
