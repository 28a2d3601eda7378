"""A gang's pending reason in its user's words: what was asked, what is free and where, then why.

The user wrote pods, GPUs and a minimum (`minMember 4`); the model's pod sets, subgroups made
for its own bookkeeping and statements are not theirs. So a reason opens with what was asked
("4 pods of 1 GPU each, all at once (minMember 4)"), then what is free ("2 GPUs free on 1 node
in the cluster"), and only then the detail of the try. Only the words: nothing here decides.
"""

from __future__ import annotations

import numpy as np

from phalanx.core.cluster import BoolArray
from phalanx.core.feasibility import node_capacity
from phalanx.core.model import GpuKind, GpuRequest, Task, TaskRequest, Workload
from phalanx.core.session import Session
from phalanx.core.snapshot import WorkloadEntry


def plural(k: int, noun: str) -> str:
    return f"{k} {noun}" + ("" if k == 1 else "s")


def each(req: TaskRequest) -> str:
    """What one task asks, the part a user looks for first: its GPUs, else its CPU."""
    g: GpuRequest = req.gpu
    if g.kind is GpuKind.WHOLE:
        return plural(g.devices, "GPU")
    if g.kind is GpuKind.FRACTION:
        share = f"{g.milli / 1000:g} of a GPU"
        return share if g.devices == 1 else f"{share} on each of {g.devices} GPUs"
    if g.kind is GpuKind.MEMORY:
        share = f"{g.memory_mib} MiB of GPU memory"
        return share if g.devices == 1 else f"{share} on each of {g.devices} GPUs"
    if g.kind is GpuKind.MIG:
        return f"a MIG {g.mig_profile} slice"
    if req.claims:
        return "devices by resource claim"
    return f"{req.cpu_milli / 1000:g} CPU"


def asked(entry: WorkloadEntry, tasks: list[Task]) -> str:
    """ "4 pods of 1 GPU each, all at once (minMember 4)": the tasks the gang still needs."""
    w: Workload = entry.workload
    shapes: dict[str, int] = {}
    for t in tasks:
        k = each(t.request)
        shapes[k] = shapes.get(k, 0) + 1
    more = "more " if entry.bound else ""
    parts = [
        f"{plural(n, more + w.task_noun)} of {what}" + (" each" if n > 1 else "")
        for what, n in shapes.items()
    ]
    text = " and ".join(parts) if parts else plural(0, w.task_noun)
    if len(tasks) > 1:
        text += ", all at once"
    notes = [w.minimum_said] if w.minimum_said else []
    if entry.bound:
        notes.append(f"{len(entry.bound)} running")
    return text + (f" ({', '.join(notes)})" if notes else "")


def free(session: Session, tasks: list[Task], mask: BoolArray | None = None, where: str = "") -> str:
    """ "2 GPUs free on 1 node in the cluster": free GPUs on ready nodes (or, for shares and
    CPU-only tasks, room for how many of them), in `mask` (`where` names it) or the cluster."""
    s = session.snapshot
    c = s.cluster
    place = f" in {where}" if where else " in the cluster"
    if not len(c):
        return "no nodes" + place
    ready = c.node_ready if mask is None else c.node_ready & mask
    reqs: dict[tuple[object, ...], tuple[TaskRequest, int]] = {}
    for t in tasks:
        req = session.effective(t.request)
        n = reqs[req.shape_key][1] + 1 if req.shape_key in reqs else 1
        reqs[req.shape_key] = (req, n)
    out: list[str] = []
    if any(r.gpu.kind is GpuKind.WHOLE and not r.claims for r, _ in reqs.values()):
        gpus = np.where(ready, c.gpu_whole_free, 0)
        total, nodes = int(gpus.sum()), int((gpus > 0).sum())
        out.append(f"{plural(total, 'GPU')} free on {plural(nodes, 'node')}" if total else "no GPU free")
    for req, n in reqs.values():
        if req.gpu.kind is GpuKind.WHOLE and not req.claims:
            continue
        cap = np.where(ready, node_capacity(s, req), 0)
        room, nodes = min(int(np.minimum(cap, n).sum()), n), int((cap > 0).sum())
        of = f" of {each(req)}" if len(reqs) > 1 else ""  # one shape: the sentence said it already
        if not room:
            out.append(f"no room for one{of}")
        else:
            out.append(f"room for {room if n == 1 else f'{room} of the {n}'}{of} on {plural(nodes, 'node')}")
    return ", ".join(out) + place
