"""A gang made while many others wait is told why it waits within seconds, however busy the API is.

Found by bench_churn --full: after the faults at 300 s, 80 gangs waited, and their reasons name the
free GPUs, which move with every bind, so each cycle queued a new Event for every waiting pod. The
explanations' writer, one API call at a time, fell minutes behind; the gangs made then waited over
a minute with no Event and no PodGroup status, until the next leader (a fresh writer) told them.
Here the writes are slowed to what a loaded API server answers (a fake: the real one is fast when
idle), one small pod is bound and deleted over and over so that the waiting pods' texts keep
changing, and a new gang must still be told, with its PodGroup's status, within a few seconds.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod, pod_group
from phalanx.k8s.client.kinds import OUR_POD_GROUPS

pytestmark = pytest.mark.e2e

WAITING = 30  # pods that cannot fit, each told anew whenever the free GPUs change
WRITE_S = 0.03  # one Event's write on a loaded API server


def _churn(kube: Kube, stop: threading.Event) -> None:
    """Bind and delete a one-GPU pod over and over: the free GPUs go 8, 7, 8, ..."""
    k = 0
    while not stop.is_set():
        name = f"churn-{k}"
        kube.create(pod(name, gpus=1))
        deadline = time.monotonic() + 5
        while not kube.node_of(name) and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.05)
        kube.force_delete_pod(name)
        k += 1


def test_a_new_gang_is_told_before_the_rewrites_of_the_gangs_already_waiting(kube: Kube) -> None:
    kube.api.create("nodes", node("n0", gpus=8))
    for k in range(WAITING):
        kube.create(pod(f"big-{k}", gpus=16))
    with running(kube) as s:
        real = s.api.event

        def slow(*args: Any, **kw: Any) -> None:
            time.sleep(WRITE_S)
            real(*args, **kw)

        s.api.event = slow  # type: ignore[method-assign]
        wait_for("the waiting pods told", lambda: kube.events(f"big-{WAITING - 1}"), timeout=15)
        stop = threading.Event()
        churn = threading.Thread(target=_churn, args=(kube, stop), daemon=True)
        churn.start()
        try:
            time.sleep(6)  # texts change with every bind and delete: rewrites pile up meanwhile
            kube.create(pod_group("late", 2))
            for k in range(2):
                kube.create(pod(f"late-{k}", gpus=16, annotations={"phalanx.io/pod-group": "late"}))
            wait_for("the new gang told why it waits", lambda: kube.events("late-0"), timeout=10)
            wait_for(
                "its PodGroup's status written",
                lambda: ((kube.get(OUR_POD_GROUPS, "late", "default") or {}).get("status") or {}).get(
                    "phase"
                ),
                timeout=10,
            )
        finally:
            stop.set()
            churn.join(timeout=10)
