"""Reserve: the large gang at the head of the line gets nodes earmarked as they free up.

The oldest pending gang asking for at least `min_gpus` GPUs is the head. From the running
tasks' expected ends (start + `estimated_runtime`; unknown means never), we find the earliest
time its tasks fit and the nodes that give it. Until then, other workloads may use those
nodes only if they will finish before that time (the `reservation` filter), so the big gang
is never starved by a stream of small ones.
"""

from __future__ import annotations

import math

import numpy as np

from phalanx.actions.gang import gang_tasks
from phalanx.core.cluster import KIND_SHARED
from phalanx.core.model import MILLI
from phalanx.core.session import Reservation, Session


class Reserve:
    name = "reserve"

    def __init__(self, min_gpus: int = 8) -> None:
        self.min_gpus = min_gpus

    def execute(self, session: Session) -> None:
        s = session.snapshot
        heads = []
        for group in s.pending_groups.values():
            sample = next(iter(group.values()))
            gpus = sorted((t.request.gpu.total_milli for t in sample.tasks), reverse=True)
            if sum(gpus[: sample.workload.gang_size]) < self.min_gpus * MILLI:
                continue  # every workload of a group asks for the same
            heads += [e for e in group.values() if not e.bound]
        if not heads:
            return
        head = min(heads, key=lambda e: (e.workload.creation_time, e.name))
        gang, _ = gang_tasks(head)
        req = session.effective(gang[0].request)
        d = max(1, req.gpu.devices) if req.gpu.total_milli >= MILLI else 1
        slots: list[tuple[float, int]] = []
        c = s.cluster
        static = s.static_mask(req)
        for i in range(len(c)):
            if not c.node_ready[i] or not static[i]:
                continue
            for t in self.slot_times(session, i, d, req.cpu_milli, req.memory_mib, len(gang)):
                slots.append((t, i))
        slots.sort()
        if len(slots) < len(gang):
            return
        chosen = slots[: len(gang)]
        due = chosen[-1][0]
        mask = np.zeros(len(c), dtype=np.bool_)
        for _, i in chosen:
            mask[i] = True
        session.reservation = Reservation(head.name, mask, due)

    def slot_times(self, session: Session, i: int, d: int, cpu: int, mem: int, most: int) -> list[float]:
        """When the node could hold 1, 2, ... tasks of d whole GPUs, from its tasks' expected ends."""
        s = session.snapshot
        c = s.cluster
        now = session.clock
        free_at = {
            j: now
            for j in range(c.max_gpus)
            if c.gpu_kind[i, j] == KIND_SHARED
            and c.gpu_milli_free[i, j] == MILLI
            and c.gpu_mem_free[i, j] == c.gpu_mem_cap[i, j]
        }
        ends: list[tuple[float, int, int]] = []
        for a in s.on_node[i].values():
            est = s.workloads[a.task.workload].workload.estimated_runtime
            end = a.since + est if est is not None else math.inf
            ends.append((end, a.cpu_milli, a.memory_mib))
            for j in a.devices.gpus:
                if a.devices.mig is None:
                    free_at[j] = max(free_at.get(j, now), end)
        gpu_times = sorted(free_at.values())
        ends.sort()
        out = []
        for k in range(1, most + 1):
            if k * d > len(gpu_times):
                break
            t = gpu_times[k * d - 1]
            cpu_free, mem_free = int(c.cpu_free[i]), int(c.mem_free[i])
            tc = now
            for end, ac, am in ends:
                if cpu_free >= k * cpu and mem_free >= k * mem:
                    break
                cpu_free += ac
                mem_free += am
                tc = end
            if cpu_free < k * cpu or mem_free < k * mem:
                break
            tt = max(t, tc)
            if math.isinf(tt):
                break
            out.append(tt)
        return out
