"""`phalanx sweep` (issue 36): a grid of replays on one process, on local processes, and on a real
Dask cluster started here on loopback, with the same figures everywhere; results cached by input
digest; each point the same replay `phalanx simulate` runs."""

from __future__ import annotations

import csv
import dataclasses
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from phalanx.cli.main import app
from phalanx.profiles import load_profile
from phalanx.sim.clusters import tiresias_16xv100
from phalanx.sim.experiment import ReplayExperiment
from phalanx.sim.sweep import Knobs, Point, Sweep, Variant, at_load, run_point
from phalanx.sim.traces import tiresias

TRACE = Path(str(resources.files("phalanx.data") / "tiresias-60job.csv"))


def _variant(first: int = 0, name: str = "v100") -> Variant:
    nodes, levels = tiresias_16xv100()
    jobs = tiresias.load_jobs(TRACE)[: first or None]
    return Variant(name, nodes, jobs, levels)


def _figures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every figure but the wall time a replay took."""
    return [{k: v for k, v in r.items() if k != "replay_s"} for r in rows]


def _sweep(**kw: Any) -> Sweep:
    return Sweep([_variant(40)], ["phalanx", "fifo"], [1.0, 2.0], [1, 2], **kw)


def test_a_point_is_the_replay_simulate_runs() -> None:
    """The sweep's row for a point holds the figures `phalanx simulate`'s replay gives for it."""
    v = _variant()
    row = run_point(v, load_profile("phalanx"), Point("v100", "phalanx", 2.0, 42), Knobs())
    exp = ReplayExperiment(
        name="t", nodes=v.nodes, jobs=at_load(v.jobs, 2.0), profiles=["phalanx"], topology_levels=v.levels,
        seed=42, eta_every=0,
    )  # fmt: skip
    exp.run()
    want = exp.results["phalanx"].summary()
    for k in ("completed", "avg_jct_s", "p95_jct_s", "avg_wait_s", "gpu_alloc_pct", "evictions", "cycles"):
        assert row[k] == want[k], k
    assert row["load"] == 2.0 and row["seed"] == 42 and row["cluster"] == "v100"


def test_one_process_local_processes_and_a_dask_cluster_give_the_same_figures() -> None:
    distributed = pytest.importorskip("distributed", reason="Dask's distributed scheduler not installed")
    serial = _sweep(workers=1).run()
    local = _sweep(workers=2).run()
    # a real Dask cluster on loopback, started here; the sweep connects to it by its address
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        on_dask = _sweep(dask=cluster.scheduler_address).run()
        with distributed.Client(cluster) as client:
            ran_on = {w["id"] for w in client.scheduler_info()["workers"].values()}
    assert len(serial) == 2 * 2 * 2 and len(ran_on) == 2
    assert _figures(serial) == _figures(local) == _figures(on_dask)
    assert [(r["profile"], r["load"], r["seed"]) for r in serial][:3] == [
        ("phalanx", 1.0, 1),
        ("phalanx", 1.0, 2),
        ("phalanx", 2.0, 1),
    ]


def test_a_rerun_computes_only_what_changed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _sweep(workers=1, cache=cache)
    rows = first.run()
    kept = sorted(cache.glob("*.json"))
    assert first.cached == 0 and len(kept) == 8
    again = _sweep(workers=1, cache=cache)
    assert _figures(again.run()) == _figures(rows) and again.cached == 8
    more = Sweep([_variant(40)], ["phalanx", "fifo"], [1.0, 2.0, 3.0], [1, 2], workers=1, cache=cache)
    more.run()
    assert more.cached == 8 and len(list(cache.glob("*.json"))) == 12  # only load 3 was computed
    other = Sweep([_variant(30)], ["phalanx"], [1.0], [1], workers=1, cache=cache)  # another input
    other.run()
    assert other.cached == 0
    knobs = dataclasses.replace(Knobs(), checkpoint_interval=60.0)
    changed = Sweep([_variant(40)], ["phalanx"], [1.0], [1], knobs, workers=1, cache=cache)
    changed.run()
    assert changed.cached == 0
    kept[0].write_text("{broken")
    healed = _sweep(workers=1, cache=cache)
    assert _figures(healed.run()) == _figures(rows) and healed.cached == 7  # a torn file is computed again


def test_the_cli_on_a_dask_cluster_writes_one_report_with_the_spread_over_seeds(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["sweep", "--first", "30", "--profiles", "phalanx,fifo", "--loads", "1,2", "--seeds", "1-3"]
    pytest.importorskip("distributed", reason="Dask's distributed scheduler not installed")
    on_dask = ["--dask", "local", "--workers", "2"]  # a real Dask cluster, started on loopback
    r = CliRunner().invoke(app, [*args, *on_dask, "--cache", str(tmp_path / "c"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "12 replays on Dask (local)" in r.output and f"report: {out / 'index.html'}" in r.output
    with (out / "summary.csv").open() as fh:
        summary = list(csv.DictReader(fh))
    assert [(s["profile"], s["load"], s["seeds"]) for s in summary] == [
        ("phalanx", "1.0", "3"),
        ("phalanx", "2.0", "3"),
        ("fifo", "1.0", "3"),
        ("fifo", "2.0", "3"),
    ]
    for s in summary:
        assert float(s["avg_jct_s_min"]) <= float(s["avg_jct_s"]) <= float(s["avg_jct_s_max"])
    with (out / "sweep.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 12
    page = (out / "index.html").read_text()
    assert "sweep-tiresias-16xV100.png" in page and (out / "sweep-tiresias-16xV100.png").stat().st_size > 0
    r = CliRunner().invoke(app, [*args, "--workers", "1", "--cache", str(tmp_path / "c"), "--out", str(out)])
    assert r.exit_code == 0 and "12 of 12 from the cache" in r.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--loads", "1,x"], "--loads: 'x' is not a number"),
        (["--loads", "0"], "--loads: a load must be > 0"),
        (["--seeds", "3-1"], "--seeds"),
        (["--workers", "-1"], "--workers: must be >= 0"),
        (["--profiles", "nope"], "nope"),
        (["--cluster", "gavel-philly-500xV100"], "needs --trace"),
    ],
)
def test_bad_options_are_named_without_a_traceback(args: list[str], said: str, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["sweep", "--no-cache", "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    assert said in r.output and "Traceback" not in r.output


def test_a_file_where_a_folder_goes_is_said_before_any_replay(tmp_path: Path) -> None:
    f = tmp_path / "a-file"
    f.write_text("x")
    for args, said in (
        (["--out", str(f)], "--out"),
        (["--cache", str(f), "--out", str(tmp_path / "o")], "--cache"),
    ):
        r = CliRunner().invoke(app, ["sweep", "--first", "3", *args])
        assert r.exit_code == 2 and f"{said}: {f} is a file" in r.output and "replays" not in r.output, (
            r.output
        )


def test_a_job_that_can_never_fit_is_said_up_front(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n1,64,0,1,m,100,1\n2,1,0,1,m,100,1\n"
    )
    r = CliRunner().invoke(
        app, ["sweep", "--trace", str(trace), "--cluster", "tiresias-16xV100", "--profiles", "fifo",
              "--loads", "1", "--seeds", "1", "--no-cache", "--workers", "1", "--out", str(tmp_path / "o")],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "can never fit" in r.output and "64 GPUs" in r.output


def test_a_dask_scheduler_that_cannot_be_reached_is_named() -> None:
    pytest.importorskip("distributed", reason="Dask's distributed scheduler not installed")
    from phalanx.core.errors import SpecError

    s = Sweep([_variant(5)], ["fifo"], [1.0], [1], dask="tcp://127.0.0.1:1", dask_timeout_s=1.0)
    with pytest.raises(SpecError, match=r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:1"):
        s.run()
