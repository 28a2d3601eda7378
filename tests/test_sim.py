"""The simulator: determinism, conservation, the FGD protocol's bookkeeping, replay behaviour and loaders."""

import io
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from phalanx.cli.main import app
from phalanx.cli.simulate import embedded_replay_cluster
from phalanx.core.errors import SpecError
from phalanx.core.model import Gpu, Node
from phalanx.profiles import load_profile
from phalanx.sim.engine import Engine, Kind
from phalanx.sim.fgd import FgdRun, run_fgd, submission_sequence, typical_task_types
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import NodeOutage, ReplayResult, replay
from phalanx.sim.runtime import JobShape, RuntimeModel, default_runtime
from phalanx.sim.traces import gavel, generic, openb, tiresias

DATA = Path(__file__).resolve().parents[1] / "src" / "phalanx" / "data"
FIX = Path(__file__).parent / "fixtures"
runner = CliRunner()


def slice_inputs():
    return openb.load_nodes(DATA / "openb-slice-nodes.csv"), openb.load_pods(DATA / "openb-slice-pods.csv")


def test_engine_orders_by_time_then_kind_then_sequence():
    e = Engine()
    e.schedule(5.0, Kind.ARRIVAL, "a")
    e.schedule(5.0, Kind.COMPLETION, "b")
    e.schedule(1.0, Kind.ARRIVAL, "c")
    e.schedule(5.0, Kind.ARRIVAL, "d")
    assert [ev.payload for ev in e.pop_batch()] == ["c"]
    assert [ev.payload for ev in e.pop_batch()] == ["b", "a", "d"]
    with pytest.raises(ValueError):
        e.schedule(1.0, Kind.TICK)


def test_fgd_protocol_log_is_identical_to_the_byte_for_a_seed():
    nodes, pods = slice_inputs()
    logs = []
    for _ in range(2):
        buf = io.StringIO()
        run_fgd(nodes, pods, load_profile("phalanx"), seed=7, log=buf)
        logs.append(buf.getvalue())
    assert logs[0] == logs[1] and len(logs[0]) > 1000
    other = io.StringIO()
    run_fgd(nodes, pods, load_profile("phalanx"), seed=8, log=other)
    assert other.getvalue() != logs[0]


def test_fgd_protocol_with_a_move_budget_moves_shares_within_it_and_places_more():
    nodes, pods = slice_inputs()
    plain = run_fgd(nodes, pods, load_profile("phalanx"), seed=42)
    moving = run_fgd(nodes, pods, load_profile("phalanx"), seed=42, moves=0.02, movable=lambda p: True)
    assert plain.moves == 0
    placed = moving.submitted - moving.failed
    assert 0 < moving.moves <= 0.02 * placed
    assert placed > plain.submitted - plain.failed
    assert moving.discrete()[0][130] > plain.discrete()[0][130]
    none_movable = run_fgd(nodes, pods, load_profile("phalanx"), seed=42, moves=0.02, movable=lambda p: False)
    assert none_movable.moves == 0 and none_movable.failed == plain.failed


def test_fgd_protocol_bookkeeping():
    nodes, pods = slice_inputs()
    run = run_fgd(nodes, pods, load_profile("fgd"), seed=1)
    capacity = run.total_gpus * 1000
    assert run.arrived_milli[-1] <= 1.3 * capacity
    assert run.arrived_milli[-1] + 1000 * 8 > 1.3 * capacity  # stopped near the target
    assert all(u <= capacity for u in run.used_milli)  # conservation at every submission
    assert all(0 <= r <= 100 for r in run.frag_ratio)
    assert all(b >= a for a, b in zip(run.used_milli, run.used_milli[1:], strict=False))  # no departures
    a, _, _ = run.discrete()
    assert set(a) == set(range(131))
    assert a[100] < 100 and a[50] == pytest.approx(50, abs=1)


def test_typical_pods_cover_95_percent_and_sum_to_one():
    _, pods = slice_inputs()
    types = typical_task_types(pods)
    assert sum(t.weight for t in types) == pytest.approx(1.0)
    weights = [t.weight for t in types]
    assert weights == sorted(weights, reverse=True)


def test_submission_sequence_is_the_shuffled_list_then_resamples():
    _, pods = slice_inputs()
    seq = submission_sequence(pods, 1_000_000, 1.3, np.random.default_rng(0))
    first = [p.name for _, p in seq[: len(pods)]]
    assert sorted(first) == sorted(p.name for p in pods)
    assert all("-tuned-" in n for n, _ in seq[len(pods) :])
    assert sum(p.gpu_milli_total for _, p in seq) <= 1_300_000


def test_discretisation_rounds_half_to_even_and_fills_gaps():
    run = FgdRun(
        total_gpus=1,
        arrived_milli=[5, 25, 35, 1000],
        used_milli=[5, 25, 35, 900],
        frag_milli=[0] * 4,
        frag_ratio=[0.0] * 4,
    )
    a, _, _ = run.discrete()
    # x = 2 (25 -> 2.5 rounds to 2), x = 4 (35 -> 3.5 rounds to 4); x = 3 has no sample: mean of 2..4
    assert a[2] == 2.5 and a[4] == 3.5 and a[3] == 3.0
    assert 50 not in a


def test_replay_is_deterministic_and_conserves_capacity():
    nodes, levels = embedded_replay_cluster()
    jobs = tiresias.load_jobs(DATA / "tiresias-60job.csv")
    logs = []
    for _ in range(2):
        buf = io.StringIO()
        res = replay(nodes, jobs, load_profile("phalanx"), topology_levels=levels, log=buf, check=True)
        logs.append(buf.getvalue())
        assert all(0 <= s.gpu_alloc <= 1 for s in res.samples)
        assert len(res.completed()) == 60
    assert logs[0] == logs[1]


def test_k8s_default_deadlocks_in_the_replay_and_phalanx_does_not():
    nodes = [Node(f"n{k}", 32_000, 65536, (Gpu(0, "V100", 16384), Gpu(1, "V100", 16384))) for k in range(3)]
    jobs = [JobSpec("a", 0.0, 100.0, 4), JobSpec("b", 0.0, 100.0, 4)]
    bad = replay(nodes, jobs, load_profile("k8s-default"))
    assert sorted(bad.deadlocked) == ["a", "b"] and not bad.completed()
    good = replay(nodes, jobs, load_profile("phalanx"))
    assert len(good.completed()) == 2 and not good.deadlocked
    ends = sorted(j.end for j in good.jobs)
    assert ends == [100.0, 200.0]


def test_a_job_that_never_fits_is_measured_to_the_same_end_by_every_profile():
    """A job larger than any node waits to the end, but the end is the last completion, not the last
    cycle a profile's guards ask for: allocation and the longest wait read alike for profiles that
    placed the same work (a capture's replay read 5 % vs 50 % before)."""
    nodes = [Node(f"n{k}", 32_000, 65536, tuple(Gpu(i, "V100", 16384) for i in range(4))) for k in range(2)]
    jobs = [
        JobSpec("a", 0.0, 3000.0, 4, tasks=1),
        JobSpec("b", 20.0, 1000.0, 2, tasks=1),
        JobSpec("never", 30.0, 500.0, 64, tasks=1),
    ]
    read = {}
    for name in ("phalanx-queues", "k8s-default"):
        res = replay(nodes, jobs, load_profile(name))
        assert res.starved == ["never"] and len(res.completed()) == 2
        assert res.end() == 3000.0
        read[name] = (res.time_avg_alloc(), res.summary()["max_wait_large_s"])
    assert read["phalanx-queues"] == pytest.approx(read["k8s-default"])
    alloc, wait = read["k8s-default"]
    assert wait == 3000.0 - 30.0
    assert alloc == pytest.approx((4 * 3000 + 2 * 1000) / 8 / 3000)


def test_runtime_model_penalises_spread_missing_cache_and_sharing():
    model = RuntimeModel(default_runtime())
    job = JobShape(gpus=8, duration=1000.0, iterations=1000, model="vgg16")
    node_level = model.comm_seconds(job, "node")
    rack_level = model.comm_seconds(job, "rack")
    cluster_level = model.comm_seconds(job, "cluster")
    assert node_level < rack_level < cluster_level
    # vgg16: 553 MB, 8 GPUs over 200 Gb/s: 2*7/8*553e6*8/200e9
    assert rack_level == pytest.approx(2 * 7 / 8 * 553e6 * 8 / 200e9)


def test_replay_spread_makes_cross_rack_gangs_slower():
    def rack_nodes():
        return [
            Node(
                f"n{k}",
                32_000,
                65536,
                tuple(Gpu(j, "V100", 16384) for j in range(4)),
                topology={"rack": f"r{k}"},
            )
            for k in range(2)
        ]

    job = [JobSpec("big", 0.0, 1000.0, 8, iterations=1000, model="vgg16")]
    res = replay(rack_nodes(), job, load_profile("phalanx"), topology_levels=["rack"])
    assert res.jobs[0].level == "cluster"
    assert res.jobs[0].end > 1000.0
    off = replay(
        rack_nodes(),
        job,
        load_profile("phalanx"),
        topology_levels=["rack"],
        runtime=RuntimeModel(
            default_runtime().model_copy(
                update={"spread": default_runtime().spread.model_copy(update={"enabled": False})}
            )
        ),
    )
    assert off.jobs[0].end == pytest.approx(1000.0)


def test_node_failure_restarts_the_job_from_its_last_checkpoint():
    nodes = [Node(f"n{k}", 32_000, 65536, (Gpu(0, "V100", 16384),)) for k in range(2)]
    jobs = [JobSpec("j", 0.0, 100.0, 1)]
    fail = [NodeOutage("n0", 45.0, 500.0)]
    res = replay(nodes, jobs, load_profile("phalanx"), outages=fail, check=True, checkpoint_interval=20)
    j = res.jobs[0]
    # checkpoints at 20 s and 40 s: 40 s kept, 5 s lost, 60 s more on n1
    assert j.restarts == 1 and j.end == pytest.approx(105.0)
    assert res.summary()["lost_gpu_h_failure"] == pytest.approx(5 / 3600)
    assert res.summary()["lost_gpu_h_preempt"] == 0
    never = replay(nodes, jobs, load_profile("phalanx"), outages=fail, checkpoint_interval=0)
    assert never.jobs[0].end == pytest.approx(145.0)  # no checkpoints: starts over


def test_each_eviction_counts_its_restart_in_gpu_hours():
    """A high-priority job evicts a running one: its restart (60 s of its 2 GPUs by default, or what
    the job says) is counted beside the work lost; a node failure is not an eviction."""
    nodes = [Node("n0", 32_000, 65536, tuple(Gpu(k, "V100", 16384) for k in range(2)))]
    low = JobSpec("low", 0.0, 1000.0, 2, priority=0)
    high = JobSpec("high", 100.0, 100.0, 2, priority=10)
    res = replay(nodes, [low, high], load_profile("phalanx-queues"), checkpoint_interval=50)
    s = res.summary()
    assert s["evictions"] == 1 and s["evicted_gpus"] == 2
    assert s["lost_gpu_h_restart"] == pytest.approx(2 * 60 / 3600)
    # one eviction: its hour lost its work and its restart
    assert s["lost_gpu_h_worst_hour"] == pytest.approx(s["lost_gpu_h_preempt"] + s["lost_gpu_h_restart"])
    said = replay(
        nodes, [JobSpec("low", 0.0, 1000.0, 2, restart_s=300.0), high], load_profile("phalanx-queues")
    )
    assert said.summary()["lost_gpu_h_restart"] == pytest.approx(2 * 300 / 3600)
    free = replay(nodes, [low, high], load_profile("phalanx-queues"), restart_cost=0.0)
    assert free.summary()["lost_gpu_h_restart"] == 0
    with pytest.raises(SpecError, match="restart cost must be a finite number of seconds >= 0"):
        JobSpec("bad", 0.0, 1.0, 1, restart_s=-1.0)


def test_a_generic_csv_says_each_jobs_restart_cost(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("ts,dur,gpus,restart\n0,10,1,120\n5,10,1,x\n")
    m = generic.parse_mapping("submit=ts,duration=dur,gpus=gpus,restart=restart")
    with pytest.raises(SpecError, match=r"t\.csv:3"):
        generic.load_jobs(f, m)
    f.write_text("ts,dur,gpus,restart\n0,10,1,120\n")
    assert generic.load_jobs(f, m)[0].restart_s == 120.0


def test_loaders_report_file_and_line():
    with pytest.raises(SpecError, match=r"tiresias-bad\.csv:3: column 'duration' must be >= 0, got -5"):
        tiresias.load_jobs(FIX / "tiresias-bad.csv")
    with pytest.raises(SpecError, match=r"openb-pods-bad\.csv:3: a 2-GPU pod must take whole GPUs"):
        openb.load_pods(FIX / "openb-pods-bad.csv")
    with pytest.raises(SpecError, match=r"openb-nodes-bad\.csv:3: column 'cpu_milli' must be an integer"):
        openb.load_nodes(FIX / "openb-nodes-bad.csv")
    table = {("ResNet-50 (batch size 64)", 1): 10.0}
    with pytest.raises(SpecError, match=r"gavel-bad\.trace:2: expected 7 or 10 tab-separated fields"):
        gavel.load_trace(FIX / "gavel-bad.trace", table)
    with pytest.raises(SpecError, match="unknown field 'gpuz'"):
        generic.parse_mapping("submit=start,duration=d,gpuz=ngpu")
    with pytest.raises(SpecError, match="needs duration="):
        generic.parse_mapping("submit=start")


def test_generic_csv_with_iso_dates():
    jobs = generic.load_jobs(
        FIX / "generic.csv", generic.parse_mapping("submit=start,end=end,gpus=ngpu,queue=vc,name=job")
    )
    assert [(j.name, j.submit, j.duration, j.gpus, j.queue) for j in jobs] == [
        ("a", 0.0, 3600.0, 2, "vc1"),
        ("b", 1800.0, 600.0, 1, "vc2"),
    ]


def test_gavel_extrapolates_unmeasured_scales():
    table = {("A3C", 1): 2.0, ("LM", 1): 1.0, ("LM", 8): 6.0}
    assert gavel.throughput(table, "A3C", 4) == pytest.approx(8.0)
    assert gavel.throughput(table, "LM", 16) == pytest.approx(12.0)
    assert gavel.throughput(table, "LM", 8) == 6.0
    assert gavel.throughput(table, "Unknown", 2) is None


def test_simulate_cli_writes_the_report(tmp_path):
    out = tmp_path / "out"
    r = runner.invoke(app, ["simulate", "--out", str(out), "--profiles", "phalanx,fgd"])
    assert r.exit_code == 0, r.output
    for name in (
        "index.html",
        "metrics.csv",
        "decisions.jsonl",
        "fgd-alloc-openb-slice.png",
        "jct-cdf-tiresias-60job.png",
        "gpu-time-tiresias-60job.png",
        "style.css",
    ):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    # one queue: no per-queue plots (a lone bar in half the page said nothing)
    assert not (out / "wait-queue-tiresias-60job.png").exists()
    html = (out / "index.html").read_text()
    assert "FGD protocol: openb-slice" in html and "Time replay: tiresias-60job" in html
    metrics = (out / "metrics.csv").read_text().splitlines()
    assert metrics[0].startswith("experiment,protocol,profile") and len(metrics) == 5


def test_simulate_cli_on_a_trace_file_and_bad_input(tmp_path):
    r = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(FIX / "tiresias-ok.csv"),
            "--cluster",
            str(Path(tiresias.__file__).parent / "nonexistent.csv"),
            "--out",
            str(tmp_path),
        ],
    )
    assert r.exit_code == 2 and "cannot read file" in r.output
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "node_groups:\n  - {name: n, count: 2, cpu: 32, memory: 64Gi, "
        "gpus: {count: 4, model: V100, memory: 16Gi}}\n"
    )
    r = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(FIX / "tiresias-ok.csv"),
            "--cluster",
            str(cluster),
            "--profiles",
            "phalanx,k8s-default",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["simulate", "--trace", str(FIX / "tiresias-bad.csv"), "--cluster", str(cluster)])
    assert r.exit_code == 2 and "tiresias-bad.csv:3" in r.output


def test_bench_fgd_writes_the_artifact_schema_and_diff_reads_it(tmp_path):
    out = tmp_path / "res.csv"
    r = runner.invoke(
        app,
        [
            "bench",
            "fgd",
            "--nodes",
            str(DATA / "openb-slice-nodes.csv"),
            "--pods",
            str(DATA / "openb-slice-pods.csv"),
            "--policy",
            "fgd",
            "--policy",
            "bestfit",
            "--seeds",
            "42",
            "--out",
            str(out),
            "--workers",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    head = out.read_text().splitlines()[0].split(",")
    assert head[:5] == ["workload", "sc_policy", "tune", "seed", "total_gpus"] and head[5:] == [
        str(x) for x in range(131)
    ]
    rows = out.read_text().splitlines()[1:]
    assert {r.split(",")[1] for r in rows} == {"06-FGD", "05-BestFit"}
    assert (tmp_path / "res_frag.csv").is_file() and (tmp_path / "res_frag_ratio.csv").is_file()
    r = runner.invoke(app, ["bench", "diff", str(out), str(out)])
    assert r.exit_code == 0 and "+0.00" in r.output


def test_submission_sequence_tunes_down_a_list_larger_than_the_target():
    _, pods = slice_inputs()
    seq = submission_sequence(pods, 100_000, 1.3, np.random.default_rng(0))
    assert sum(p.gpu_milli_total for _, p in seq) <= 130_000 and len(seq) < len(pods)


def no_spread() -> RuntimeModel:
    base = default_runtime()
    return RuntimeModel(base.model_copy(update={"spread": base.spread.model_copy(update={"enabled": False})}))


def test_elastic_job_runs_at_its_minimum_then_grows_and_keeps_its_work():
    nodes = [Node(f"n{k}", 32_000, 65536, (Gpu(0, "V100", 16384),)) for k in range(4)]
    rigid = JobSpec("r", 0.0, 50.0, 2)
    for prof in ("phalanx", "phalanx-queues"):
        res = replay(
            nodes, [rigid, JobSpec("e", 1.0, 100.0, 4, min_tasks=2)], load_profile(prof), runtime=no_spread()
        )
        e = {j.spec.name: j for j in res.jobs}["e"]
        # 2 of 4 tasks from t=1 (half speed): 49 s x 0.5 = 24.5 s of work; all 4 from t=50: 75.5 s more
        assert e.start == pytest.approx(1.0) and e.end == pytest.approx(125.5), prof
        assert e.restarts == 0 and res.summary()["lost_gpu_h_preempt"] == 0
    gang = replay(nodes, [rigid, JobSpec("e", 1.0, 100.0, 4)], load_profile("phalanx"), runtime=no_spread())
    assert {j.spec.name: j for j in gang.jobs}["e"].end == pytest.approx(
        150.0
    )  # a rigid gang waits for all 4
    with pytest.raises(SpecError, match="min tasks must be in"):
        JobSpec("bad", 0.0, 1.0, 2, min_tasks=3)


def test_generic_csv_marks_elastic_jobs_and_rejects_a_bad_minimum(tmp_path):
    f = tmp_path / "elastic.csv"
    f.write_text("t,d,g,lo\n0,10,4,2\n5,10,2,3\n")
    m = generic.parse_mapping("submit=t,duration=d,gpus=g,min_tasks=lo")
    with pytest.raises(SpecError, match=r"elastic\.csv:3: min tasks must be in \[0, 2\], got 3"):
        generic.load_jobs(f, m)
    f.write_text("t,d,g,lo\n0,10,4,2\n")
    (job,) = generic.load_jobs(f, m)
    assert job.min_count == 2 and job.workload().min_available == 2 and job.task_count == 4


def test_the_worst_hour_of_evictions_is_a_sliding_hour():
    """What a GPU-hour budget bounds: the most any hour lost, wherever the hour starts (an eviction
    exactly an hour before another is out of its hour)."""
    res = ReplayResult("p", 8, [])
    res.eviction_times = [0.0, 1800.0, 3600.0, 3700.0, 9000.0]
    res.eviction_costs = [3600.0, 3600.0, 3600.0, 3600.0, 7200.0]
    assert res.worst_hour_lost_gpu_h() == pytest.approx(3.0)  # 1800, 3600 and 3700
    assert ReplayResult("p", 8, []).worst_hour_lost_gpu_h() == 0.0
