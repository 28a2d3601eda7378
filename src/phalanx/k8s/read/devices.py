"""Device assignments as pod annotations, written with the bind and read back at start-up.

Schema (all values strings):
- `phalanx.io/node`: the node chosen; written with the others, before the bind.
- `phalanx.io/gpu-devices`: GPU indices on that node, comma-separated (`"0,1"`).
- `phalanx.io/gpu-fraction`: share of each listed GPU (`"0.5"`); absent for whole GPUs.
- `phalanx.io/gpu-memory`: MiB of each listed GPU the share stands for (`"40960"`).
- `phalanx.io/mig-slice`: MIG profile and start slot on the listed GPU (`"3g.40gb@4"`).
- `phalanx.io/rdma-nics`: RDMA NIC indices (`"0"`).
- `phalanx.io/gpu-backend-chosen`: what serves a fractional request, `mig` (with `mig-slice`),
  `mps` or `time-slice`; absent when no backend policy or pod chose (a time-slice share).

They travel on the Binding (the API server copies its annotations onto the pod), so one
call assigns and binds. A gang of several pods first gets its plan, every member's
assignment and pod uid as JSON in `phalanx.io/gang-plan` on its first pod: one write per
gang that lets a restarted scheduler finish the binds it had started.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from phalanx.core.cluster import MigSlice
from phalanx.core.decisions import Bind
from phalanx.core.errors import SpecError
from phalanx.core.model import GPU_BACKENDS, MILLI
from phalanx.k8s import keys

ALL = (
    keys.NODE_INTENT,
    keys.GPU_DEVICES,
    keys.GPU_FRACTION,
    keys.GPU_MEMORY,
    keys.MIG_SLICE,
    keys.RDMA_NICS,
    keys.GPU_BACKEND_CHOSEN,
)


def encode(b: Bind) -> dict[str, str | None]:
    """Annotations for a bind; None removes a key left from an earlier assignment."""
    out: dict[str, str | None] = dict.fromkeys(ALL)
    out[keys.NODE_INTENT] = b.node
    if b.gpus:
        out[keys.GPU_DEVICES] = ",".join(str(g) for g in b.gpus)
    if b.mig is not None:
        out[keys.MIG_SLICE] = f"{b.mig.profile}@{b.mig.start}"
    elif b.gpus and 0 < b.gpu_milli < MILLI:
        out[keys.GPU_FRACTION] = f"{b.gpu_milli / MILLI:g}"
        if b.gpu_memory_mib:
            out[keys.GPU_MEMORY] = str(b.gpu_memory_mib)
    if b.nics:
        out[keys.RDMA_NICS] = ",".join(str(n) for n in b.nics)
    if b.backend:
        out[keys.GPU_BACKEND_CHOSEN] = b.backend
    return out


def _indices(text: str, where: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError(where, f"expected comma-separated device indices, got {text!r}") from None
    if any(x < 0 for x in out):
        raise SpecError(where, f"device indices must be >= 0, got {text!r}")
    return out


def decode(notes: dict[str, str], task: str, workload: str, node: str) -> Bind:
    """The assignment recorded on a pod (whole GPUs when no fraction is given)."""
    where = f"pod {task}"
    gpus = _indices(notes.get(keys.GPU_DEVICES, ""), f"{where}: {keys.GPU_DEVICES}")
    nics = _indices(notes.get(keys.RDMA_NICS, ""), f"{where}: {keys.RDMA_NICS}")
    mig = None
    milli = MILLI if gpus else 0
    mem = 0
    if keys.MIG_SLICE in notes:
        prof, sep, start = notes[keys.MIG_SLICE].partition("@")
        if not sep or not start.isdigit() or len(gpus) != 1:
            raise SpecError(
                f"{where}: {keys.MIG_SLICE}",
                f"expected profile@start on one GPU, got {notes[keys.MIG_SLICE]!r}",
            )
        mig = MigSlice(prof, int(start))
        milli = 0
    elif keys.GPU_FRACTION in notes:
        try:
            share = float(notes[keys.GPU_FRACTION])
        except ValueError:
            raise SpecError(
                f"{where}: {keys.GPU_FRACTION}", f"expected a number, got {notes[keys.GPU_FRACTION]!r}"
            ) from None
        if not 0 < share <= 1:
            raise SpecError(f"{where}: {keys.GPU_FRACTION}", f"must be in (0, 1], got {share:g}")
        milli = round(share * MILLI)
        if keys.GPU_MEMORY in notes:
            w = f"{where}: {keys.GPU_MEMORY}"
            if not notes[keys.GPU_MEMORY].isdigit():
                raise SpecError(w, f"expected MiB, got {notes[keys.GPU_MEMORY]!r}")
            mem = int(notes[keys.GPU_MEMORY])
    backend = notes.get(keys.GPU_BACKEND_CHOSEN, "")
    if backend and backend not in GPU_BACKENDS:
        known = ", ".join(GPU_BACKENDS)
        raise SpecError(f"{where}: {keys.GPU_BACKEND_CHOSEN}", f"expected one of {known}, got {backend!r}")
    return Bind(task, workload, node, gpus, milli, mem, mig, nics, backend=backend)


def binding_notes(b: Bind) -> dict[str, str]:
    """The annotations a Binding carries for `b` (no removals: a Binding can only add)."""
    return {k: v for k, v in encode(b).items() if v is not None}


def stale_keys(current: dict[str, Any], b: Bind) -> list[str]:
    """Assignment keys on the pod that the new assignment does not set (left by an earlier try)."""
    new = binding_notes(b)
    return [k for k in ALL if k in current and k not in new]


def encode_plan(binds: list[Bind], uids: Mapping[str, str]) -> str:
    tasks = {b.task: {"uid": uids.get(b.task, ""), **binding_notes(b)} for b in binds}
    return json.dumps({"workload": binds[0].workload, "tasks": tasks}, separators=(",", ":"), sort_keys=True)


def decode_plan(text: str, where: str) -> dict[str, tuple[str, dict[str, str]]]:
    """task -> (pod uid, its assignment annotations) from a `phalanx.io/gang-plan` value."""
    w = f"{where}: {keys.GANG_PLAN}"
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(w, f"not valid JSON: {e.msg} at character {e.pos}") from None
    tasks = raw.get("tasks") if isinstance(raw, dict) else None
    if not isinstance(tasks, dict):
        raise SpecError(w, 'expected {"workload": ..., "tasks": {"ns/pod": {"uid": ..., ...}}}')
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for task, entry in tasks.items():
        if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
            raise SpecError(f"{w}.tasks.{task}", "expected a mapping of strings")
        notes = {k: v for k, v in entry.items() if k != "uid"}
        if keys.NODE_INTENT not in notes:
            raise SpecError(f"{w}.tasks.{task}", f"missing {keys.NODE_INTENT}")
        out[str(task)] = (entry.get("uid", ""), notes)
    return out
