"""`phalanx bench fgd`: FGD-protocol runs over pod lists x policies x seeds, in the artifact's CSV schema.

Output files (one row per workload, policy, seed):
- `OUT.csv`: `workload,sc_policy,tune,seed,total_gpus,0,...,130` = GPU allocation ratio (%), exactly the
  columns of the authors' `analysis_allo_discrete.csv`;
- `OUT_frag.csv`: `workload,sc_policy,tune,seed,0..130` = fragmented GPU as % of cluster GPUs
  (`analysis_frag_discrete.csv`);
- `OUT_frag_ratio.csv`: same columns, fragmentation rate % (`analysis_frag_ratio_discrete.csv`).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from phalanx.core.errors import SpecError
from phalanx.core.model import Node
from phalanx.profiles import load_profile
from phalanx.sim.fgd import XS, FgdRun, run_fgd
from phalanx.sim.traces.openb import OpenbPod, load_nodes, load_pods

# The artifact's directory names for its six policies; other profiles keep their own name.
POLICY_LABELS = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "gpuclustering": "03-GpuClustering",
    "gpupacking": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
    "phalanx": "07-Phalanx",
}
FRAG_SUFFIX = "_frag"
FRAG_RATIO_SUFFIX = "_frag_ratio"


def label(policy: str) -> str:
    return POLICY_LABELS.get(policy, policy)


def workload_name(pods_path: str | Path) -> str:
    """The artifact's workload name: the pod file's name without `.csv`."""
    return Path(pods_path).name.removesuffix(".csv")


@dataclass(frozen=True, slots=True)
class BenchJob:
    nodes: str
    pods: str
    policy: str
    seed: int
    tune: float


@dataclass(frozen=True, slots=True)
class BenchRow:
    job: BenchJob
    total_gpus: int
    alloc: dict[int, float]
    frag: dict[int, float]
    frag_ratio: dict[int, float]
    failed: int
    submitted: int


@lru_cache(maxsize=4)
def _nodes(path: str) -> list[Node]:
    return load_nodes(path, include_cpu_nodes=True)


@lru_cache(maxsize=8)
def _pods(path: str) -> list[OpenbPod]:
    return load_pods(path)


def run_job(job: BenchJob) -> BenchRow:
    run: FgdRun = run_fgd(
        _nodes(job.nodes), _pods(job.pods), load_profile(job.policy), tune=job.tune, seed=job.seed
    )
    a, f, r = run.discrete()
    return BenchRow(job, run.total_gpus, a, f, r, run.failed, run.submitted)


def parse_seeds(text: str, flag: str = "--seeds") -> list[int]:
    """`42-51`, `42,43,50` or `42`; `flag` is the option the user typed, for the error."""
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise SpecError(flag, f"expected a range like 42-51 or a list like 42,43; got {text!r}") from None
    if not out:
        raise SpecError(flag, "no seeds given")
    return out


def run_bench(
    jobs: Sequence[BenchJob], workers: int, on_done: Callable[[BenchRow], None] | None = None
) -> list[BenchRow]:
    rows: list[BenchRow] = []
    if workers <= 1:
        for j in jobs:
            rows.append(run_job(j))
            if on_done:
                on_done(rows[-1])
    else:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            for row in ex.map(run_job, jobs):
                rows.append(row)
                if on_done:
                    on_done(row)
    return rows


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return repr(round(v, 10)) if isinstance(v, float) else str(v)


def result_paths(out: str | Path) -> list[Path]:
    """The result CSV and its companions (*_frag.csv, *_frag_ratio.csv)."""
    out = Path(out)
    stem = out.with_suffix("")
    return [out, Path(f"{stem}{FRAG_SUFFIX}.csv"), Path(f"{stem}{FRAG_RATIO_SUFFIX}.csv")]


def check_result_path(out: str | Path, flag: str = "--out") -> None:
    """Before a run: say that the result CSV cannot be written, rather than fail after the run."""
    out = Path(out)
    for path in result_paths(out):
        if path.is_dir():
            raise SpecError(flag, f"{path} is a folder; give a CSV file name, e.g. {path / 'results.csv'}")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise SpecError(flag, f"{folder} is a file, so {out} cannot be written under it")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError(flag, f"cannot write in folder {folder}: permission denied")


def write_results(rows: Iterable[BenchRow], out: str | Path, flag: str = "--out") -> list[Path]:
    """Write the CSVs; a path that cannot be written is a SpecError naming `flag`."""
    out = Path(out)
    paths = result_paths(out)
    rows = list(rows)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SpecError(flag, f"cannot create folder {out.parent}: {err.strerror or err}") from None
    for k, path in enumerate(paths):
        try:
            fh = path.open("w", newline="")
        except OSError as err:
            raise SpecError(flag, f"cannot write {path}: {err.strerror or err}") from None
        with fh:
            w = csv.writer(fh)
            head = ["workload", "sc_policy", "tune", "seed"] + (["total_gpus"] if k == 0 else [])
            w.writerow(head + [str(x) for x in XS])
            for r in rows:
                series = (r.alloc, r.frag, r.frag_ratio)[k]
                meta = [workload_name(r.job.pods), label(r.job.policy), _fmt(r.job.tune), str(r.job.seed)]
                if k == 0:
                    meta.append(str(r.total_gpus))
                w.writerow(meta + [_fmt(series.get(x)) for x in XS])
    return paths


def read_table(path: str | Path) -> dict[tuple[str, str], list[dict[int, float]]]:
    """(workload, policy) -> one {x: value} per seed, from a CSV in the artifact's schema."""
    p = Path(path)
    try:
        fh = p.open(newline="")
    except OSError as e:
        raise SpecError(str(p), f"cannot read file: {e.strerror or e}") from None
    with fh:
        try:
            return _read_table(p, csv.DictReader(fh))
        except UnicodeDecodeError:
            raise SpecError(str(p), "not a text file: expected a CSV in the artifact's schema") from None


def _read_table(p: Path, reader: csv.DictReader[str]) -> dict[tuple[str, str], list[dict[int, float]]]:
    out: dict[tuple[str, str], list[dict[int, float]]] = {}
    if not reader.fieldnames or "workload" not in reader.fieldnames or "sc_policy" not in reader.fieldnames:
        raise SpecError(f"{p}:1", "expected the artifact's columns workload,sc_policy,tune,seed,...")
    for row in reader:
        vals: dict[int, float] = {}
        for x in XS:
            v = row.get(str(x), "")
            if v not in ("", None):
                try:
                    vals[x] = float(v)
                except ValueError:
                    raise SpecError(f"{p}:{reader.line_num}", f"column {x} is not a number: {v!r}") from None
        out.setdefault((row["workload"], row["sc_policy"]), []).append(vals)
    return out


def mean_at(series: list[dict[int, float]], x: int) -> float:
    vals = [s[x] for s in series if x in s]
    return sum(vals) / len(vals) if vals else math.nan


@dataclass(frozen=True, slots=True)
class DiffRow:
    workload: str
    policy: str
    seeds: int
    ours: dict[int, float]
    theirs: dict[int, float]


def diff(ours: str | Path, theirs: str | Path, xs: Sequence[int] = (50, 90, 100, 130)) -> list[DiffRow]:
    """Mean over seeds of ours vs theirs at each x, for every (workload, policy) in ours."""
    a = read_table(ours)
    b = read_table(theirs)
    rows = []
    for key in sorted(a):
        ref = b.get(key, [])
        rows.append(
            DiffRow(
                key[0],
                key[1],
                len(a[key]),
                {x: mean_at(a[key], x) for x in xs},
                {x: mean_at(ref, x) for x in xs},
            )
        )
    return rows
