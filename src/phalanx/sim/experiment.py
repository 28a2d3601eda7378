"""Experiments that compare profiles on one input: the FGD protocol and the time replay.

They run through the same drivers as the CLI and benchmarks and collect what the reports show.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from phalanx.core.model import Node
from phalanx.core.queues import QueueTree
from phalanx.profiles import load_profile
from phalanx.sim.bench import read_table
from phalanx.sim.datacache import DataCache, dataset_sizes
from phalanx.sim.fgd import XS, FgdRun, as_array, run_fgd
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import NodeOutage, ReplayResult, replay
from phalanx.sim.runtime import RuntimeModel
from phalanx.sim.traces.openb import OpenbPod

Progress = Callable[[str], None]


@contextmanager
def empty_points_quiet() -> Iterator[None]:
    """Points with no data (past --tune x 100 % of the capacity) average to nan without numpy's
    "Mean of empty slice" / "All-NaN slice" RuntimeWarning: the reports show them as missing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@dataclass
class FgdExperiment:
    name: str
    nodes: list[Node]
    pods: list[OpenbPod]
    profiles: list[str]
    seeds: list[int]
    tune: float = 1.3
    reference: Path | None = None  # the authors' analysis_allo_discrete.csv, when it covers this workload
    runs: dict[str, list[FgdRun]] = field(default_factory=dict)

    def run(self, log: IO[str] | None = None, progress: Progress | None = None) -> None:
        for prof in self.profiles:
            self.runs[prof] = []
            for seed in self.seeds:
                if progress:
                    progress(f"FGD protocol: {prof}, seed {seed}")
                buf = io.StringIO() if log is not None else None
                self.runs[prof].append(
                    run_fgd(self.nodes, self.pods, load_profile(prof), tune=self.tune, seed=seed, log=buf)
                )
                if log is not None and buf is not None:
                    for line in buf.getvalue().splitlines():
                        rec = json.loads(line)
                        log.write(
                            json.dumps(
                                {"experiment": self.name, "profile": prof, "seed": seed, **rec},
                                separators=(",", ":"),
                            )
                            + "\n"
                        )

    def curves(self, which: int = 0) -> dict[str, np.ndarray]:
        """Mean over seeds per profile: allocation (0), frag % of GPUs (1), frag rate (2), at x = 0..130."""
        out = {}
        for prof, runs in self.runs.items():
            arrs = [as_array(r.discrete()[which]) for r in runs]
            if not arrs:
                out[prof] = np.full(len(XS), np.nan)
                continue
            with empty_points_quiet():
                out[prof] = np.nanmean(np.vstack(arrs), axis=0)
        return out

    def reference_curves(self) -> dict[str, np.ndarray]:
        """The authors' mean allocation curves for this workload, by their policy label."""
        if self.reference is None or not self.reference.is_file():
            return {}
        table = read_table(self.reference)
        out = {}
        for (workload, policy), series in table.items():
            if workload == self.name:
                with empty_points_quiet():
                    out[policy] = np.array([np.nanmean([s.get(x, np.nan) for s in series]) for x in XS])
        return out

    def summary_rows(self) -> list[dict[str, object]]:
        rows = []
        alloc = self.curves(0)
        ratio = self.curves(2)
        for prof, runs in self.runs.items():
            row: dict[str, object] = {
                "experiment": self.name,
                "protocol": "fgd",
                "profile": prof,
                "seeds": len(runs),
            }
            for x in (50, 90, 100, 130):
                row[f"alloc_x{x}"] = round(float(alloc[prof][x]), 2)
            for x in (50, 90):
                row[f"frag_rate_x{x}"] = round(float(ratio[prof][x]), 2)
            row["failed_pods"] = round(sum(r.failed for r in runs) / len(runs), 1)
            row["submitted_pods"] = round(sum(r.submitted for r in runs) / len(runs), 1)
            rows.append(row)
        return rows


@dataclass(kw_only=True)
class ReplayExperiment:
    """Profiles compared on one time replay: built by keyword, so a call site names every input."""

    name: str
    nodes: list[Node]
    jobs: list[JobSpec]
    profiles: list[str]
    topology_levels: list[str] = field(default_factory=list)
    datasets: dict[str, int] = field(default_factory=dict)
    runtime: RuntimeModel = field(default_factory=RuntimeModel)
    seed: int = 0
    cycle_interval: float = 0.0
    outages: Sequence[NodeOutage] = ()
    queues: QueueTree | None = None
    checkpoint_interval: float = 300.0
    half_life: float = 0.0
    eta_every: int = -1  # forecast every n-th waiting arrival; -1: about 500 forecasts per replay
    data_cache: str = ""  # "", or the data-cache mode of the input I/O model: none, first-use, ahead
    results: dict[str, ReplayResult] = field(default_factory=dict)

    def run(self, log: IO[str] | None = None, progress: Progress | None = None) -> None:
        for prof in self.profiles:
            if progress:
                progress(f"time replay: {prof}")
            buf = io.StringIO() if log is not None else None
            data = None
            datasets = self.datasets
            if self.data_cache:
                sizes = dataset_sizes(self.jobs, self.runtime.spec.io)
                data = DataCache(self.runtime.spec.io, sizes, self.data_cache)
                datasets = {**{k: int(v) for k, v in sizes.items()}, **self.datasets}
            self.results[prof] = replay(
                self.nodes,
                self.jobs,
                load_profile(prof),
                topology_levels=self.topology_levels,
                datasets=datasets,
                runtime=self.runtime,
                seed=self.seed,
                cycle_interval=self.cycle_interval,
                outages=self.outages,
                log=buf,
                queues=self.queues,
                checkpoint_interval=self.checkpoint_interval,
                half_life=self.half_life,
                eta_every=self.eta_every if self.eta_every >= 0 else max(1, len(self.jobs) // 500),
                data_cache=data,
            )
            if log is not None and buf is not None:
                for line in buf.getvalue().splitlines():
                    log.write(
                        json.dumps(
                            {"experiment": self.name, "profile": prof, **json.loads(line)},
                            separators=(",", ":"),
                        )
                        + "\n"
                    )

    def summary_rows(self) -> list[dict[str, object]]:
        rows = []
        for res in self.results.values():
            s = res.summary()
            row: dict[str, object] = {"experiment": self.name, "protocol": "replay"}
            row.update({k: (round(v, 2) if isinstance(v, float) else v) for k, v in s.items()})
            rows.append(row)
        return rows
