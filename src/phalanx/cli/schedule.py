"""`phalanx schedule`: run cycles on a static cluster until nothing more can be placed."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from phalanx.cli.errors import user_errors
from phalanx.cli.tables import name_column, print_table
from phalanx.core.cycle import run_cycle
from phalanx.core.decisions import Bind, Pending
from phalanx.core.errors import SpecError
from phalanx.profiles import load_profile
from phalanx.spec.cluster import parse_cluster
from phalanx.spec.common import load_yaml
from phalanx.spec.workloads import parse_workloads

MAX_CYCLES = 1000


def _example(name: str) -> tuple[object, str]:
    res = resources.files("phalanx.data") / name
    import yaml

    return yaml.safe_load(res.read_text()), f"(embedded) {name}"


def schedule(
    cluster: Annotated[
        Path | None, typer.Option(help="Cluster YAML (default: the embedded example).")
    ] = None,
    workloads: Annotated[
        Path | None, typer.Option(help="Workloads YAML (default: the embedded example).")
    ] = None,
    profile: Annotated[str, typer.Option(help="Built-in profile name or a profile YAML file.")] = "phalanx",
    seed: Annotated[int, typer.Option(help="Seed of the cycle's random tie-breaks.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    capture: Annotated[
        Path | None,
        typer.Option(
            help="A file from `phalanx capture`: show what Phalanx would do now for the pods that wait, "
            "next to what the cluster's scheduler did (instead of --cluster/--workloads)."
        ),
    ] = None,
    scheduler_name: Annotated[
        str, typer.Option(help="With --capture: the scheduler whose pods Phalanx decides for.")
    ] = "default-scheduler",
    kueue: Annotated[str, typer.Option(help="With --capture: Kueue mode (see `scheduler --help`).")] = "auto",
    shards: Annotated[
        Path | None,
        typer.Option(
            help="With --capture: a shards file (as `scheduler --shards`): each shard decides its share "
            "of the captured cluster with its own profile (--profile for a shard that names none)."
        ),
    ] = None,
) -> None:
    """Place workloads on a static cluster (or a captured one) and show placements and pending reasons."""
    if capture is not None:
        from phalanx.cli.capture import replay_capture

        with user_errors():
            if cluster is not None or workloads is not None:
                raise SpecError("--capture", "replays a captured cluster: drop --cluster and --workloads")
        replay_capture(capture, profile, scheduler_name, None, kueue, as_json, shards)
        return
    if shards is not None:
        with user_errors():
            raise SpecError("--shards", "splits a captured cluster: give --capture too")
    with user_errors():
        cdata, csrc = (load_yaml(cluster), str(cluster)) if cluster else _example("example-cluster.yaml")
        wdata, wsrc = (
            (load_yaml(workloads), str(workloads)) if workloads else _example("example-workloads.yaml")
        )
        cluster_def = parse_cluster(cdata, csrc)
        wls, _ = parse_workloads(wdata, wsrc, cluster_def.dra_context())
        prof = load_profile(profile)
        snap = cluster_def.snapshot()
        for w in wls:
            snap.add_workload(w)
    rng = np.random.default_rng(seed)
    binds: list[Bind] = []
    pending: list[Pending] = []
    cycles = 0
    for cycles in range(1, MAX_CYCLES + 1):
        result = run_cycle(snap, prof, float(cycles), rng, apply=True)
        binds.extend(result.binds)
        pending = result.pending
        if not result.binds and not result.evictions:
            break
    if as_json:
        out = {
            "profile": prof.name,
            "cycles": cycles,
            "binds": [b.to_dict() for b in binds],
            "pending": [p.to_dict() | {"message": p.message} for p in pending],
        }
        typer.echo(json.dumps(out, indent=2))
        return
    print_tables(prof.name, cycles, binds, pending)


def print_tables(profile: str, cycles: int, binds: list[Bind], pending: list[Pending]) -> None:
    console = Console()
    t = Table(title=f"Placements ({profile}, {cycles} cycle{'s' if cycles != 1 else ''})")
    for col in ("workload", "task", "node"):
        name_column(t, col)
    for col in ("GPUs", "share / slice", "NICs"):
        t.add_column(col, overflow="fold")  # "0,1,...,7" folds over lines, never cut to "0,1,2,…"
    for b in sorted(binds, key=lambda b: (b.workload, b.task)):
        if b.mig is not None:
            share = f"MIG {b.mig.profile} @ slot {b.mig.start}"
        elif b.gpus and b.gpu_milli < 1000:
            share = f"{b.gpu_milli / 1000:g} GPU, {b.gpu_memory_mib} MiB"
        elif b.gpus:
            share = "whole"
        else:
            share = "-"
        t.add_row(
            b.workload,
            b.task.split("/", 1)[-1],
            b.node,
            ",".join(map(str, b.gpus)) or "-",
            share,
            ",".join(map(str, b.nics)) or "-",
        )
    print_table(t, console)
    claimed = [(b, c) for b in sorted(binds, key=lambda b: b.task) for c in b.claims]
    if claimed:
        c_t = Table(title="DRA claims allocated")
        for col in ("task", "claim"):
            name_column(c_t, col)
        for col in ("request", "device", "share"):
            c_t.add_column(col, overflow="fold")
        for b, c in claimed:
            for r in c.results:
                share = ", ".join(
                    f"{k.rsplit('/', 1)[-1]} {v // 1000 // 2**20} MiB" for k, v in r.consumed.items()
                )
                c_t.add_row(
                    b.task.split("/", 1)[-1],
                    c.claim,
                    r.request,
                    f"{r.driver}/{r.pool}/{r.device}",
                    share or "-",
                )
        print_table(c_t, console)
    if pending:
        p = Table(title="Pending")
        name_column(p, "workload")
        p.add_column("why")
        for item in pending:
            p.add_row(item.workload, item.message)
        print_table(p, console)
    else:
        console.print("Nothing pending.")
