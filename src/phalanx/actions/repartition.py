"""Repartition: idle MIG GPUs cut anew for the MIG slices the queue waits for (issue 42).

A MIG GPU with a fixed layout (its instances as an administrator or an earlier recut made them)
serves only those instances; when the free ones are the wrong sizes, pods wait while GPUs idle.
After the other actions, the slices still waiting (in the workload order) are laid out on idle
GPUs: a GPU none of whose instances is in use, that is not being cut and was not cut in the last
`min_interval_s`, is cut anew when a layout for the waiting slices serves more of them than its
present one would (the largest slices first, then the rest of the GPU in the smallest slices, so
that it stays useful for what comes next). A GPU in use is never cut. The cut takes `recut_s`
(destroying and creating instances, the device plugin re-registering): the GPU serves nothing
until then, and the cycle wakes when it is ready. At most `max_per_cycle` GPUs a cycle.
"""

from __future__ import annotations

import math

from phalanx.core.cluster import KIND_MIG
from phalanx.core.decisions import Repartition as Recut
from phalanx.core.mig import MigGeometry
from phalanx.core.model import GpuKind
from phalanx.core.session import Session

Layout = frozenset[tuple[str, int]]


def _place(
    geo: MigGeometry, names: list[str], allowed: Layout | None, used: int = 0, compute: int = 0
) -> tuple[list[int], Layout, int, int]:
    """Lay `names` (profiles, in order) on a GPU whose slots `used` and `compute` are taken (empty
    by default), each at its first free start (only at the (profile, start) pairs of `allowed` if
    given): which of them fit, the instances made, and the slots and compute taken then."""
    served: list[int] = []
    made: set[tuple[str, int]] = set()
    for k, name in enumerate(names):
        prof = geo.profiles[name]
        starts = geo.free_starts(prof, used, compute)
        if allowed is not None:
            starts = [s for s in starts if (name, s) in allowed and (name, s) not in made]
        if not starts:
            continue
        s = starts[0]
        used |= prof.slot_mask(s)
        compute += prof.compute
        made.add((name, s))
        served.append(k)
    return served, frozenset(made), used, compute


def cut_for(geo: MigGeometry, names: list[str]) -> tuple[list[int], Layout]:
    """A layout for waiting slices: the largest first; the rest of the GPU in the smallest slices.
    Which of `names` it serves, and its instances."""
    order = sorted(range(len(names)), key=lambda k: (-geo.profiles[names[k]].slots, k))
    served_sorted, made, used, compute = _place(geo, [names[k] for k in order], None)
    served = sorted(order[k] for k in served_sorted)
    smallest = min(geo.profiles.values(), key=lambda p: (p.slots, p.compute, p.max_instances == 1))
    _, rest, _, _ = _place(geo, [smallest.name] * len(smallest.starts), None, used, compute)
    return served, made | rest


def _label(layout: Layout) -> tuple[str, ...]:
    return tuple(f"{p}@{s}" for p, s in sorted(layout, key=lambda x: (x[1], x[0])))


class Repartition:
    name = "repartition"

    def __init__(self, recut_s: float = 60.0, min_interval_s: float = 1800.0, max_per_cycle: int = 8) -> None:
        if not (recut_s >= 0 and min_interval_s >= 0 and max_per_cycle >= 1):
            raise ValueError("recut_s and min_interval_s must be >= 0 s, max_per_cycle >= 1")
        self.recut_s = recut_s
        self.min_interval_s = min_interval_s
        self.max_per_cycle = max_per_cycle

    def waiting(self, session: Session) -> list[str]:
        """The MIG profiles of the tasks still waiting, in the workload order, one per task."""
        out: list[str] = []
        for e in sorted(session.snapshot.pending_workloads(), key=session.order_key):
            for ps in e.workload.podsets:
                g = ps.request.gpu
                if g.kind is GpuKind.MIG:
                    placed = sum(1 for t in e.bound.values() if t.task.podset == ps.name)
                    out += [g.mig_profile] * (ps.count - placed)
        return out

    def execute(self, session: Session) -> None:
        s = session.snapshot
        c = s.cluster
        if not c.mig_static:
            return
        names = self.waiting(session)
        for key in sorted(s.recuts):  # what the GPUs being cut will serve is not laid out again
            geo = c.geometry(*key)
            if geo is not None:
                mine = [n for n in names if n in geo.profiles]
                served, *_ = _place(geo, mine, c.mig_static[key])
                for n in [mine[k] for k in served]:
                    names.remove(n)
        if not names:
            return
        done = 0
        for i, j in sorted(c.mig_static):
            if done >= self.max_per_cycle or not names:
                break
            if c.gpu_kind[i, j] != KIND_MIG or not c.node_ready[i] or (i, j) in s.recuts:
                continue
            if c.mig_used[i, j] or c.mig_compute[i, j]:  # an instance in use: never cut
                continue
            if session.clock - s.recut_at.get((i, j), -math.inf) < self.min_interval_s:
                continue
            geo = c.geometry(i, j)
            if geo is None:
                continue
            mine = [n for n in names if n in geo.profiles]
            if not mine:
                continue
            now_serves, *_ = _place(geo, mine, c.mig_static[(i, j)])
            served, layout = cut_for(geo, mine)
            if len(served) <= len(now_serves) or layout == c.mig_static[(i, j)]:
                continue
            taken = [mine[k] for k in served]
            for n in taken:  # what this GPU will serve is not laid out on another one
                names.remove(n)
            until = session.clock + self.recut_s
            why = f"{len(taken)} waiting MIG slice(s) ({', '.join(sorted(set(taken)))}) fit the new layout"
            node = s.nodes[i]
            session.repartitions.append(
                Recut(node.name, node.gpus[j].index, _label(c.mig_static[(i, j)]), _label(layout), until, why)
            )
            session.wake_at(until, f"repartition of {node.name} GPU {node.gpus[j].index} ready")
            done += 1
