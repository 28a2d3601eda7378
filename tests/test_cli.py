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


# --- bad input of every kind: one line naming the field or file, exit code 2, no traceback ---

TIRESIAS = "src/phalanx/data/tiresias-60job.csv"


def one_error(r, *parts):  # type: ignore[no-untyped-def]
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    for p in parts:
        assert p in lines[0], (p, lines[0])
    return lines[0]


def test_out_that_is_a_file(tmp_path):
    f = tmp_path / "taken"
    f.write_text("")
    one_error(runner.invoke(app, ["simulate", "--out", str(f)]), "--out", "is a file; give a folder")


def test_binary_trace_is_not_a_text_file():
    one_error(runner.invoke(app, ["simulate", "--trace", "/bin/ls"]), "/bin/ls: not a text file")


def test_bad_openb_node_csv_names_its_line_once(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1000,2,T4\nn2,abc,1000,2,T4\n")
    line = one_error(runner.invoke(app, ["simulate", "--trace", TIRESIAS, "--cluster", str(bad)]))
    assert line.count("bad.csv:3") == 1 and "column 'cpu_milli' must be an integer" in line


def test_seed_errors_name_the_flag_typed():
    one_error(runner.invoke(app, ["simulate", "--seed", "51-42"]), "--seed:", "'51-42'")
    r = runner.invoke(app, ["bench", "fgd", "--nodes", "n", "--pods", "p", "--policy", "fgd", "--seeds", "x"])
    one_error(r, "--seeds:")


def test_data_cache_help_and_values_agree(tmp_path):
    from phalanx.cli.simulate import DATA_CACHE_MODES

    r = runner.invoke(app, ["simulate", "--help"])
    assert "Default: off" not in r.output and "or off" in r.output
    one_error(runner.invoke(app, ["simulate", "--data-cache", "x"]), "--data-cache", "off, none")
    assert "off" in DATA_CACHE_MODES


def test_profile_path_that_does_not_exist_is_a_missing_file():
    one_error(runner.invoke(app, ["schedule", "--profile", "nope.yaml"]), "file not found: nope.yaml")
    one_error(runner.invoke(app, ["schedule", "--profile", "./conf/mine"]), "file not found: ./conf/mine")
    one_error(runner.invoke(app, ["schedule", "--profile", "nope"]), "unknown profile 'nope'", "built-in: ")


def test_misspelt_plugin_argument_names_file_plugin_and_what_it_takes(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("name: x\nactions:\n  - name: allocate\n  - name: consolidate\n    args: {max_movs: 3}\n")
    line = one_error(
        runner.invoke(app, ["schedule", "--profile", str(p)]),
        f"{p}: actions[1].args",
        "consolidate",
        "'max_movs'",
        "takes: max_moves",
    )
    assert "__init__" not in line


def _bench_csv(path, workload, policy):  # type: ignore[no-untyped-def]
    head = "workload,sc_policy,tune,seed,total_gpus," + ",".join(str(x) for x in range(131))
    path.write_text(head + "\n" + f"{workload},{policy},1.3,42,8," + ",".join(["50"] * 131) + "\n")
    return str(path)


def test_bench_diff_with_nothing_in_common(tmp_path):
    a = _bench_csv(tmp_path / "a.csv", "w1", "06-FGD")
    b = _bench_csv(tmp_path / "b.csv", "w2", "06-FGD")
    one_error(runner.invoke(app, ["bench", "diff", a, b]), "share no points")
    r = runner.invoke(app, ["bench", "diff", a, a])
    assert r.exit_code == 0 and "+0.00" in r.output


def test_tune_zero_is_refused():
    one_error(runner.invoke(app, ["simulate", "--tune", "0"]), "--tune: must be in (0, 10]")


def test_low_tune_gives_no_numpy_warning_and_shows_the_points_past_it_as_missing(tmp_path):
    import csv
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice" would fail the command
        r = runner.invoke(
            app, ["simulate", "--tune", "0.5", "--profiles", "fgd", "--seed", "42", "--out", str(tmp_path)]
        )
    assert r.exit_code == 0, r.output
    assert "RuntimeWarning" not in r.output and "empty slice" not in r.output
    fgd = next(ln for ln in r.output.splitlines() if ln.startswith("│ fgd"))  # the FGD table comes first
    assert "nan" not in fgd and fgd.count(" - ") >= 3, fgd
    row = next(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert row["alloc_x100"] == "nan" and float(row["alloc_x50"]) > 0
    assert "n/a: past the load submitted (--tune)" in (tmp_path / "index.html").read_text()


def test_names_never_fold_in_80_columns(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    long = "default-inference-half-precision-replicas"
    wl = tmp_path / "w.yaml"
    wl.write_text(
        "workloads:\n"
        f"  - {{name: {long}, podsets: [{{name: replica-with-a-long-name, count: 2, gpu_fraction: 0.5}}]}}\n"
        f"  - {{name: {long}-too-big, podsets: [{{name: worker, count: 1, gpu: 64}}]}}\n"
    )
    r = runner.invoke(app, ["schedule", "--workloads", str(wl)])
    assert r.exit_code == 0, r.output
    rows = [ln for ln in r.output.splitlines() if ln.startswith("│")]
    assert sum(long in ln and "replica-with-a-long-name-" in ln for ln in rows) == 2, r.output
    assert any(f"{long}-too-big" in ln for ln in rows), r.output


def test_flags_show_no_value_hint():
    for cmd in (["schedule", "--help"], ["simulate", "--help"], ["--help"]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 0 and "<bool>" not in r.output, cmd
    assert "<path>" in runner.invoke(app, ["schedule", "--help"]).output  # options with values keep theirs


def test_version_and_completion():
    from importlib.metadata import version

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"phalanx {version('phalanx')}"
    assert "--install-completion" in runner.invoke(app, ["--help"]).output


def _tiny_replay(tmp_path, jobs):  # type: ignore[no-untyped-def]
    """A generic-CSV trace on 2 nodes x 8 GPUs (n-00, n-01): the arguments of `phalanx simulate`."""
    trace = tmp_path / "t.csv"
    trace.write_text("name,submit,duration,gpus\n" + "".join(f"{n},{s},100,{g}\n" for n, s, g in jobs))
    cluster = tmp_path / "c.yaml"
    group = "{name: n, count: 2, cpu: 64, memory: 512Gi, gpus: {count: 8, model: V100, memory: 16Gi}}"
    cluster.write_text(f"node_groups:\n  - {group}\n")
    return [
        "simulate",
        "--trace",
        str(trace),
        "--map",
        "submit=submit,duration=duration,gpus=gpus,name=name",
        "--cluster",
        str(cluster),
        "--profiles",
        "fifo",
        "--out",
        str(tmp_path / "o"),
    ]


def test_outage_of_an_unknown_node_is_named_up_front(tmp_path):
    outages = tmp_path / "outages.csv"
    outages.write_text("node,start,end\nn-00,5,50\nghost,10,20\n")
    args = [*_tiny_replay(tmp_path, [("a", 0, 2)]), "--outages", str(outages)]
    one_error(runner.invoke(app, args), f"{outages}:3", "unknown node 'ghost'", "n-00, n-01")


def test_a_job_that_can_never_fit_is_said_once(tmp_path, monkeypatch):
    import phalanx.report.render

    monkeypatch.setattr(phalanx.report.render, "render", lambda out, *a: out / "index.html")  # no plots
    r = runner.invoke(app, [*_tiny_replay(tmp_path, [("a", 0, 2), ("big", 10, 64)]), "--data-cache", "all"])
    assert r.exit_code == 0, r.output
    warn = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1, r.output
    assert "big (64 GPUs" in warn[0] and "16 GPUs, at most 8 per node" in warn[0] and "a (" not in warn[0]


def test_replay_table_shows_jobs_done_and_the_headline_says_who_finished_fewer(tmp_path, monkeypatch):
    import phalanx.report.render

    monkeypatch.setattr(phalanx.report.render, "render", lambda out, *a: out / "index.html")  # no plots
    # fifo keeps to arrival order: "big" can never fit, so "b" behind it never starts either
    args = _tiny_replay(tmp_path, [("a", 0, 2), ("big", 10, 64), ("b", 20, 2)])
    args[args.index("fifo")] = "phalanx,fifo"
    r = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    rows = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in _rows(r.output.split("gangs")[0])}
    assert rows.get("phalanx") == "2/3" and rows.get("fifo") == "1/3", r.output
    text = " ".join(r.output.split())
    assert "only phalanx finished 2 of 3 jobs" in text, text
    assert "fifo finished 1 of 3 jobs: its average JCT counts only those" in text, text


def test_never_fit_counts_only_sure_cases():
    from phalanx.core.model import Gpu, Node
    from phalanx.sim.jobs import JobSpec, never_fit

    nodes = [Node(f"n{k}", 8000, 8192, tuple(Gpu(j, "V100", 16384) for j in range(4))) for k in range(2)]
    fits = [JobSpec("ok", 0, 10, 8), JobSpec("share", 0, 10, 1, gpu_milli=500), JobSpec("cpu", 0, 10, 0)]
    assert never_fit(fits, nodes) == ""
    line = never_fit([*fits, JobSpec("wide", 0, 10, 16), JobSpec("tall", 0, 10, 8, tasks=1)], nodes)
    assert line.startswith("2 job(s)") and "wide" in line and "tall" in line and "ok" not in line


def test_builtin_clusters_have_names():
    from pathlib import Path

    from phalanx.cli.simulate import embedded_replay_cluster
    from phalanx.sim.clusters import BUILTIN_CLUSTERS
    from phalanx.sim.inputs import cluster_arg

    c = cluster_arg(Path("tiresias-16xV100"))
    assert [n.name for n in c.nodes] == [n.name for n in embedded_replay_cluster()[0]]
    assert sum(len(n.gpus) for n in c.nodes) == 16 and c.source.startswith("tiresias-16xV100")
    for name in BUILTIN_CLUSTERS:
        assert cluster_arg(Path(name)).nodes, name
    assert "tiresias-16xV100" in runner.invoke(app, ["simulate", "--help"]).output
    r = runner.invoke(app, ["simulate", "--trace", TIRESIAS, "--cluster", "tiresias-16xv100"])
    one_error(r, "unknown built-in cluster 'tiresias-16xv100'", "built-in: tiresias-16xV100, ")
    one_error(
        runner.invoke(app, ["simulate", "--trace", TIRESIAS, "--cluster", "c.yaml"]), "cannot read file"
    )


SCENARIO = "tests/scenarios/rack-gang.yaml"


def test_scenario_command_prints_decisions_and_checks_expectations(tmp_path):
    from pathlib import Path

    r = runner.invoke(app, ["scenario", SCENARIO])
    assert r.exit_code == 0, r.output
    assert "pretrain" in r.output and "required topology" in r.output and "expectation(s) hold" in r.output
    failing = tmp_path / "fail.yaml"
    failing.write_text(Path(SCENARIO).read_text().replace("pretrain: 2", "pretrain: 1"))
    r = runner.invoke(app, ["scenario", str(failing)])
    assert r.exit_code == 1 and "FAILED" in r.output and "expected 1" in r.output
    typo = tmp_path / "typo.yaml"
    typo.write_text(Path(SCENARIO).read_text().replace("too-big: required", "too-bog: required"))
    one_error(
        runner.invoke(app, ["scenario", str(typo)]), "steps[0].expect.pending.too-bog", "unknown workload"
    )
    one_error(runner.invoke(app, ["scenario", str(tmp_path / "none.yaml")]), "cannot read file")


def test_other_binary_inputs_are_named(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("name,submit,duration,gpus\na,0,100,2\n")
    gen = ["simulate", "--trace", str(trace), "--map", "submit=submit,duration=duration,gpus=gpus"]
    one_error(runner.invoke(app, [*gen, "--cluster", "/bin/ls"]), "/bin/ls: not a text file")
    ini = tmp_path / "c.ini"
    ini.write_bytes(b"\xff\xfe\x00\x01")
    one_error(runner.invoke(app, [*gen, "--cluster", str(ini)]), "c.ini: not a text file")
    gavel = tmp_path / "g.trace"
    gavel.write_text("x\n")
    args = ["simulate", "--trace", str(gavel), "--throughputs", "/bin/ls"]
    one_error(runner.invoke(app, args), "/bin/ls: not a text file")
    one_error(runner.invoke(app, ["simulate", "--runtime", "/bin/ls"]), "/bin/ls: not a text file")
    one_error(runner.invoke(app, ["bench", "diff", "/bin/ls", "/bin/ls"]), "/bin/ls: not a text file")


def test_bench_diff_names_never_fold_in_80_columns(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    name = "openb_pod_list_gpushare100-with-a-long-name"
    a = _bench_csv(tmp_path / "a.csv", name, "06-FGD")
    r = runner.invoke(app, ["bench", "diff", a, a])
    assert r.exit_code == 0
    assert any(name in ln and "06-FGD" in ln for ln in r.output.splitlines()), r.output


def test_bench_fgd_bad_file_is_one_line_before_the_progress_bar():
    args = ["bench", "fgd", "--nodes", "/bin/ls", "--pods", "/bin/ls", "--policy", "fgd", "--seeds", "42"]
    one_error(runner.invoke(app, args), "/bin/ls: not a text file")


def test_bench_fgd_out_that_cannot_be_written_is_said_before_the_runs(tmp_path, monkeypatch):
    import pytest

    import phalanx.cli.bench
    from phalanx.core.errors import SpecError
    from phalanx.sim.bench import write_results

    def no_runs(*a):  # type: ignore[no-untyped-def]
        raise AssertionError("the runs started before --out was checked")

    monkeypatch.setattr(phalanx.cli.bench, "run_bench", no_runs)
    data = "src/phalanx/data/openb-slice-"
    args = ["bench", "fgd", "--nodes", f"{data}nodes.csv", "--pods", f"{data}pods.csv", "--policy", "fgd"]
    one_error(runner.invoke(app, [*args, "--out", str(tmp_path)]), "--out:", "is a folder; give a CSV file")
    f = tmp_path / "taken"
    f.write_text("")
    one_error(runner.invoke(app, [*args, "--out", f"{f}/x.csv"]), "--out:", f"{f} is a file")
    with pytest.raises(SpecError, match="--out: cannot create folder"):  # a failure at write time
        write_results([], f / "x.csv")


def test_file_options_the_trace_does_not_read_are_refused_not_ignored(tmp_path):
    import shutil

    for flag, what in (("--throughputs", "Gavel"), ("--fgd-results", "openb")):
        one_error(runner.invoke(app, ["simulate", flag, "/bin/ls"]), f"{flag}: only means", what)
    tir = ["simulate", "--trace", TIRESIAS, "--cluster", "tiresias-16xV100"]
    one_error(runner.invoke(app, [*tir, "--durations", "/bin/ls"]), "--durations: only means", "is tiresias")
    one_error(runner.invoke(app, [*tir, "--throughputs", "/bin/ls"]), "--throughputs: only means")
    # an openb pod list, for which --fgd-results is read: a file that is not the authors' CSV is said
    shutil.copy("src/phalanx/data/openb-slice-nodes.csv", tmp_path / "openb_node_list_gpu_node.csv")
    shutil.copy("src/phalanx/data/openb-slice-pods.csv", tmp_path / "openb_pod_list_x.csv")
    ob = ["simulate", "--trace", str(tmp_path / "openb_pod_list_x.csv"), "--out", str(tmp_path / "o")]
    one_error(runner.invoke(app, [*ob, "--fgd-results", "/bin/ls"]), "/bin/ls: not a text file")
    other = _bench_csv(tmp_path / "a.csv", "openb_pod_list_other", "06-FGD")
    one_error(runner.invoke(app, [*ob, "--fgd-results", other]), "no rows for workload 'openb_pod_list_x'")


def test_negative_cycle_interval_and_an_empty_trace_folder(tmp_path):
    one_error(runner.invoke(app, ["simulate", "--cycle-interval", "-1"]), "--cycle-interval: must be >= 0")
    empty = tmp_path / "traces"
    empty.mkdir()
    r = runner.invoke(app, ["simulate", "--trace", str(empty)])
    assert "throughputs" not in one_error(r, f"{empty}: the folder holds no .trace files")


def _rows(output: str) -> list[str]:
    import re

    return [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", output).splitlines() if ln.startswith("│")]


LONG_NODE = "gpu-node-a100-80gb-rack-07-slot-12"
LONG_POD = "training/llm-pretrain-fp8-worker-000-long-suffix"


def test_status_tables_keep_names_whole_in_80_columns(monkeypatch):
    import phalanx.cli.kube
    from phalanx.k8s.view.status import Status

    st = Status(
        gpus=[{"node": LONG_NODE, "gpu": 0, "model": "A100", "free": "0", "held_by": f"{LONG_POD}, other"}],
        pending=[
            {"workload": "training/a-workload-with-a-long-name", "why": "no room " * 12, "forecast": "-"}
        ],
    )
    monkeypatch.setattr(phalanx.cli.kube, "_connect", lambda *a: object())
    monkeypatch.setattr(phalanx.cli.kube, "collect", lambda api, cfg: st)
    r = runner.invoke(app, ["status"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    rows = _rows(r.output)
    assert any(LONG_NODE in ln and LONG_POD in ln for ln in rows), r.output
    assert any("training/a-workload-with-a-long-name" in ln for ln in rows), r.output


def test_status_shadow_tables_keep_names_whole_in_80_columns(monkeypatch):
    import phalanx.cli.shadow

    summary = {
        "scheduler": "default-scheduler",
        "profile": "phalanx",
        "judged": 1,
        "agreed": 0,
        "by_reason": [{"verdict": "disagree", "reason": "fragmentation " * 8, "pods": 1}],
        "recent": [
            {
                "pod": LONG_POD,
                "real": LONG_NODE,
                "ours": f"{LONG_NODE}-b",
                "verdict": "disagree",
                "reason": "x " * 40,
            }
        ],
    }
    monkeypatch.setattr(phalanx.cli.shadow, "fetch_summary", lambda *a: summary)
    r = runner.invoke(app, ["status", "--shadow", "http://shadow:8090"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert any(LONG_POD in ln and f"{LONG_NODE}-b" in ln for ln in _rows(r.output)), r.output


def test_demo_table_keeps_workload_names_whole_in_80_columns(monkeypatch):
    import phalanx.k8s.lab.demo
    from phalanx.k8s.lab.demo import CopyReport, WorkloadRow

    rows = [WorkloadRow("training/llm-pretrain-gang-with-a-long-name", 4, 2, 8.0, "stuck: half a gang " * 3)]
    monkeypatch.setattr(phalanx.k8s.lab.demo, "run", lambda: [CopyReport("kube-scheduler", rows)])
    r = runner.invoke(app, ["demo"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert any("training/llm-pretrain-gang-with-a-long-name" in ln for ln in _rows(r.output)), r.output


def test_schedule_gpus_fold_rather_than_cut_in_an_80_column_terminal(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text(
        "workloads:\n  - {name: llm-pretrain-fp8-run, "
        "podsets: [{name: worker-with-a-long-name, count: 1, gpu: 8}]}\n"
    )
    r = runner.invoke(app, ["schedule", "--workloads", str(wl)], env={"COLUMNS": "80", "FORCE_COLOR": "1"})
    assert r.exit_code == 0, r.output
    rows = _rows(r.output)
    first = next(k for k, ln in enumerate(rows) if "llm-pretrain-fp8-run" in ln)
    gpus = ""
    for ln in rows[first:]:
        if ln.split("│")[1].strip() not in ("", "llm-pretrain-fp8-run"):
            break
        gpus += ln.split("│")[4].strip()
    assert gpus == "0,1,2,3,4,5,6,7", rows
    assert "…" not in "".join(rows)


def test_bench_diff_gives_ours_theirs_delta_their_own_columns_and_dashes_for_a_missing_point(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "80")
    name = "openb_pod_list_gpushare100"
    a = _bench_csv(tmp_path / "a.csv", name, "06-FGD")
    head = "workload,sc_policy,tune,seed,total_gpus," + ",".join(str(x) for x in range(131))
    (tmp_path / "b.csv").write_text(head + f"\n{name},06-FGD,1.3,42,8," + ",".join(["49.5"] * 130) + ",\n")
    r = runner.invoke(app, ["bench", "diff", a, str(tmp_path / "b.csv")])
    assert r.exit_code == 0, r.output
    assert "nan" not in r.output
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in _rows(r.output)]
    assert [name, "06-FGD", "1", "100", "50.00", "49.50", "+0.50"] in rows, r.output
    assert [name, "06-FGD", "1", "130", "50.00", "-", "-"] in rows, r.output


def test_cluster_without_a_trace_is_refused():
    one_error(runner.invoke(app, ["simulate", "--cluster", "tiresias-16xV100"]), "--cluster: needs --trace")


def test_capture_table_keeps_pod_names_whole_in_80_columns(tmp_path, monkeypatch):
    """`phalanx schedule --capture`: the table the issue showed as `default/infer` over `-half-0`."""
    from kube_objects import node, pod
    from phalanx.k8s.trial import capture as cap

    monkeypatch.setenv("COLUMNS", "80")
    names = [f"inference-half-precision-replica-{k}" for k in range(3)]
    pods = [pod(n, gpus=4, scheduler="default-scheduler") for n in names]
    cap.write(
        cap.Capture({"nodes": [node("n0", gpus=8)], "pods": pods}, 1.8e9, ["nodes", "pods"]),
        tmp_path / "c.json",
    )
    r = runner.invoke(app, ["schedule", "--capture", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    rows = [ln for ln in r.output.splitlines() if ln.startswith("│")]
    for n in names:
        assert any(f"default/{n}" in ln for ln in rows), (n, r.output)


def test_a_certificate_that_cannot_load_is_one_line_in_both_modes(tmp_path):
    """`phalanx scheduler` and `phalanx scheduler --shadow` read --tls-cert-file the same way."""
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: f, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: f, context: {cluster: f, user: u}}]\n"
        "current-context: f\n"
    )
    bad = tmp_path / "not-a-cert.pem"
    bad.write_text("hello\n")
    for mode in ([], ["--shadow"]):
        args = ["scheduler", *mode, "--kubeconfig", str(cfg), "--port", "0"]
        r = CliRunner().invoke(app, [*args, "--tls-cert-file", str(bad), "--tls-private-key-file", str(bad)])
        assert r.exit_code == 2, (mode, r.output)
        assert "--tls-cert-file: cannot load the certificate" in r.output and "Traceback" not in r.output
