"""The `phalanx` command: runs on the embedded example, prints JSON, and reports bad input in one line."""

import json

from typer.testing import CliRunner

from phalanx.cli.main import app

runner = CliRunner()


def test_schedule_runs_on_the_embedded_example():
    r = runner.invoke(app, ["schedule"])
    assert r.exit_code == 0, r.output
    assert "Placements (phalanx" in r.output
    assert "llm-pretrain" in r.output


def test_schedule_json_has_binds_and_reasons():
    r = runner.invoke(app, ["schedule", "--json", "--profile", "fgd"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["profile"] == "fgd"
    assert out["binds"] and all("node" in b for b in out["binds"])
    assert all(p["message"] for p in out["pending"])


def test_bad_workloads_file_gives_one_clear_line(tmp_path):
    bad = tmp_path / "w.yaml"
    bad.write_text("workloads:\n  - name: w\n    podsets:\n      - {name: p, gpu_fraction: 1.5}\n")
    r = runner.invoke(app, ["schedule", "--workloads", str(bad)])
    assert r.exit_code == 2
    assert "gpu.fraction: a GPU fraction must be in (0, 1)" in r.output
    assert "Traceback" not in r.output


def test_missing_file_and_broken_yaml(tmp_path):
    r = runner.invoke(app, ["schedule", "--cluster", str(tmp_path / "none.yaml")])
    assert r.exit_code == 2 and "cannot read file" in r.output
    broken = tmp_path / "c.yaml"
    broken.write_text("nodes: [\n")
    r = runner.invoke(app, ["schedule", "--cluster", str(broken)])
    assert r.exit_code == 2 and "not valid YAML" in r.output


def test_unknown_profile():
    r = runner.invoke(app, ["schedule", "--profile", "nope"])
    assert r.exit_code == 2 and "unknown profile 'nope'" in r.output


def test_readme_first_two_commands_are_setup_plus_simulate_and_the_tests():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert (
        block[0]
        == "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/phalanx simulate"
    )
    assert block[1] == ".venv/bin/python -m pytest"
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert ci.strip().splitlines()[-1] == block[1]


def test_main_command_runs_with_no_arguments(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["simulate"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "index.html").is_file()
    assert "FGD protocol: openb-slice" in r.output
    # the example a new user sees first shows phalanx at or above every baseline it is compared with
    import csv

    rows = list(csv.DictReader((tmp_path / "out" / "metrics.csv").open()))
    fgd = {r["profile"]: r for r in rows if r["experiment"] == "openb-slice"}
    assert set(fgd) == {"phalanx", "fgd", "bestfit", "random"}
    for x in ("alloc_x100", "alloc_x130"):
        assert all(float(fgd["phalanx"][x]) >= float(r[x]) for r in fgd.values()), x
    rep = {r["profile"]: r for r in rows if r["experiment"] == "tiresias-60job"}
    assert all(float(rep["phalanx"]["avg_jct_s"]) <= float(r["avg_jct_s"]) for r in rep.values())
