"""Every file the CLI reads, broken every way (binary, truncated, a wrong type, an unknown name):
the command says one line and exits 2, never a traceback.

In process (CliRunner) and with a few dozen examples, so it takes seconds
(`PHALANX_BROKEN_EXAMPLES=1000` for a long, randomised run). `phalanx simulate`
never gets to replay: its experiments' `run` is replaced by a sentinel error, so a broken file
that still parses (a truncation can leave a valid, shorter file) shows as the sentinel line.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from phalanx.cli.main import app
from phalanx.core.errors import SpecError
from phalanx.sim.experiment import FgdExperiment, ReplayExperiment

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "phalanx" / "data"
TIRESIAS = str(DATA / "tiresias-60job.csv")
ACCEPTED = "inputs-accepted"
EXAMPLES = int(os.environ.get("PHALANX_BROKEN_EXAMPLES", "40"))


@dataclass(frozen=True)
class Input:
    """One file the CLI reads: the command around it (FILE marks its place) and a good copy."""

    args: tuple[str, ...]
    name: str  # the file's name (its suffix picks the loader)
    text: str
    numeric: tuple[str, ...] = ()  # CSV: columns a wrong type breaks
    unknown: str = ""  # CSV: a column value no reader knows (outages: a node)


def _head(path: Path, lines: int) -> str:
    return "".join(path.read_text().splitlines(keepends=True)[:lines])


SIM = ("simulate", "--out", "OUT")
INPUTS = {
    "trace": Input(
        (*SIM, "--cluster", "tiresias-16xV100", "--trace", "FILE"),
        "trace.csv",
        _head(DATA / "tiresias-60job.csv", 12),
        ("num_gpu", "submit_time", "duration"),
    ),
    "cluster-csv": Input(
        (*SIM, "--trace", TIRESIAS, "--cluster", "FILE"),
        "nodes.csv",
        _head(DATA / "openb-slice-nodes.csv", 12),
        ("cpu_milli", "memory_mib", "gpu"),
    ),
    "cluster": Input(
        ("schedule", "--cluster", "FILE"), "cluster.yaml", (DATA / "example-cluster.yaml").read_text()
    ),
    "workloads": Input(
        ("schedule", "--workloads", "FILE"), "workloads.yaml", (DATA / "example-workloads.yaml").read_text()
    ),
    "profile": Input(
        ("schedule", "--profile", "FILE"),
        "profile.yaml",
        (ROOT / "src/phalanx/profiles/phalanx.yaml").read_text(),
    ),
    "outages": Input(
        (*SIM, "--trace", TIRESIAS, "--cluster", "tiresias-16xV100", "--outages", "FILE"),
        "outages.csv",
        "node,start,end\nv100-0,10,200\nv100-3,50,60\n",
        ("start", "end"),
        "ghost-node",
    ),
    "scenario": Input(
        ("scenario", "FILE"), "scenario.yaml", (ROOT / "tests/scenarios/rack-gang.yaml").read_text()
    ),
}


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to the int and float values of a YAML document."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, (*path, i))]
    return [path] if isinstance(node, int | float) and not isinstance(node, bool) else []


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


def _objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The mappings that are objects of the schema (unknown fields forbidden): the document and
    the items of its top-level lists."""
    out = [doc]
    for v in doc.values():
        if isinstance(v, list):
            out += [x for x in v if isinstance(x, dict)]
    return out


@st.composite
def broken(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """(input kind, how it is broken, the broken file's bytes)."""
    kind = draw(st.sampled_from(sorted(INPUTS)))
    inp = INPUTS[kind]
    how = draw(st.sampled_from(["binary", "truncated", "wrong type", "unknown name"]))
    if how == "binary":
        return kind, how, b"\xff\xfe\x00" + draw(st.binary(max_size=64))
    if how == "truncated":
        cut = draw(st.integers(0, len(inp.text) - 1))
        return kind, how, inp.text[:cut].encode()
    if inp.name.endswith(".csv"):
        return kind, how, _broken_csv(draw, inp, how).encode()
    return kind, how, _broken_yaml(draw, kind, inp, how).encode()


def _broken_csv(draw: st.DrawFn, inp: Input, how: str) -> str:
    lines = inp.text.splitlines()
    header = lines[0].split(",")
    if how == "unknown name" and not inp.unknown:  # a header no reader knows
        col = draw(st.sampled_from(inp.numeric))
        lines[0] = ",".join("bogus" if h == col else h for h in header)
        return "\n".join(lines) + "\n"
    row = draw(st.integers(1, len(lines) - 1))
    cells = lines[row].split(",")
    if how == "unknown name":
        cells[0] = inp.unknown
    else:
        col = header.index(draw(st.sampled_from(inp.numeric)))
        cells[col] = draw(st.sampled_from(["abc", "1e999", "nan", "[1]", "-5"]))
    lines[row] = ",".join(cells)
    return "\n".join(lines) + "\n"


def _broken_yaml(draw: st.DrawFn, kind: str, inp: Input, how: str) -> str:
    doc = yaml.safe_load(inp.text)
    if how == "wrong type":
        path = draw(st.sampled_from(_leaves(doc)))
        _set(doc, path, draw(st.sampled_from(["lots", [1, 2], {"a": 1}])))
    elif kind == "profile" and draw(st.booleans()):
        doc["actions"][draw(st.integers(0, len(doc["actions"]) - 1))]["name"] = "no-such-action"
    else:
        obj = draw(st.sampled_from(_objects(doc)))
        obj["bogus_field"] = 1
    return yaml.safe_dump(doc, sort_keys=False)


def _refuse_to_run(*_: object, **__: object) -> None:
    raise SpecError(ACCEPTED, "every input was read")


@pytest.fixture(autouse=True)
def _no_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FgdExperiment, "run", _refuse_to_run)
    monkeypatch.setattr(ReplayExperiment, "run", _refuse_to_run)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 100,  # CI: the same examples every run
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(broken())
def test_a_broken_file_gets_one_line_and_exit_code_2(case: tuple[str, str, bytes]) -> None:
    kind, how, content = case
    inp = INPUTS[kind]
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / inp.name
        f.write_bytes(content)
        args = [str(f) if a == "FILE" else str(Path(d) / "out") if a == "OUT" else a for a in inp.args]
        r = CliRunner().invoke(app, args)
    out = r.output
    assert "Traceback" not in out and (r.exception is None or isinstance(r.exception, SystemExit)), (
        kind,
        how,
        content[:300],
        r.exception,
        out,
    )
    accepted = r.exit_code in (0, 1) or ACCEPTED in out  # 1: a scenario whose expectations fail
    if accepted:  # only a cut can leave a file that still reads
        assert how == "truncated", (kind, how, content[:300], out)
        return
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (kind, how, out)
