"""`phalanx simulate --capture`: a captured cluster replayed as a what-if, with the usual report."""

from __future__ import annotations

import csv
from pathlib import Path

from typer.testing import CliRunner

from kube_objects import node, pod
from phalanx.cli.main import app
from phalanx.k8s.read.pods import timestamp
from phalanx.k8s.trial import capture as cap

NOW = 1796132018.0 + 600


def _capture(path: Path) -> None:
    run = {"phase": "Running", "startTime": "2026-11-29T10:00:00Z"}
    running = pod("busy", gpus=4, scheduler="default-scheduler", node="n0",
                  annotations={"phalanx.io/estimated-runtime": "259200"})  # fmt: skip
    running["status"] = run
    other = pod("theirs", gpus=4, scheduler="volcano", node="n1")  # another scheduler's: its GPUs are gone
    other["status"] = run
    gang = {"phalanx.io/pod-group": "train"}
    waiting = [pod(f"train-{k}", gpus=4, scheduler="default-scheduler", annotations=gang) for k in range(3)]
    nodes = [node("n0", gpus=8), node("n1", gpus=8)]
    c = cap.Capture({"nodes": nodes, "pods": [running, other, *waiting]}, NOW, ["nodes", "pods"])
    cap.write(c, path)


def test_a_capture_replays_as_a_what_if_with_the_usual_report(tmp_path: Path) -> None:
    _capture(tmp_path / "c.json")
    r = CliRunner().invoke(
        app,
        ["simulate", "--capture", str(tmp_path / "c.json"), "--profiles", "phalanx,fifo", "--out",
         str(tmp_path / "out")],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader((tmp_path / "out" / "metrics.csv").open()))
    replay = [row for row in rows if row.get("experiment", "").startswith("capture")] or rows
    assert {row["profile"] for row in replay} == {"phalanx", "fifo"}
    # 12 GPUs left (4 of n1's are another scheduler's), 4 busy: the gang of 12 waits for "busy" to end,
    # what is left of its 3-day estimate after the 2 days and more it has run
    left = 259200 - (NOW - timestamp("2026-11-29T10:00:00Z"))
    for row in replay:
        assert abs(float(row["p95_wait_s"]) / 0.95 - (left - 1)) < 0.06 * left, row  # p95 of two waits
        assert row["completed"] == "2"
    assert (tmp_path / "out" / "index.html").is_file()
    assert "Idle GPU fragmented (FGD's definition), mean over the replay's time: phalanx " in r.output
    assert "running work placed again by each profile" in (tmp_path / "out" / "index.html").read_text()


def test_a_capture_with_no_workload_of_that_scheduler_is_one_clear_error(tmp_path: Path) -> None:
    _capture(tmp_path / "c.json")
    r = CliRunner().invoke(
        app, ["simulate", "--capture", str(tmp_path / "c.json"), "--scheduler-name", "nobody"]
    )
    assert r.exit_code == 2 and "no workload of 'nobody'" in r.output


def test_a_capture_sweeps_over_profiles_and_seeds_with_the_figures_simulate_gives(tmp_path: Path) -> None:
    """`phalanx sweep --capture`: the same what-if replay, a row per profile and seed."""
    _capture(tmp_path / "c.json")
    base = ["--capture", str(tmp_path / "c.json"), "--profiles", "phalanx,fifo"]
    r = CliRunner().invoke(app, ["simulate", *base, "--out", str(tmp_path / "sim")])
    assert r.exit_code == 0, r.output
    sim = {row["profile"]: row for row in csv.DictReader((tmp_path / "sim" / "metrics.csv").open())}
    r = CliRunner().invoke(
        app, ["sweep", *base, "--seeds", "1-2", "--workers", "1", "--no-cache", "--out", str(tmp_path / "sw")]
    )
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader((tmp_path / "sw" / "sweep.csv").open()))
    got = sorted((row["profile"], row["seed"], row["cluster"]) for row in rows)
    assert got == [(p, s, "capture") for p in ("fifo", "phalanx") for s in ("1", "2")]
    for row in rows:
        want = sim[row["profile"]]
        for k in ("completed", "avg_jct_s", "p95_wait_s"):
            assert float(row[k]) == float(want[k]), (row["profile"], k)
    for bad, said in (
        (["--loads", "2"], "no load applies"),
        (["--trace", str(tmp_path / "c.json")], "drop --trace"),
    ):
        r = CliRunner().invoke(app, ["sweep", *base, *bad, "--no-cache", "--out", str(tmp_path / "x")])
        assert r.exit_code == 2 and said in r.output, r.output
