"""The twin's distributed data cache (issue 33, item 6): a dataset striped over a cache group,
fetched once for the group, read from the members' NVMe; against per-node copies.

The numbers are worked by hand in each test's comment: 4 nodes of 8 V100, a node cache of 100 GB,
the defaults of runtime.yaml otherwise (read 1 Gb/s, stage 10 Gb/s, NVMe 16 Gb/s, NIC 10 Gb/s,
source 100 Gb/s).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from phalanx.cli.main import app
from phalanx.core.model import Gpu, Node
from phalanx.profiles import load_profile
from phalanx.sim.datacache import DataCache, dataset_sizes
from phalanx.sim.distcache import CacheGroup
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import NodeOutage, ReplayResult, replay
from phalanx.sim.runtime import DistributedSpec, IoSpec, RuntimeModel, default_runtime
from test_cli import _tiny_replay

GB = 1e9


def _nodes(n: int) -> list[Node]:
    return [Node(f"n{i}", 64_000, 512_000, tuple(Gpu(k, "V100", 16_384) for k in range(8))) for i in range(n)]


def _io(**kw: object) -> IoSpec:
    dist = {k: kw.pop(k) for k in ("group", "replicas") if k in kw}
    io = default_runtime().io.model_copy(update={"epochs": 4.0, "capacity_gb": 100.0, **kw})
    io.distributed = io.distributed.model_copy(update=dist)
    return io


def _run(
    jobs: list[JobSpec],
    mode: str,
    nodes: int = 4,
    outages: tuple[NodeOutage, ...] = (),
    profile: str = "phalanx",
    **kw: object,
) -> ReplayResult:
    spec = default_runtime()
    spec.io = _io(**kw)
    sizes = dataset_sizes(jobs, spec.io)
    return replay(
        _nodes(nodes),
        jobs,
        load_profile(profile),
        runtime=RuntimeModel(spec),
        datasets={k: int(v) for k, v in sizes.items()},
        data_cache=DataCache(spec.io, sizes, mode),
        outages=outages,
    )


def _job(name: str, submit: float, gpus: int = 32, gb: float = 400.0, ds: str = "big") -> JobSpec:
    return JobSpec(name, submit, 400.0, gpus, dataset=ds, dataset_bytes=int(gb * GB))


def _data(res: ReplayResult) -> DataCache:
    assert res.data is not None
    return res.data


def test_a_dataset_four_times_a_node_is_fetched_once_for_the_group() -> None:
    # 400 GB over 4 members: fetched at min(100, 4 x 10) = 40 Gb/s -> 80 s. An epoch (100 s of
    # compute) reads 100 GB per node: 25 GB from its own NVMe (12.5 s), 75 GB from peers over
    # 10 Gb/s (60 s); each member serves 100 GB (50 s) -> 60 s, no wait. Epochs 2-4 fetch nothing.
    res = _run([_job("a", 0)], "distributed")
    a = res.jobs[0]
    assert a.io_wait_s == pytest.approx(80.0)
    d = _data(res)
    assert d.egress_bytes() == pytest.approx(400 * GB)
    assert d.later_epoch_bytes == 0.0
    s = res.summary()
    assert s["io_egress_tb"] == pytest.approx(0.4) and s["io_egress_later_epochs_tb"] == 0.0


def test_per_node_copies_cannot_hold_it_and_read_every_epoch_from_the_source() -> None:
    # no node holds 400 GB: each reads its 100 GB shard at 1 Gb/s (800 s) per 100 s epoch:
    # 4 x 700 s waiting; the source serves 400 GB every epoch, 1.2 TB of it in epochs 2-4
    res = _run([_job("a", 0)], "first-use")
    assert res.jobs[0].io_wait_s == pytest.approx(4 * 700.0)
    d = _data(res)
    assert d.staged_bytes == 0.0
    assert d.egress_bytes() == pytest.approx(1600 * GB)
    assert d.later_epoch_bytes == pytest.approx(1200 * GB)


def test_per_node_copies_fetch_once_per_node_the_group_once() -> None:
    # 80 GB fits a node: a 32-GPU gang copies it on each of its 4 nodes (320 GB); the group once
    jobs = [_job("a", 0, gb=80.0)]
    copies = _data(_run(jobs, "first-use"))
    group = _data(_run(jobs, "distributed"))
    assert copies.egress_bytes() == pytest.approx(4 * 80 * GB)
    assert group.egress_bytes() == pytest.approx(80 * GB)


def test_the_next_job_on_the_dataset_starts_warm_and_fetches_nothing() -> None:
    # `b` runs on one node (8 GPUs) after `a`: its epoch reads 400 GB, 100 GB from its own NVMe
    # (50 s) and 300 GB from peers over its NIC (240 s) for 100 s of compute -> 4 x 140 s waiting
    res = _run([_job("a", 0), _job("b", 10_000, gpus=8)], "distributed")
    a, b = res.jobs
    assert a.io_wait_s == pytest.approx(80.0) and b.io_wait_s == pytest.approx(4 * 140.0)
    d = _data(res)
    assert d.egress_bytes() == pytest.approx(400 * GB)
    assert d.warm_starts == 1


def test_a_job_starting_during_the_fetch_waits_for_its_end_only() -> None:
    # `a` (16 GPUs) starts at 0 and the fetch ends at 80 s; `b` (16 GPUs) starts at 30 s: it waits 50 s,
    # and its epochs (200 GB per node: 50 GB local 25 s, 150 GB peers 120 s) wait 20 s each
    res = _run([_job("a", 0, gpus=16), _job("b", 30, gpus=16)], "distributed")
    a, b = res.jobs
    assert a.io_wait_s == pytest.approx(80.0 + 4 * 20.0)
    assert b.io_wait_s == pytest.approx(50.0 + 4 * 20.0)
    assert _data(res).egress_bytes() == pytest.approx(400 * GB)


def test_a_lost_member_without_replicas_loses_its_stripe_and_the_next_job_fetches_it() -> None:
    # n3 fails at 1,000 s (after `a`) and comes back at 2,000 s empty; `b` at 5,000 s: the group
    # lacks n3's quarter (100 GB) and fetches it again from the source: 500 GB in all
    out = (NodeOutage("n3", 1_000.0, 2_000.0),)
    res = _run([_job("a", 0), _job("b", 5_000)], "distributed", outages=out)
    d = _data(res)
    assert d.egress_bytes() == pytest.approx(500 * GB)
    assert d.group is not None and d.group.recopied_bytes == 0.0
    # the 100 GB at min(100, 4 x 10) Gb/s: 20 s
    assert res.jobs[1].io_wait_s == pytest.approx(20.0)


def test_a_lost_member_with_two_replicas_loses_nothing() -> None:
    # 300 GB x 2 replicas over 4 x 200 GB; n3 lost: its 150 GB of blocks copied again from the
    # other replicas (600 GB still fit 3 x 200 GB); `b` fetches nothing from the source
    out = (NodeOutage("n3", 1_000.0, 2_000.0),)
    res = _run(
        [_job("a", 0, gb=300.0), _job("b", 5_000, gb=300.0)],
        "distributed",
        outages=out,
        replicas=2,
        capacity_gb=200.0,
    )
    d = _data(res)
    assert d.egress_bytes() == pytest.approx(300 * GB)
    assert d.group is not None and d.group.recopied_bytes == pytest.approx(150 * GB)


def test_a_dataset_a_hundred_times_a_node_on_a_hundred_members() -> None:
    io = _io(capacity_gb=10.0)
    g = CacheGroup(io, list(range(100)))
    # 1,000 GB at min(100, 100 x 10) Gb/s: 80 s; all of it cached, 10 GB on each member
    assert g.fetch("huge", 1000 * GB, 0.0) == pytest.approx(80.0)
    assert g.cached_fraction("huge", 1000 * GB) == 1.0
    assert g.stored_on(7, "huge") == pytest.approx(10 * GB)
    assert g.fetch("huge", 1000 * GB, 100.0) == 0.0 and g.fetched_bytes == pytest.approx(1000 * GB)


def test_what_the_group_cannot_hold_is_read_from_the_source_every_epoch() -> None:
    # 100x a node on 63 members: 63 % cached; an 8-node reader of 1,000 GB reads 125 GB per
    # node per epoch, 37 % of it (46.25 GB) from the source at 1 Gb/s (125 MB/s): 370 s
    g = CacheGroup(_io(capacity_gb=10.0), list(range(63)))
    g.fetch("huge", 1000 * GB, 0.0)
    assert g.cached_fraction("huge", 1000 * GB) == pytest.approx(0.63)
    assert g.epoch_read_s("huge", 1000 * GB, list(range(8)), 1e9 / 8) == pytest.approx(370.0)


def test_lru_over_the_group_evicts_a_dataset_no_job_reads() -> None:
    # two datasets of 300 GB in a group of 400 GB: `two` evicts `one` once `a` is done; `c` fetches
    # `one` again: 900 GB from the source
    jobs = [
        _job("a", 0, gb=300.0, ds="one"),
        _job("b", 10_000, gb=300.0, ds="two"),
        _job("c", 20_000, gb=300.0, ds="one"),
    ]
    d = _data(_run(jobs, "distributed"))
    assert d.egress_bytes() == pytest.approx(900 * GB)


def test_a_job_waits_for_a_member_and_without_the_mount_filter_reads_over_the_network() -> None:
    # group: the first 2 nodes (200 GB), both taken by `hold` until 50,000 s. With the `phalanx`
    # profile (its dataset-mount filter) the 8-GPU job reading 160 GB waits for a member, as on
    # Kubernetes: the fetch at min(100, 2 x 10) = 20 Gb/s (64 s), then per epoch 80 GB from its own
    # NVMe (40 s) and 80 GB over its NIC (64 s) for 100 s of compute: no wait.
    hold = JobSpec("hold", 0, 50_000.0, 16)
    res = _run([hold, _job("a", 1, gpus=8, gb=160.0)], "distributed", group="2")
    a = res.jobs[1]
    assert a.start == pytest.approx(50_000.0) and a.io_wait_s == pytest.approx(64.0)
    # a profile without the filter (fifo) places it on n2 or n3 at once: all 160 GB over its NIC
    # per epoch, 128 s for 100 s of compute -> 4 x 28 s after the fetch
    res = _run([hold, _job("a", 1, gpus=8, gb=160.0)], "distributed", group="2", profile="fifo")
    a = res.jobs[1]
    assert a.start == pytest.approx(1.0) and a.io_wait_s == pytest.approx(64.0 + 4 * 28.0)


def test_a_count_larger_than_the_cluster_is_named() -> None:
    with pytest.raises(ValueError, match=r"io.distributed.group: 9 nodes asked, the cluster has 4"):
        _run([_job("a", 0)], "distributed", group="9")


@pytest.mark.parametrize("bad", ["bogus", "0", "=x", ""])
def test_a_bad_group_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="must be all, a node count"):
        DistributedSpec(group=bad)


def _cli(tmp_path: Path, *extra: str) -> list[str]:
    """`phalanx simulate` on a one-job generic trace (test_cli's tiny replay), with `extra`."""
    return [*_tiny_replay(tmp_path, [("a", 0, 2)]), *extra]


def _one_line(args: list[str]) -> str:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


def test_a_misspelt_mode_is_one_line_naming_the_option(tmp_path: Path) -> None:
    line = _one_line(_cli(tmp_path, "--data-cache", "distributd"))
    assert "--data-cache" in line and "distributed" in line and "'distributd'" in line


def test_a_bad_runtime_field_is_one_line_naming_it(tmp_path: Path) -> None:
    rt = tmp_path / "runtime.yaml"
    rt.write_text("io:\n  distributed:\n    replicas: 0\n")
    line = _one_line(_cli(tmp_path, "--data-cache", "distributed", "--runtime", str(rt)))
    assert "io.distributed.replicas" in line
