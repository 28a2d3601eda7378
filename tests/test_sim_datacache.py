"""The replay's input I/O model: waits without a cache, with a cache filled on first use, and
with staging ahead where the start forecast places a waiting gang."""

from __future__ import annotations

import pytest

from phalanx.core.model import Gpu, Node
from phalanx.profiles import load_profile
from phalanx.sim.datacache import DataCache, dataset_sizes
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import ReplayResult, replay
from phalanx.sim.runtime import RuntimeModel, default_runtime

GB = 1e9


def _nodes(n: int) -> list[Node]:
    return [Node(f"n{i}", 64_000, 512_000, tuple(Gpu(k, "V100", 16_384) for k in range(8))) for i in range(n)]


def _run(jobs: list[JobSpec], mode: str, nodes: int = 1, **io: float) -> ReplayResult:
    spec = default_runtime()
    spec.io = spec.io.model_copy(update={"epochs": 4.0, **io})
    sizes = dataset_sizes(jobs, spec.io)
    return replay(
        _nodes(nodes),
        jobs,
        load_profile("phalanx"),
        runtime=RuntimeModel(spec),
        datasets={k: int(v) for k, v in sizes.items()},
        data_cache=DataCache(spec.io, sizes, mode),
    )


def _job(name: str, submit: float, gpus: int = 8, duration: float = 400.0, ds: str = "big") -> JobSpec:
    return JobSpec(name, submit, duration, gpus, dataset=ds, dataset_bytes=int(100 * GB))


def test_no_cache_reads_every_epoch_from_remote() -> None:
    # 100 GB at 1 Gb/s is 800 s a read; 4 epochs of 100 s compute each: 4 x 700 s waiting
    res = _run([_job("a", 0)], "none", read_gbps=1.0)
    a = res.jobs[0]
    assert a.io_wait_s == pytest.approx(4 * 700.0)
    assert a.io_wait_gpu_s == pytest.approx(8 * 4 * 700.0)
    assert a.end == pytest.approx(400.0 + 2800.0)
    assert res.summary()["io_wait_gpu_h"] == pytest.approx(8 * 2800 / 3600)


def test_first_use_copies_once_and_the_next_job_is_warm() -> None:
    # the copy: 100 GB at 10 Gb/s = 80 s (sooner than reading cold); then NVMe is fast enough
    res = _run([_job("a", 0), _job("b", 10_000)], "first-use", read_gbps=1.0, stage_gbps=10.0)
    a, b = res.jobs
    assert a.io_wait_s == pytest.approx(80.0)
    assert b.io_wait_s == 0.0
    s = res.summary()
    assert s["io_warm_start_pct"] == 50.0 and s["io_staged_tb"] == pytest.approx(0.1)


def test_cold_read_is_chosen_when_it_is_sooner_than_the_copy() -> None:
    # a short job: one epoch reads 100 GB at 20 Gb/s = 40 s over 400 s of compute: no wait at all,
    # while the copy would take 80 s
    res = _run([_job("a", 0)], "first-use", read_gbps=20.0, stage_gbps=10.0, epochs=1.0)
    assert res.jobs[0].io_wait_s == 0.0


def test_lru_evicts_a_dataset_no_job_uses() -> None:
    jobs = [
        _job("a", 0, ds="one"),
        _job("b", 10_000, ds="two"),
        _job("c", 20_000, ds="one"),
    ]
    res = _run(jobs, "first-use", capacity_gb=150.0)  # room for one copy only
    assert [j.io_wait_s for j in res.jobs] == [pytest.approx(80.0)] * 3


def test_staging_ahead_warms_the_node_a_waiting_gang_will_get() -> None:
    # `a` holds the only node until t=2,000; `b` waits, and the forecast says it starts there
    jobs = [
        JobSpec("a", 0, 2000.0, 8),
        _job("b", 1.0),
    ]
    first = _run(jobs, "first-use", plan_every_s=0.0)
    ahead = _run(jobs, "ahead", plan_every_s=0.0)
    assert first.jobs[1].io_wait_s == pytest.approx(80.0)
    assert ahead.jobs[1].io_wait_s == 0.0
    assert ahead.summary()["io_warm_start_pct"] == 100.0


def test_warm_copies_a_slow_dataset_to_every_node_into_free_space_only() -> None:
    # `a` arrives and starts on n0 (copy 80 s); meanwhile n1 copies the dataset too, so `b`
    # starting on n1 later (n0 busy) finds it warm
    jobs = [_job("a", 0), _job("b", 200.0)]
    first = _run(jobs, "first-use", nodes=2)
    warm = _run(jobs, "warm", nodes=2)
    assert [j.io_wait_s for j in first.jobs] == [pytest.approx(80.0)] * 2
    assert [j.io_wait_s for j in warm.jobs] == [pytest.approx(80.0), 0.0]
    assert warm.summary()["io_staged_tb"] == pytest.approx(0.2)  # one copy per node, no more
    # a 50 GB cache has no room for the 100 GB dataset: nothing is warmed, and b waits on input
    tight = _run(jobs, "warm", nodes=2, capacity_gb=50.0)
    assert [j.io_wait_s for j in tight.jobs][1] > 0.0


def test_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown data-cache mode 'later'"):
        DataCache(default_runtime().io, {}, "later")


def _cli_inputs(tmp_path, size: str = "147Gi"):  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.csv"
    trace.write_text(
        "name,submit,duration,gpus,dataset,dataset_size\n"
        f"a,0,4000,8,imagenet,{size}\nb,10,4000,8,imagenet,{size}\nd,8000,4000,8,imagenet,{size}\n"
    )
    cluster = tmp_path / "c.yaml"
    group = "{name: n, count: 2, cpu: 64, memory: 512Gi, gpus: {count: 8, model: V100, memory: 16Gi}}"
    cluster.write_text(f"node_groups:\n  - {group}\n")
    mapping = "submit=submit,duration=duration,gpus=gpus,name=name,dataset=dataset,dataset_size=dataset_size"
    return [
        "simulate",
        "--trace",
        str(trace),
        "--map",
        mapping,
        "--cluster",
        str(cluster),
        "--profiles",
        "phalanx",
    ]


def test_simulate_reports_input_waits_per_mode(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import csv

    from typer.testing import CliRunner

    from phalanx.cli.main import app

    res = CliRunner().invoke(
        app, [*_cli_inputs(tmp_path), "--data-cache", "all", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 0, res.output
    rows = {r["experiment"]: r for r in csv.DictReader((tmp_path / "o" / "metrics.csv").open())}
    none, first = rows["t (data cache: none)"], rows["t (data cache: first-use)"]
    assert float(none["io_wait_gpu_h"]) > 10 * float(first["io_wait_gpu_h"]) > 0
    assert float(first["io_warm_start_pct"]) == pytest.approx(100 / 3, abs=0.01)  # d finds it cached
    assert "GPU-hours lost waiting on input" in (tmp_path / "o" / "index.html").read_text()


def test_bad_dataset_size_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from phalanx.cli.main import app

    res = CliRunner().invoke(app, [*_cli_inputs(tmp_path, "lots"), "--out", str(tmp_path / "o")])
    assert res.exit_code != 0
    assert "t.csv" in res.output and "dataset_size" in res.output and "lots" in res.output
    assert "Traceback" not in res.output
