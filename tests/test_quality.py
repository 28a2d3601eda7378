"""Lint, types and the layering contract are part of the test suite, so CI keeps them clean."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def _tool(name: str) -> str:
    exe = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(exe).exists():
        pytest.fail(f"{name} is not installed; install the dev extras: pip install -e '.[dev]'")
    return exe


def test_ruff_clean():
    r = _run(_tool("ruff"), "check", "src", "tests", "benchmarks")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run(_tool("ruff"), "format", "--check", "src", "tests", "benchmarks")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_clean():
    r = _run(_tool("mypy"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_layering_contract_kept():
    r = _run(_tool("lint-imports"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "broken" in r.stdout and "0 broken" in r.stdout


def test_user_facing_text_names_no_internal_issue_numbers():
    """README, docs, the chart and the CLI's help and messages say what changed, not 'since issue 26'
    (docs/benchmarks.md records runs by the issue that made them, and is left out)."""
    import re

    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "src/phalanx/cli").glob("*.py")]
    files += [
        p
        for p in (ROOT / "deploy").rglob("*")
        if p.is_file() and p.suffix in (".yaml", ".yml", ".md", ".txt", ".tpl")
    ]
    issue = re.compile(r"\bissues? #?[0-9]+", re.IGNORECASE)
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        if p.name != "benchmarks.md"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if issue.search(line)
    ]
    assert not found, "\n".join(found)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    import re

    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_the_docs_relative_links_and_anchors_lead_somewhere():
    """A newcomer following README.md and docs/ meets no dead link: every relative link names a
    file of the repository, and every #anchor a heading of that file."""
    import re

    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted(ROOT.glob("deploy/**/*.md")) + sorted(ROOT.glob("src/phalanx/data/*.md"))
    link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
    dead = []
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for m in link.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # a URL
                path, _, anchor = target.partition("#")
                dest = (f.parent / path) if path else f
                if not dest.exists():
                    dead.append(f"{f.relative_to(ROOT)}:{n}: {target} (no such file)")
                elif anchor and dest.suffix == ".md":
                    heads = {_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
                    if anchor not in heads:
                        dead.append(f"{f.relative_to(ROOT)}:{n}: {target} (no such heading)")
    assert not dead, "\n".join(dead)
