"""The operator's view (`phalanx status`): queues, per-GPU allocation, gangs, pending workloads and why.

It lists the objects once, builds the same world the scheduler builds, and runs a dry cycle
(nothing is written) to get the pending reasons the scheduler would give right now, and the
start forecast of each. Gangs are listed with the phase and members their PodGroup status says
(`phalanx.k8s.read.lifecycle`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from phalanx.core.profile import Profile
from phalanx.core.queues import GPU
from phalanx.k8s.act.explain import describe
from phalanx.k8s.client.api import Api
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.decide.cycle import decide
from phalanx.k8s.read.lifecycle import gang_names, gang_status
from phalanx.k8s.read.world import World
from phalanx.k8s.trial.capture import Capture, read
from phalanx.k8s.view.board import Board, build
from phalanx.k8s.view.holders import gpu_holders
from phalanx.k8s.view.shard_board import merged
from phalanx.profiles import load_profile
from phalanx.spec.shards import Shard, ShardOf, Shards

log = logging.getLogger("phalanx.k8s")


@dataclass
class Status:
    queues: list[dict[str, object]] = field(default_factory=list)
    gpus: list[dict[str, object]] = field(default_factory=list)
    gangs: list[dict[str, object]] = field(default_factory=list)
    pending: list[dict[str, object]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def collect(api: Api, cfg: AdapterConfig, clock: Callable[[], float] = time.time) -> Status:
    return summarize(world_now(api, cfg), cfg, clock)


def _listed(api: Api) -> Capture:
    """Every kind listed once; without nodes or pods there is nothing to say."""
    c = read(api)
    if "pods" in c.unreadable or "nodes" in c.unreadable:
        raise RuntimeError(
            "; ".join(f"{k}: {c.unreadable[k]}" for k in ("nodes", "pods") if k in c.unreadable)
        )
    return c


def world_now(api: Api, cfg: AdapterConfig) -> World:
    """The world the scheduler would build from the cluster as it is now: every kind listed once and
    gathered as the scheduler gathers its watch cache (`phalanx.k8s.trial.capture`); a kind that cannot be
    read counts as empty and is named among the problems."""
    c = _listed(api)
    world = c.gathered(cfg).world(cfg, c.time)
    world.problems.update({f"List {k}": f"{k}: not read ({why})" for k, why in c.unreadable.items()})
    return world


def shard_worlds(api: Api, cfg: AdapterConfig, shards: Shards) -> list[tuple[Shard, World]]:
    """`phalanx status --shards`: the cluster listed once, and each shard's world as its scheduler
    builds it (the same gate on a watch cache of the same objects: `phalanx.k8s.read.shard`)."""
    c = _listed(api)
    out = []
    for me in shards.shards:
        mine = replace(cfg, shard=ShardOf(shards, me))
        world = c.gathered(mine).world(mine, c.time)
        world.problems.update({f"List {k}": f"{k}: not read ({why})" for k, why in c.unreadable.items()})
        out.append((me, world))
    return out


def shard_row(shard: Shard, world: World, st: Status) -> dict[str, object]:
    """One line of the shards table: what the shard holds and what waits in it."""
    c = world.snapshot.cluster
    gpus = int(c.gpu_count.sum())
    free = float(sum((c.gpu_milli_free[i, : int(c.gpu_count[i])]).sum() for i in range(len(c)))) / 1000
    return {
        "shard": shard.name,
        "owns": shard.said().split(" ", 1)[1].strip("()"),
        "nodes": len(world.snapshot.nodes),
        "GPUs": gpus,
        "GPUs in use": round(gpus - free, 3),
        "pending": len(st.pending),
        "problems": len(st.problems),
    }


def follow(
    api: Api,
    cfg: AdapterConfig,
    board: Board,
    interval: float,
    stop: threading.Event,
    clock: Callable[[], float] = time.time,
    shards: Shards | None = None,
) -> None:
    """`phalanx dashboard`: rebuild the board every `interval` seconds from the cluster, read-only
    (with `shards`: every shard's share, each as its scheduler sees it, on one board).

    Each round runs the cycle the scheduler would run (on a copy of the world, nothing is written)
    so that waiting workloads show the reasons and forecasts the scheduler would give. `clock`: the
    cycle's time, injected as the scheduler's is (tests and replays pass their own).
    """
    prof = load_profile(cfg.profile)
    profiles = {s.name: load_profile(s.profile or cfg.profile) for s in shards.shards} if shards else {}
    while not stop.is_set():
        try:
            if shards is None:
                world = world_now(api, cfg)
                now = clock()
                decision = decide(world, prof, now)
                board.update(world, decision.result, decision.foresee().texts, now)
            else:
                board.show(*_every_shard(api, cfg, shards, profiles, board.pool_label, clock))
        except Exception:  # an API hiccup: show the last state and try again
            log.exception("could not read the cluster")
        stop.wait(interval)


def _every_shard(
    api: Api,
    cfg: AdapterConfig,
    shards: Shards,
    profiles: dict[str, Profile],
    pool_label: str,
    clock: Callable[[], float],
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The dashboard of every shard: each its own world and dry cycle with its own profile."""
    parts = []
    now = clock()
    for me, world in shard_worlds(api, cfg, shards):
        decision = decide(world, profiles[me.name], now)
        state, details = build(world, decision.result, decision.foresee().texts, now, pool_label)
        state["profile"] = profiles[me.name].name
        parts.append((me, state, details))
    return merged(parts, now)


def summarize(world: World, cfg: AdapterConfig, clock: Callable[[], float] = time.time) -> Status:
    """The tables of `phalanx status` for `world`, with the cycle the scheduler would run at `clock()`."""
    out = Status()
    s = world.snapshot
    if world.tree is not None:
        fair = s.fair_shares(world.tree)
        for name in world.tree.queues:
            out.queues.append(
                {
                    "queue": name,
                    "parent": world.tree.queues[name].parent,
                    "deserved_gpu": world.tree.deserved[name][GPU] / 1000,
                    "used_gpu": s.usage_of(name)[GPU] / 1000,
                    "fair_gpu": fair.get(name, np.zeros(3))[GPU] / 1000,
                }
            )
    holders = gpu_holders(s)
    c = s.cluster
    for i, n in enumerate(s.nodes):
        for j, g in enumerate(n.gpus):
            out.gpus.append(
                {
                    "node": n.name,
                    "gpu": g.index,
                    "model": g.model + (" MIG" if g.mig_enabled else ""),
                    "free": f"{c.gpu_milli_free[i, j] / 1000:g}" if not g.mig_enabled else "-",
                    "held_by": ", ".join(h.label() for h in holders.get((i, j), [])) or "-",
                }
            )
    for name in gang_names(world):
        st = gang_status(world, name)
        if st is not None:
            out.gangs.append({"workload": name, "phase": st.phase, "members": st.text})
    # the cycle the scheduler would run now, kept so that the forecast starts from what it would do
    # (the tables above show the cluster as it is)
    now = clock()
    decision = decide(world, load_profile(cfg.profile), now)
    insight = decision.foresee().texts
    for p in decision.result.pending:
        out.pending.append(
            {"workload": p.workload, "why": describe(p), "forecast": insight.get(p.workload, "-")}
        )
    for name, why in world.blocked.items():
        out.pending.append({"workload": name, "why": "; ".join(why), "forecast": "-"})
    out.problems += [world.problems[k] for k in sorted(world.problems)]
    return out
