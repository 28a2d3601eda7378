"""`phalanx capture` (read a live cluster into one file) and `phalanx schedule --capture` (replay it)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from phalanx.cli import options as opt
from phalanx.cli.errors import user_errors
from phalanx.cli.kube import _connect
from phalanx.cli.options import LEVELS_HELP
from phalanx.cli.tables import name_column, print_table
from phalanx.core.errors import SpecError
from phalanx.k8s.config import DEFAULT_LEVELS, AdapterConfig, parse_levels
from phalanx.k8s.trial import capture as cap
from phalanx.k8s.trial.redact import redact as redact_capture
from phalanx.k8s.trial.replay import Comparison, compare
from phalanx.profiles import load_profile
from phalanx.spec.shards import ShardOf, load_shards


def capture(
    out: Annotated[Path, typer.Option("--out", "-o", help="File to write (.json, or .json.gz).")] = Path(
        "phalanx-capture.json.gz"
    ),
    kubeconfig: opt.Kubeconfig = None,
    in_cluster: opt.InCluster = False,
    redact: Annotated[
        bool,
        typer.Option(
            "--redact",
            help="Replace names, namespaces and label values by stable hashes (to share the file).",
        ),
    ] = False,
    salt: Annotated[str, typer.Option(help="With --redact: a secret mixed into the hashes.")] = "",
    scheduler_name: Annotated[
        str, typer.Option(help="Scheduler whose pods the listed problems are said for.")
    ] = "default-scheduler",
) -> None:
    """Read every object a scheduling cycle needs (list and discovery only) into one file: nodes,
    pods, queues and PodGroups of every dialect, Kueue objects, DRA classes, slices and claims.
    A kind that cannot be read is listed in the file with why; the capture still completes."""
    with user_errors():
        if salt and not redact:
            raise SpecError("--salt", "only means something with --redact")
        api = _connect(kubeconfig, in_cluster)
        try:
            c = cap.take(api, AdapterConfig(scheduler_name=scheduler_name))
        finally:
            api.close()
        if not c.objects:
            raise SpecError("API server", "nothing could be read: " + "; ".join(
                f"{k}: {w}" for k, w in sorted(c.unreadable.items())) or "no kind served")  # fmt: skip
        if redact:
            c = redact_capture(c, salt)
        try:
            cap.write(c, out)
        except OSError as e:
            raise SpecError("--out", f"cannot write {out}: {e.strerror or e}") from None
    counts = ", ".join(f"{len(v)} {k.rsplit('/', 1)[-1]}" for k, v in sorted(c.objects.items()) if v)
    typer.echo(f"captured {counts or 'no objects'} into {out}" + (" (redacted)" if redact else ""))
    for k, why in sorted(c.unreadable.items()):
        typer.echo(f"not read: {k}: {why}")
    if c.problems:
        typer.echo(f"{len(c.problems)} object(s) a cycle would leave out (see 'problems' in the file)")


def replay_capture(
    path: Path,
    profile: str,
    scheduler_name: str,
    topology_levels: str | None,
    kueue: str,
    as_json: bool,
    shards: Path | None = None,
) -> None:
    """`phalanx schedule --capture FILE`: one cycle on the captured cluster, beside what its scheduler
    did; with `--shards`, one cycle per shard, each on its share with its own profile (a split tried
    on the cluster as it is before it is made)."""
    with user_errors():
        if kueue not in ("auto", "coexist", "migrate", "off"):
            raise SpecError("--kueue", f"must be auto, coexist, migrate or off, got {kueue!r}")
        every = load_shards(shards) if shards is not None else None
        c = cap.load(path)
        cfg = AdapterConfig(
            scheduler_name=scheduler_name,
            profile=profile,
            levels=parse_levels(topology_levels) if topology_levels else DEFAULT_LEVELS,
            kueue=kueue,
        )
        if every is None:
            results = [("", compare(c, cfg, load_profile(profile)))]
        else:
            results = []
            for me in every.shards:
                mine = replace(cfg, shard=ShardOf(every, me), profile=me.profile or profile)
                results.append((me.said(), compare(c, mine, load_profile(mine.profile))))
    if as_json:
        if every is None:
            typer.echo(json.dumps(results[0][1].to_dict(), indent=2))
        else:
            out = [{"shard": said.split(" ", 1)[0], **r.to_dict()} for said, r in results]
            typer.echo(json.dumps({"shards": out}, indent=2))
        return
    for said, r in results:
        _print(r, c, said)


def _print(r: Comparison, c: cap.Capture, shard: str = "") -> None:
    console = Console()
    waiting = [row for row in r.rows if row.current.startswith("waits")]
    console.print(
        (f"Shard {shard}, " if shard else "")
        + f"Capture of {c.source or 'a cluster'} ({c.server or 'unknown version'}"
        f"{', redacted' if c.redacted else ''}): {r.placed} pod(s) of {r.scheduler} placed, "
        f"{len(waiting)} waiting. Phalanx ({r.profile}) would bind {len(r.result.binds)}, evict "
        f"{len(r.result.evictions)}.",
        highlight=False,
    )
    if r.rows:
        t = Table(
            title=f"What {r.scheduler} did, and what Phalanx would do now"
            + (f" (shard {shard})" if shard else "")
        )
        for col in ("pod", "workload"):
            name_column(t, col)
        for col in (r.scheduler, "Phalanx", "forecast"):
            t.add_column(col, overflow="fold")
        for row in r.rows:
            t.add_row(row.pod, row.workload, row.current, row.phalanx, row.forecast or "-")
        print_table(t, console)
    else:
        console.print(f"No pod of {r.scheduler} waits, and Phalanx would evict none.")
    for line in r.partial:
        console.print(f"[yellow]gang placed partially by {r.scheduler}:[/] {line}", highlight=False)
    for k, why in sorted(c.unreadable.items()):
        console.print(f"[yellow]not in the capture:[/] {k}: {why}", highlight=False)
    for p in r.problems:
        console.print(f"[yellow]problem:[/] {p}", highlight=False)


__all__ = ["LEVELS_HELP", "capture", "replay_capture"]
