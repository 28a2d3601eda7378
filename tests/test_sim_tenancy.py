"""Replay with queues: evictions, lost work, fair share and Jain's index, waits of large gangs."""

import math

import numpy as np
import pytest

from phalanx.core.errors import SpecError
from phalanx.core.model import Gpu, Node
from phalanx.core.queues import Queue, QueueTree, ResourceQuota
from phalanx.profiles import load_profile
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import replay
from phalanx.sim.tenancy import QueueShares, flat_tree, jain


def gpu_nodes(n, gpus=4):
    return [
        Node(f"n{k}", 64_000, 512 * 1024, tuple(Gpu(j, "V100", 16384) for j in range(gpus))) for k in range(n)
    ]


def two_teams():
    q = {"gpu": ResourceQuota(2000)}
    return QueueTree([Queue("a", quotas=q), Queue("b", quotas=q)])


def team_jobs(duration=1000.0, b_at=700.0):
    return [
        JobSpec("a1", 0.0, duration, 2, queue="a"),
        JobSpec("a2", 0.0, duration, 2, queue="a"),
        JobSpec("b1", b_at, duration, 2, queue="b"),
    ]


def test_jain_index_bounds():
    assert jain(np.array([1.0, 1.0, 1.0])) == pytest.approx(1.0)
    assert jain(np.array([3.0, 0.0, 0.0])) == pytest.approx(1 / 3)


def test_reclaim_in_replay_restores_the_borrowed_share_and_counts_the_lost_work():
    # reclaim takes only work that has run an hour (the profile's minimum runtime), and only just
    # after its checkpoint (the profile's 10 s window): b1 arrives at 4,300 and waits for 4,500
    jobs = team_jobs(duration=6000.0, b_at=4300.0)
    res = replay(gpu_nodes(1), jobs, load_profile("phalanx-queues"), queues=two_teams(), check=True)
    s = res.summary()
    # one a-job evicted at 4,501 s, a second after its checkpoint: 1 s x 2 GPUs lost
    assert s["evictions"] == 1 and s["evicted_tasks"] == 2
    assert s["lost_gpu_h_preempt"] == pytest.approx(2 / 3600)
    victim = [j for j in res.jobs if j.evictions]
    assert len(victim) == 1 and victim[0].spec.queue == "a"
    assert victim[0].end == pytest.approx(7500.0)  # restarts at 6,000 with 1,500 s of work left
    # both queues want GPUs from 4,300 to 7,500 s; for the 201 s b1 waits, a holds 4 of its fair 2
    # and b 0 of 2 (index 0.5), then both hold their fair share (1)
    assert s["completed"] == 3 and s["jain_index"] == pytest.approx((201 * 0.5 + 2999 * 1.0) / 3200)
    b1 = next(j for j in res.jobs if j.spec.name == "b1")
    assert b1.wait == pytest.approx(201.0)


def test_without_reclaim_the_borrowing_queue_keeps_everything_and_fairness_drops():
    res = replay(gpu_nodes(1), team_jobs(), load_profile("phalanx"), queues=two_teams())
    s = res.summary()
    assert s["evictions"] == 0 and s["lost_gpu_h_preempt"] == 0
    assert s["jain_index"] == pytest.approx(0.5)  # 300 s with a on 4 GPUs, b on none
    assert next(j for j in res.jobs if j.spec.name == "b1").wait == pytest.approx(300.0)


def test_flat_tree_fair_share_is_max_min():
    sh = QueueShares(flat_tree(["x", "y", "z"]), 12.0)
    sh.arrive("x", 10)
    sh.arrive("y", 2)
    sh.start("y", 2)
    sh.sample(0.0)
    fair = dict(zip(sh.leaves, sh.fair[-1], strict=True))
    assert fair == {"x": pytest.approx(10.0), "y": pytest.approx(2.0), "z": 0.0}
    assert sh.index[-1] == pytest.approx(0.5)  # y at its share, x at none of it


def test_large_gang_is_not_starved_by_a_stream_of_small_jobs_with_a_reservation():
    """The default earmarks nodes for the big gang once it has waited the reservation's `min_wait`
    (4 h): the stream of small jobs outlasts that, and the gang starts soon after it, not when the
    stream dries up."""
    prof = load_profile("phalanx-queues")
    min_wait = next(a for a in prof.actions if a.name == "reserve").min_wait
    assert min_wait == 14400
    step = 100.0  # a small job arrives every 100 s and runs 800 s: the stream lasts 20,000 s
    jobs = [JobSpec(f"s{k:03d}", k * step, 8 * step, 1) for k in range(200)]
    jobs.append(JobSpec("big", 2.5 * step, 50 * step, 8))
    greedy = replay(gpu_nodes(2), jobs, load_profile("phalanx"))
    reserved = replay(gpu_nodes(2), jobs, prof, check=True)
    assert greedy.summary()["max_wait_large_s"] > min_wait + 3000  # waits for the stream to dry up
    assert min_wait <= reserved.summary()["max_wait_large_s"] <= min_wait + 8 * step
    assert reserved.summary()["completed"] == len(jobs)


def test_queue_not_in_the_tree_is_a_clear_error():
    jobs = [JobSpec("j", 0.0, 10.0, 1, queue="nope", where="trace.csv line 2")]
    with pytest.raises(SpecError) as e:
        replay(gpu_nodes(1), jobs, load_profile("phalanx"), queues=two_teams())
    assert "trace.csv line 2" in str(e.value) and "'nope'" in str(e.value)


def test_las_replay_lets_short_jobs_overtake_a_long_one():
    jobs = [JobSpec("long", 0.0, 20_000.0, 4)] + [
        JobSpec(f"short{k}", 4000.0 + k, 100.0, 4) for k in range(3)
    ]
    fifo = replay(gpu_nodes(1), jobs, load_profile("fifo"))
    las = replay(gpu_nodes(1), jobs, load_profile("las"), check=True)
    short = [j.jct for j in las.jobs if j.spec.name.startswith("short")]
    assert max(x for x in short if x is not None) < 400  # long has 16,000 GPU-s > 3,600: lower level
    assert las.summary()["evictions"] >= 1 and las.summary()["completed"] == 4
    assert las.summary()["avg_jct_s"] < fifo.summary()["avg_jct_s"]
    assert not math.isnan(las.summary()["lost_gpu_h_preempt"])


def test_simulate_cli_with_queues_in_the_cluster_yaml(tmp_path):
    from typer.testing import CliRunner

    from phalanx.cli.main import app

    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "node_groups:\n  - {name: n, count: 1, cpu: 32, memory: 64Gi,"
        " gpus: {count: 4, model: V100, memory: 16Gi}}\n"
        "queues:\n  - {name: a, quotas: {gpu: {deserved: 2}}}\n  - {name: b, quotas: {gpu: {deserved: 2}}}\n"
    )
    trace = tmp_path / "t.csv"
    trace.write_text("t,d,g,team\n0,6000,2,a\n0,6000,2,a\n4300,6000,2,b\n")  # a has run an hour
    args = ["simulate", "--trace", str(trace), "--map", "submit=t,duration=d,gpus=g,queue=team"]
    out = tmp_path / "o"
    r = CliRunner().invoke(app, [*args, "--cluster", str(cluster), "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = (out / "metrics.csv").read_text().splitlines()
    head = rows[0].split(",")
    assert "jain_index" in head and "lost_gpu_h_preempt" in head
    by_profile = {row.split(",")[head.index("profile")]: row.split(",") for row in rows[1:]}
    assert set(by_profile) == {"phalanx-queues", "phalanx", "fifo", "k8s-default"}
    assert by_profile["phalanx-queues"][head.index("evictions")] == "1"
    assert (out / "queue-share-t.png").stat().st_size > 0
    trace.write_text("t,d,g,team\n0,1000,2,nope\n")
    r = CliRunner().invoke(app, [*args, "--cluster", str(cluster), "--out", str(out)])
    assert r.exit_code == 2 and "'nope'" in r.output and "t.csv" in r.output


def test_reclaim_shrinks_an_elastic_job_which_keeps_its_work_and_grows_back():
    nodes = [Node(f"n{k}", 32_000, 65536, (Gpu(0, "V100", 16384),)) for k in range(4)]
    tree = QueueTree(Queue(q, quotas={"gpu": ResourceQuota(2000)}) for q in ("a", "b"))
    # r arrives when e has run an hour (the minimum runtime of the profile's reclaim)
    jobs = [JobSpec("e", 0.0, 8000.0, 4, queue="a", min_tasks=2), JobSpec("r", 4000.0, 500.0, 2, queue="b")]
    res = replay(nodes, jobs, load_profile("phalanx-queues"), queues=tree, check=True)
    e, r = res.jobs
    assert r.start == pytest.approx(4000.0)  # b's deserved 2 GPUs come back from a's elastic surplus
    # e: full speed to t=4000 (half its work), half speed to t=4500 (1/16 more), full speed again: 3,750 s
    assert e.restarts == 0 and e.end == pytest.approx(8250.0)
    s = res.summary()
    assert s["evicted_tasks"] == 2 and s["lost_gpu_h_preempt"] == 0
