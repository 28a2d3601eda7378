"""Reserve: the large gang at the head of the line gets nodes earmarked as they free up.

The oldest pending gang asking for at least `min_gpus` GPUs is the head. From the running
tasks' expected ends (start + `estimated_runtime`; unknown means never), we find the earliest
time its tasks fit and the nodes that give it. Until then, other workloads may use those
nodes only if they will finish before that time (the `reservation` filter), so the big gang
is never starved by a stream of small ones. With `min_wait`, only a head that has waited that
many seconds gets nodes earmarked: before that it competes in the workload order like any other,
and the nodes it would hold back keep working. `head: queue` takes the head from the queue the
profile's queue order serves first (furthest below its fair share) rather than the oldest of
all queues: a rich queue's old gang then does not hold back the nodes a poor queue needs.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from phalanx.actions.gang import gang_tasks
from phalanx.core.cluster import KIND_SHARED
from phalanx.core.model import MILLI
from phalanx.core.session import Reservation, Session
from phalanx.core.snapshot import Snapshot, WorkloadEntry


def oldest(s: Snapshot, key: tuple[object, ...]) -> list[WorkloadEntry]:
    """The oldest unbound workload of each priority in a pending group (by creation, then name).

    The group's order is by priority, then creation, then name, so each priority's first
    unbound workload is its oldest: the group's oldest is among these few, and a cycle does not
    look at every workload of a long backlog.
    """
    group = s.pending_groups[key]
    order = s.group_order[key]
    out: list[WorkloadEntry] = []
    i = 0
    while i < len(order):
        negp, _, name = order[i]
        e = group[name]
        if e.bound:
            i += 1
            continue
        out.append(e)  # this priority's oldest unbound one: on to the next priority
        i = bisect.bisect_left(order, (negp + 1,), i)  # a creation time may be inf: by priority alone
    return out


class Reserve:
    name = "reserve"

    def __init__(self, min_gpus: int = 8, min_wait: float = 0.0, head: str = "oldest") -> None:
        if not min_wait >= 0:
            raise ValueError("min_wait must be >= 0 seconds")
        if head not in ("oldest", "queue"):
            raise ValueError(f"head must be oldest or queue, got {head!r}")
        self.min_gpus = min_gpus
        self.min_wait = min_wait
        self.by_queue = head == "queue"
        self._large: dict[object, bool] = {}  # per demand key: a gang of min_gpus or more

    def execute(self, session: Session) -> None:
        s = session.snapshot
        heads = []
        large = self._large
        for key, group in s.pending_groups.items():
            big = large.get(key)
            if big is None:  # every workload of a group asks for the same: worked out once a group
                sample = next(iter(group.values()))
                gpus = sorted((t.request.gpu.total_milli for t in sample.tasks), reverse=True)
                big = large[key] = sum(gpus[: sample.workload.gang_size]) >= self.min_gpus * MILLI
                if len(large) > 65536:  # bounded: the shapes of workloads long gone go
                    large.clear()
            if big:
                heads += [e for e in group.values() if not e.bound] if self.by_queue else oldest(s, key)
        if not heads:
            return
        if self.by_queue:
            first = min({e.workload.queue for e in heads}, key=session.queue_key)
            heads = [e for e in heads if e.workload.queue == first]
        head = min(heads, key=lambda e: (e.workload.creation_time, e.name))
        if self.min_wait and session.clock - head.workload.creation_time < self.min_wait:
            due = head.workload.creation_time + self.min_wait
            session.wake_at(due, f"reserve: {head.name} has waited min_wait")
            return  # the oldest has not waited long enough: nobody has
        gang, _ = gang_tasks(head)
        req = session.effective(gang[0].request)
        d = max(1, req.gpu.devices) if req.gpu.total_milli >= MILLI else 1
        c = s.cluster
        times = np.sort(self.gpu_free_times(session), axis=1)  # per node, when 1, 2, ... GPUs are free
        usable = c.node_ready & s.static_mask(req)
        at: list[np.ndarray] = []  # (when, node) slots: a node's k-th slot is when k tasks fit there
        on: list[np.ndarray] = []
        most = min(len(gang), times.shape[1] // d)
        for k in range(1, most + 1):
            t = times[:, k * d - 1]
            fits = (
                usable & np.isfinite(t) & (c.cpu_cap >= k * req.cpu_milli) & (c.mem_cap >= k * req.memory_mib)
            )
            idx = np.nonzero(fits)[0]
            at.append(t[idx])
            on.append(idx)
        when = np.concatenate(at) if at else np.zeros(0)
        if len(when) < len(gang):
            return
        nodes = np.concatenate(on)
        earliest = np.lexsort((nodes, when))[: len(gang)]  # the earliest slots, by node on a tie
        mask = np.zeros(len(c), dtype=np.bool_)
        mask[nodes[earliest]] = True
        session.reservation = Reservation(head.name, mask, float(when[earliest[-1]]))

    @staticmethod
    def gpu_free_times(session: Session) -> np.ndarray:
        """When each GPU will be wholly free: now, the end of its last holder, or never (inf).

        Ends come from the holders' `estimated_runtime`; unknown means never. CPU and memory are
        taken to be free by then (only the node's capacity is checked).
        """
        s = session.snapshot
        c = s.cluster
        now = session.clock
        ends = np.full(c.gpu_kind.shape, -math.inf)
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        workloads = s.workloads
        for a in s.allocations.values():
            d = a.devices
            if d.mig is not None or not d.gpus:
                continue
            est = workloads[a.task.workload].workload.estimated_runtime
            end = a.since + est if est is not None else math.inf
            for j in d.gpus:  # gathered, then one unbuffered max per GPU: no numpy scalar per GPU
                rows.append(a.node)
                cols.append(j)
                vals.append(end)
        if rows:
            np.maximum.at(ends, (np.array(rows), np.array(cols)), np.array(vals, dtype=np.float64))
        free = (c.gpu_kind == KIND_SHARED) & (c.gpu_milli_free == MILLI) & (c.gpu_mem_free == c.gpu_mem_cap)
        held = (c.gpu_kind == KIND_SHARED) & ~free & (ends > -math.inf)
        out = np.full(c.gpu_kind.shape, math.inf)
        out[free] = now
        out[held] = np.maximum(ends[held], now)
        return out
