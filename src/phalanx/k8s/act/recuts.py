"""A cycle's MIG repartitions, asked of the node agents: the layout wanted per GPU, on the Node.

The core decided that an idle MIG GPU is to be cut anew (`phalanx.actions.repartition`); the node
agent of that node (`phalanx node discover --mig-recut`) carries it out and answers on the same Node
(`phalanx.spec.mig_layout`). Each request carries the time it was made, which the answer repeats:
a GPU is read as being cut from the request until its answer (`phalanx.k8s.read.nodes`), so the
cycles in between place nothing on it. The annotation is rewritten whole (a merge patch replaces a
value), from the Node as it is now, so another GPU's pending request is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from phalanx.core.decisions import Repartition
from phalanx.core.errors import SpecError
from phalanx.k8s import keys
from phalanx.k8s.client.api import Api
from phalanx.k8s.client.kinds import NODES
from phalanx.spec import mig_layout
from phalanx.spec.mig_layout import Want

log = logging.getLogger("phalanx.k8s")


def ask(
    api: Api, retry: Callable[[Callable[[], Any]], Any], recuts: Sequence[Repartition], now: float
) -> list[str]:
    """Write each node's new requests; the nodes whose requests could not be written, and why."""
    by_node: dict[str, list[Repartition]] = {}
    for r in recuts:
        by_node.setdefault(r.node, []).append(r)
    failed = []
    for node, items in sorted(by_node.items()):
        try:
            obj: dict[str, Any] = retry(partial(api.get, NODES, node)) or {}
            notes = (obj.get("metadata") or {}).get("annotations") or {}
            try:
                where = f"node {node}: annotation {keys.MIG_LAYOUT}"
                wants = mig_layout.wants(notes.get(keys.MIG_LAYOUT), where)
            except SpecError as e:
                log.warning("%s: written anew", e)
                wants = {}
            for r in items:
                wants[r.gpu] = Want(layout=list(r.after), at=round(now, 3))
                log.info("node %s GPU %d: recut %s -> %s (%s)", node, r.gpu, r.before, r.after, r.reason)
            body = {"metadata": {"annotations": {keys.MIG_LAYOUT: mig_layout.dump(wants)}}}
            retry(partial(api.patch, NODES, node, None, body))
        except Exception as e:  # the node is gone or the API away: the next cycle decides again
            log.warning("node %s: MIG repartition not asked: %s", node, e)
            failed.append(f"{node}: {e}")
    return failed
