"""One dashboard for every scheduling shard (`phalanx dashboard --shards FILE`, issue 35).

Each shard's state is built from its own world and its own dry cycle, as that shard's scheduler
sees them (`phalanx.k8s.view.board.build`); their node sets, pods and queues are disjoint, so the
whole is their union: the GPU map of every shard's nodes, each waiting workload with the shard
that decides it and its reason, and a table of the shards (nodes, GPUs, what waits).
"""

from __future__ import annotations

from typing import Any

from phalanx.k8s.view.board import PROBLEM_NAMESPACES
from phalanx.spec.shards import Shard

Part = tuple[Shard, dict[str, Any], dict[str, dict[str, Any]]]


def merged(parts: list[Part], now: float) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The dashboard's state and details of all shards from each shard's own."""
    details: dict[str, dict[str, Any]] = {}
    nodes: list[dict[str, Any]] = []
    pools: list[dict[str, Any]] = []
    queues: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    problems: list[str] = []
    problem_ns: list[str | None] = []
    rows: list[dict[str, Any]] = []
    for shard, state, own in parts:
        details.update(own)
        nodes += state["nodes"]
        pools += state["pools"]
        queues += state["queues"]
        pending += [{**p, "shard": shard.name} for p in state["pending"]]
        problems += [f"shard {shard.name}: {p}" for p in state["problems"]]
        problem_ns += state[PROBLEM_NAMESPACES]
        s = state["summary"]
        rows.append(
            {
                "name": shard.name,
                "owns": shard.said().split(" ", 1)[1].strip("()"),
                "profile": state.get("profile", ""),
                "nodes": s["nodes"],
                "gpus": s["gpus"],
                "gpus_used": s["gpus_used"],
                "running": s["running"],
                "waiting": s["waiting"],
                "problems": len(state["problems"]),
            }
        )
    state = {
        "generated": now,
        "summary": {
            k: round(sum(r[k] for r in rows), 2) for k in ("nodes", "gpus", "gpus_used", "running", "waiting")
        },
        "shards": rows,
        "pools": sorted(pools, key=lambda p: str(p["name"])),
        "nodes": nodes,
        "queues": queues,
        "pending": pending,
        "problems": problems,
        PROBLEM_NAMESPACES: problem_ns,
    }
    return state, details


__all__ = ["merged"]
