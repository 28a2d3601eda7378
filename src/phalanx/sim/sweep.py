"""Sweeps: one trace replayed over profiles x loads x seeds x cluster variants, spread over workers.

Every point of the grid is one time replay (`phalanx.sim.replay`), independent of the others, so a
sweep is fan-out work: on this process (`workers=1`), on local processes (the default: every core),
or on a Dask cluster the user already runs (`dask="tcp://scheduler:8786"`) or one started here on
loopback (`dask="local"`). Dask rather than Ray: the points are plain Python functions over pickled
inputs, Dask's distributed scheduler is a pure-Python install that starts a local cluster in about
a second, and it runs on Kubernetes through its own operator; Ray would bring a far larger runtime
for no feature a sweep uses. The inputs go to each worker once (a process pool's initializer; Dask's
`scatter`), and each point sends back its replay's summary.

Each point's result is kept in a cache directory under a digest of everything that decides it: the
jobs and the cluster as loaded (so whatever file or option changed them counts), the profile's
text, the load, the seed, the replay's knobs, and Phalanx's own code. A sweep run again computes
only the points whose digest it has not seen.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from phalanx.core.errors import SpecError
from phalanx.core.model import Node
from phalanx.core.profile import Profile
from phalanx.core.queues import QueueTree
from phalanx.profiles import load_profile
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import replay

Row = dict[str, Any]
# what a progress display is told after each point: points done, points in all, whether from the cache
Progress = Callable[[int, int, bool], None]


@dataclass(frozen=True)
class Variant:
    """One cluster the trace is replayed on, with the trace's jobs as they run there."""

    name: str
    nodes: list[Node]
    jobs: list[JobSpec]
    levels: list[str] = field(default_factory=list)
    datasets: dict[str, int] = field(default_factory=dict)
    queues: QueueTree | None = None

    def digest(self) -> str:
        """Of what is replayed, as loaded: the jobs, the nodes, the topology, datasets and queues."""
        queues = [repr(self.queues.queues[k]) for k in sorted(self.queues.queues)] if self.queues else None
        what = (self.jobs, self.nodes, self.levels, sorted(self.datasets.items()), queues)
        return hashlib.sha256(repr(what).encode()).hexdigest()


@dataclass(frozen=True)
class Point:
    variant: str
    profile: str
    load: float
    seed: int


@dataclass(frozen=True)
class Knobs:
    """The replay's settings every point shares."""

    cycle_interval: float = 0.0
    checkpoint_interval: float = 300.0
    half_life: float = 0.0
    restart_cost: float = 60.0


def grid(
    variants: Sequence[str], profiles: Sequence[str], loads: Sequence[float], seeds: Sequence[int]
) -> list[Point]:
    return [Point(v, p, ld, s) for v in variants for p in profiles for ld in loads for s in seeds]


def _code_digest() -> str:
    """Phalanx's own code and data: a result computed by other code is computed again."""
    root = Path(str(resources.files("phalanx")))
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file() and f.suffix in (".py", ".yaml", ".csv") and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _profile_text(name: str) -> str:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or "/" in name:
        return path.read_text()
    return (resources.files("phalanx.profiles") / f"{name}.yaml").read_text()


def point_digest(variant: str, profile: str, p: Point, knobs: Knobs, code: str) -> str:
    """`variant`: the variant's digest; `profile`: the profile's text."""
    key = {
        "variant": variant,
        "profile": profile,
        "load": p.load,
        "seed": p.seed,
        "knobs": dataclasses.asdict(knobs),
        "code": code,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def at_load(jobs: list[JobSpec], load: float) -> list[JobSpec]:
    """Arrivals sped up by `load` (2: twice as many jobs an hour), as `phalanx simulate --load`."""
    if load == 1.0 or not jobs:
        return jobs
    t0 = min(j.submit for j in jobs)
    return [dataclasses.replace(j, submit=t0 + (j.submit - t0) / load) for j in jobs]


def run_point(v: Variant, profile: Profile, p: Point, knobs: Knobs) -> Row:
    """One replay of the grid and its summary (plain data: it crosses processes and machines)."""
    start = time.perf_counter()
    res = replay(
        v.nodes,
        at_load(v.jobs, p.load),
        profile,
        topology_levels=v.levels,
        datasets=v.datasets,
        seed=p.seed,
        cycle_interval=knobs.cycle_interval,
        queues=v.queues,
        checkpoint_interval=knobs.checkpoint_interval,
        half_life=knobs.half_life,
        eta_every=0,
        restart_cost=knobs.restart_cost,
    )
    s = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in res.summary().items()}
    return {
        **s,
        "cluster": p.variant,
        "profile": p.profile,
        "load": p.load,
        "seed": p.seed,
        "replay_s": round(time.perf_counter() - start, 3),
    }


# a local worker's inputs, set once by the pool's initializer (not sent with every point)
_INPUTS: tuple[dict[str, Variant], dict[str, Profile]] | None = None


def _set_inputs(variants: dict[str, Variant], profiles: dict[str, Profile]) -> None:
    global _INPUTS
    _INPUTS = (variants, profiles)


def _local_point(p: Point, knobs: Knobs) -> Row:
    assert _INPUTS is not None
    variants, profiles = _INPUTS
    return run_point(variants[p.variant], profiles[p.profile], p, knobs)


@dataclass
class Sweep:
    """A grid of replays, where it runs, and where results are kept."""

    variants: list[Variant]
    profiles: list[str]
    loads: list[float]
    seeds: list[int]
    knobs: Knobs = field(default_factory=Knobs)
    cache: Path | None = None
    workers: int = 0  # 0: every core
    dask: str = ""  # "", "local" (a cluster started here on loopback) or a scheduler's address
    dask_timeout_s: float = 20.0  # to reach that scheduler
    cached: int = 0  # points taken from the cache in the last run

    def points(self) -> list[Point]:
        return grid([v.name for v in self.variants], self.profiles, self.loads, self.seeds)

    def run(self, progress: Progress | None = None) -> list[Row]:
        """Every point's row, in grid order; from the cache where its digest is there."""
        by_name = {v.name: v for v in self.variants}
        if len(by_name) != len(self.variants):
            raise SpecError("--cluster", "two cluster variants have the same name")
        profiles = {name: load_profile(name) for name in self.profiles}
        code = _code_digest()
        points = self.points()
        variants = {v.name: v.digest() for v in self.variants}  # each read and hashed once
        texts = {name: _profile_text(name) for name in self.profiles}
        digests = {
            p: point_digest(variants[p.variant], texts[p.profile], p, self.knobs, code) for p in points
        }
        rows: dict[Point, Row] = {}
        for p in points:
            kept = self._cached(digests[p])
            if kept is not None:
                rows[p] = kept
        self.cached = len(rows)
        todo = [p for p in points if p not in rows]
        if progress is not None:
            progress(len(rows), len(points), True)
        for p, row in self._execute(todo, by_name, profiles):
            rows[p] = row
            self._keep(digests[p], row)
            if progress is not None:
                progress(len(rows), len(points), False)
        return [rows[p] for p in points]

    def _execute(
        self, todo: list[Point], variants: dict[str, Variant], profiles: dict[str, Profile]
    ) -> Iterator[tuple[Point, Row]]:
        if not todo:
            return
        if self.dask:
            from phalanx.sim.sweep_dask import on_dask

            yield from on_dask(
                self.dask, self.workers, todo, variants, profiles, self.knobs, self.dask_timeout_s
            )
            return
        workers = min(self.workers or os.cpu_count() or 1, len(todo))
        if workers == 1:
            for p in todo:
                yield p, run_point(variants[p.variant], profiles[p.profile], p, self.knobs)
            return
        with ProcessPoolExecutor(workers, initializer=_set_inputs, initargs=(variants, profiles)) as ex:
            futures = {ex.submit(_local_point, p, self.knobs): p for p in todo}
            for f in as_completed(futures):
                yield futures[f], f.result()

    def _cached(self, digest: str) -> Row | None:
        if self.cache is None:
            return None
        f = self.cache / f"{digest}.json"
        try:
            return json.loads(f.read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None  # not there, or written by a run that was stopped: computed again

    def _keep(self, digest: str, row: Row) -> None:
        if self.cache is None:
            return
        self.cache.mkdir(parents=True, exist_ok=True)
        tmp = self.cache / f".{digest}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(row, sort_keys=True))
        tmp.replace(self.cache / f"{digest}.json")


__all__ = [
    "Knobs",
    "Point",
    "Row",
    "Sweep",
    "Variant",
    "at_load",
    "grid",
    "point_digest",
    "run_point",
]
