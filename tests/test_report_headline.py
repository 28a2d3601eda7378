"""What the report says won: a win only when the per-seed lead exceeds its spread over the seeds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from phalanx.report.headline import Spread, compare, fgd_headline, split_sentence
from phalanx.report.render import render
from phalanx.sim.experiment import FgdExperiment
from phalanx.sim.fgd import FgdRun
from phalanx.sim.jobs import JobSpec
from phalanx.sim.replay import JobRecord, ReplayResult, Sample

TEN = [92.5, 93.8, 93.9, 93.5, 93.5, 94.4, 93.5, 92.4, 94.7, 94.5]


def test_a_gap_inside_the_spread_over_seeds_is_a_tie() -> None:
    # the default run's shape: 0.01 points apart on average, the per-seed differences both ways
    fgd = [a + d for a, d in zip(TEN, [0.2, -0.2, -0.1, -0.6, 0.0, 0.2, 0.3, 0.1, -0.1, 0.1], strict=True)]
    c = compare(TEN, fgd)
    assert c.verdict == "tie" and abs(c.diff) < 0.05 and c.half > abs(c.diff)
    text = fgd_headline("openb-slice", {"phalanx": TEN, "fgd": fgd, "bestfit": [v - 1.5 for v in TEN]})
    assert "phalanx and fgd tie at full load" in text
    assert "spread over 10 seeds: ±" in text and "ahead of bestfit" in text
    assert "allocates the most" not in text


def test_a_lead_on_every_seed_beyond_the_spread_is_a_win() -> None:
    other = [v - 0.5 + 0.05 * (k % 3) for k, v in enumerate(TEN)]
    assert compare(TEN, other).verdict == "win"
    assert compare(other, TEN).verdict == "loss"
    text = fgd_headline("w", {"fgd": other, "phalanx": TEN})
    assert text.startswith("On the FGD protocol (w), phalanx allocates the most GPUs at full load")
    assert "ahead of fgd" in text and "more than the spread over 10 seeds" in text


def test_one_seed_has_no_spread_and_says_so() -> None:
    assert compare([93.7], [93.6]).verdict == "unknown"
    text = fgd_headline("w", {"phalanx": [93.7], "fgd": [93.6]})
    assert "one seed" in text and "tie" not in text and "ahead of" not in text


def test_three_profiles_within_the_spread_all_tie() -> None:
    b = [v + (0.3 if k % 2 else -0.3) for k, v in enumerate(TEN)]
    c = [v + (-0.2 if k % 2 else 0.25) for k, v in enumerate(TEN)]
    text = fgd_headline("w", {"a": TEN, "b": b, "c": c})
    assert " tie at full load" in text and text.count(" and ") == 1 and ", " in text.split(" tie")[0]


def test_spread_is_min_max_and_a_t_interval_of_the_mean() -> None:
    s = Spread.of([1.0, 2.0, 3.0])
    assert (s.mean, s.lo, s.hi, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.half == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert math.isnan(Spread.of([5.0]).half)


def test_the_split_between_allocation_and_jct_is_explained_where_it_occurs() -> None:
    fast = ReplayResult("phalanx", 4, [JobRecord(JobSpec("a", 0.0, 100.0, 4), start=0.0, end=100.0)])
    fast.samples = [Sample(0.0, 1.0, 0.0, 0, 1), Sample(100.0, 0.0, 0.0, 0, 0)]
    slow = ReplayResult("k8s-default", 4, [JobRecord(JobSpec("a", 0.0, 100.0, 4), start=50.0, end=170.0)])
    # half of the gang placed at 0 and holding 2 GPUs for 50 s, then 120 s of a 100 s job
    slow.samples = [Sample(0.0, 0.5, 0.0, 1, 0), Sample(50.0, 1.0, 0.0, 0, 1), Sample(170.0, 0.0, 0.0, 0, 0)]
    rows = [
        {"profile": "phalanx", "gpu_alloc_pct": 50.0, "avg_jct_s": 100.0},
        {"profile": "k8s-default", "gpu_alloc_pct": 70.0, "avg_jct_s": 170.0},
    ]
    text = split_sentence(rows, {"phalanx": fast, "k8s-default": slow})
    assert text.startswith("k8s-default allocates the most GPUs (70.0 % vs phalanx's 50.0 %) yet finishes")
    assert "allocation counts GPUs held, not work done" in text
    # held 100 + 480 = 580 GPU-s for 400 GPU-s of work: 45 % more, 25 % waiting and 20 % slowed
    assert "45 % more GPU-time" in text
    assert "25 % held by gangs partly placed" in text and "20 % by runs" in text
    # no split (the fastest also allocates the most): nothing to explain
    rows[0]["gpu_alloc_pct"] = 80.0
    assert split_sentence(rows, {"phalanx": fast, "k8s-default": slow}) == ""


def _run(alloc_pct: float, gpus: int = 10) -> FgdRun:
    """A made-up FGD run: arrivals at 0..130 % of 10 GPUs, allocation levelling off at alloc_pct."""
    arrived = [10 * gpus * x for x in range(131)]
    used = [min(10 * gpus * x, round(10 * gpus * alloc_pct)) for x in range(131)]
    return FgdRun(gpus, arrived, used, [0.0] * 131, [50.0] * 131)


def test_the_rendered_report_shows_the_spread_over_seeds(tmp_path: Path) -> None:
    exp = FgdExperiment("made-up", [], [], ["phalanx", "fgd"], [42, 43, 44])
    exp.runs = {
        "phalanx": [_run(93.0), _run(94.0), _run(95.0)],
        "fgd": [_run(93.1), _run(93.8), _run(95.0)],
    }
    page = render(tmp_path, [exp], [], "t").read_text()
    assert "phalanx and fgd tie at full load (94.00 % vs 93.97 %" in page
    assert "spread over 3 seeds" in page
    assert "min-max over seeds" in page and "93.00-95.00; ±2.48" in page  # the table's spread cell
    assert "+0.03 ±0.38 over fgd: tie" in page  # and the lead the headline judges
    csv = (tmp_path / "metrics.csv").read_text().splitlines()
    assert "alloc_x100_min" in csv[0] and "alloc_x100_ci95" in csv[0]


def test_a_one_run_lead_that_rounds_to_nothing_is_a_tie() -> None:
    from phalanx.report.headline import replay_headline

    rows = [
        {"profile": "phalanx-queues", "avg_jct_s": 3594.0},
        {"profile": "k8s-default", "avg_jct_s": 3594.4},
        {"profile": "fifo", "avg_jct_s": 4100.0},
    ]
    said = replay_headline("capture", rows)
    assert "phalanx-queues and k8s-default tie" in said and "below" not in said and "fifo" not in said
    rows[1]["avg_jct_s"] = 3800.0
    said = replay_headline("capture", rows)
    assert "phalanx-queues has the lowest" in said and "5 % below k8s-default" in said


def test_a_profile_that_finished_fewer_jobs_is_said_not_ranked_on_its_average_jct() -> None:
    from phalanx.report.headline import replay_headline

    rows = [
        {"profile": "phalanx", "jobs": 3, "completed": 3, "avg_jct_s": 300.0},
        {"profile": "k8s-default", "jobs": 3, "completed": 3, "avg_jct_s": 400.0},
        {"profile": "fifo", "jobs": 3, "completed": 1, "avg_jct_s": 100.0},  # lowest, over 1 job
    ]
    said = replay_headline("t", rows)
    assert "among the profiles that finished all 3 jobs, phalanx has the lowest" in said, said
    assert "25 % below k8s-default" in said and "fifo has" not in said
    assert "fifo finished 1 of 3 jobs: its average JCT counts only those, so it is not compared." in said
    said = replay_headline("t", [rows[0], rows[2]])
    assert "only phalanx finished all 3 jobs, with an average job completion time of 300 s" in said, said
    assert "fifo finished 1 of 3 jobs" in said
    rows[2].update(completed=0, avg_jct_s=float("nan"))
    assert replay_headline("t", rows).endswith("fifo finished none of the 3 jobs."), replay_headline(
        "t", rows
    )
    for r in rows:  # all finished the same number: ranked as before, nothing more said
        r.update(completed=3, avg_jct_s=500.0 if r["profile"] == "fifo" else r["avg_jct_s"])
    said = replay_headline("t", rows)
    assert "phalanx has the lowest" in said and "finished" not in said and "among" not in said, said
