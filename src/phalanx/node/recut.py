"""`phalanx node discover --mig-recut`: carry out on this node the MIG repartitions the scheduler decided.

The scheduler writes the layout it wants for an idle MIG GPU on the Node (`phalanx.io/mig-layout`,
`phalanx.spec.mig_layout`). For each request not answered yet, the agent cuts the GPU through NVML
only when nothing uses it: no process on any of its instances (NVML) and no pod of this node holding
one of its slices (a pod bound or allocated there that has not ended, whether or not its process
runs yet). It answers in `phalanx.io/mig-layout-status` (applied, refused or failed, with the
reason) and in an Event on the Node; the discovery that follows publishes the new geometry, and the
device plugin lists the new MIG devices at its next look. A refusal is final for that request: the
scheduler then places on the layout that is there and may ask again later.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

from lightkube import Client
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod

from phalanx.core.errors import SpecError
from phalanx.node import nvml
from phalanx.node.deviceplugin import GPU_ALLOCATED, GPU_DEVICES
from phalanx.node.migplugin import MIG_SLICE
from phalanx.spec import mig_layout
from phalanx.spec.mig_layout import Answer, Want

log = logging.getLogger("phalanx.node")
ENDED = ("Succeeded", "Failed")


def holders(pods: list[dict[str, Any]], gpu: int, uuids: set[str]) -> list[str]:
    """Pods that hold a slice of GPU `gpu`: placed on it by the scheduler, or handed one of its
    MIG devices (`uuids`) by the device plugin, and not ended."""
    out = []
    for p in pods:
        meta = p.get("metadata") or {}
        if (p.get("status") or {}).get("phase") in ENDED:
            continue
        notes = meta.get("annotations") or {}
        placed = MIG_SLICE in notes and str(notes.get(GPU_DEVICES, "")).strip() == str(gpu)
        handed = bool(uuids & set(str(notes.get(GPU_ALLOCATED, "")).split(",")))
        if placed or handed:
            out.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return sorted(out)


def answer(
    want: Want,
    gpu: nvml.GpuInfo | None,
    nv: ModuleType,
    pods: list[dict[str, Any]],
    allocated: dict[str, list[str]] | None = None,
) -> Answer:
    """Cut one GPU as asked, if nothing uses it; what happened. `allocated`: kubelet's record of the
    devices it gave each pod (PodResources), the truth before a pod's annotations catch up."""
    if gpu is None or not gpu.mig:
        return Answer(at=want.at, state="failed", reason="no MIG-enabled GPU of that index on this node")
    if want.same(gpu.mig_instances):
        return Answer(at=want.at, state="applied", reason="the GPU already has this layout")
    devices = nvml.mig_devices(nv, gpu)
    mine = {d.uuid for d in devices}
    held = holders(pods, gpu.index, mine)
    held += sorted(pod for pod, ids in (allocated or {}).items() if mine & set(ids) and pod not in held)
    if held:
        return Answer(at=want.at, state="refused", reason=f"in use by pod(s) {', '.join(held)}")
    try:
        nvml.recut(nv, gpu, want.layout)
    except nvml.MigBusy as e:
        return Answer(at=want.at, state="refused", reason=str(e))
    except nvml.NvmlUnavailable as e:
        return Answer(at=want.at, state="failed", reason=str(e))
    return Answer(at=want.at, state="applied", reason=f"cut into {', '.join(sorted(want.layout))}")


def look(
    client: Client, node_name: str, nv: ModuleType, allocated: dict[str, list[str]] | None = None
) -> dict[int, Answer]:
    """Answer every request on this Node that has no answer yet; the answers given (a change of
    layout among them means the topology is to be published again)."""
    node = client.get(Node, node_name)
    notes = dict((node.metadata.annotations if node.metadata else None) or {})
    where = f"node {node_name}: annotation"
    try:
        wants = mig_layout.wants(notes.get(mig_layout.LAYOUT), f"{where} {mig_layout.LAYOUT}")
        done = mig_layout.answers(notes.get(mig_layout.STATUS), f"{where} {mig_layout.STATUS}")
    except SpecError as e:
        log.error("%s", e)
        return {}
    todo = {g: w for g, w in wants.items() if not (g in done and done[g].answers(w))}
    if not todo:
        return {}
    gpus = {g.index: g for g in nvml.gpus(nv)}
    pods = [p.to_dict() for p in client.list(Pod, namespace="*", fields={"spec.nodeName": node_name})]
    given: dict[int, Answer] = {}
    for g, want in sorted(todo.items()):
        given[g] = answer(want, gpus.get(g), nv, pods, allocated)
        log.info("node %s GPU %d: recut %s (%s)", node_name, g, given[g].state, given[g].reason)
    status = {**done, **given}
    client.patch(Node, node_name, {"metadata": {"annotations": {mig_layout.STATUS: mig_layout.dump(status)}}})
    for g, a in given.items():
        try:
            client.create(_event(node_name, g, a))
        except Exception as e:  # an Event is a courtesy: the status annotation says it too
            log.debug("node %s: no Event for GPU %d: %s", node_name, g, e)
    return given


def _event(node: str, gpu: int, a: Answer) -> Event:
    now = datetime.now(UTC)
    reasons = {"applied": "MigRepartitioned", "refused": "MigRepartitionRefused"}
    reason = reasons.get(a.state, "MigRepartitionFailed")
    return Event(
        metadata=ObjectMeta(generateName=f"{node}.", namespace="default"),
        involvedObject=ObjectReference(kind="Node", name=node, uid=node, apiVersion="v1"),
        reason=reason,
        message=f"GPU {gpu}: {a.reason}",
        type="Normal" if a.state == "applied" else "Warning",
        source=EventSource(component="phalanx-discover", host=node),
        firstTimestamp=now,
        lastTimestamp=now,
        count=1,
    )
