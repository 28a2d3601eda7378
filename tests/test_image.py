"""Phalanx's image, built both ways users build it, runs `phalanx` as the chart runs it.

`deploy/image/build.sh` (no registry base: mmdebstrap + buildah) and the `Dockerfile` (built here
by buildah, from the Debian base that build.sh --base-only writes, since no registry image can be
pulled; offline from a wheelhouse) must give the same layout: the venv at /opt/phalanx, user
65532, entrypoint `phalanx`. Needs root, mmdebstrap and buildah; skipped, with the reason,
without them (a failure with PHALANX_REQUIRE_NODES=1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodes_kube import ROOT, base_archive, git_files, image_archive, skip_or_fail

pytestmark = pytest.mark.nodes


def buildah(*args: str, timeout: float = 600) -> str:
    r = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"buildah {' '.join(args)}:\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module", autouse=True)
def tools() -> None:
    if os.geteuid() != 0:
        skip_or_fail("building images needs root (mmdebstrap's root mode, buildah)")
    for tool in ("mmdebstrap", "buildah"):
        if not shutil.which(tool):
            skip_or_fail(f"{tool} is missing (apt-get install {tool})")


def config(container: str) -> dict[str, object]:
    """The image config a working container was made from (what the kubelet runs)."""
    out = json.loads(buildah("inspect", "--type", "container", container))
    return dict(out["OCIv1"]["config"])


@pytest.fixture
def container() -> Iterator[list[str]]:
    """Working containers made by a test, removed after it."""
    made: list[str] = []
    yield made
    for c in made:
        subprocess.run(["buildah", "rm", c], capture_output=True)


def runs_phalanx(ref: str, made: list[str]) -> None:
    """As the chart runs it: user 65532, the entrypoint's phalanx, every subcommand's imports."""
    c = buildah("from", "--quiet", ref).strip()
    made.append(c)
    cfg = config(c)
    assert cfg["Entrypoint"] == ["/opt/phalanx/bin/phalanx"]
    assert cfg["User"] == "65532:65532"
    out = buildah("run", "--user", "65532:65532", c, "--", "/opt/phalanx/bin/phalanx", "--help")
    assert "Phalanx: a scheduler for AI workloads on Kubernetes" in out
    for sub in (["scheduler"], ["webhook"], ["cache"], ["node", "discover"], ["node", "device-plugin"]):
        out = buildah("run", "--user", "65532:65532", c, "--", "/opt/phalanx/bin/phalanx", *sub, "--help")
        assert "Usage" in out, sub
    # the node extra: NVML's binding, gRPC for kubelet's device-plugin API, s3fs for the cache
    buildah("run", c, "--", "/opt/phalanx/bin/python", "-c", "import pynvml, grpc, s3fs, phalanx.node.dpapi")


def test_build_script_image_runs_phalanx(container: list[str]) -> None:
    archive = image_archive()
    runs_phalanx(f"oci-archive:{archive}", container)
    c = container[0]
    info = buildah("run", c, "--", "cat", "/opt/phalanx/BUILDINFO")
    assert "phalanx==0.1.0" in info and "python3.11" in info


def test_dockerfile_builds_the_same_layout(tmp_path: Path, container: list[str]) -> None:
    base = base_archive()
    ctx = tmp_path / "ctx"
    files = git_files("--cached", "--others", "--exclude-standard", "src")
    for f in [*files, "pyproject.toml", "README.md", "Dockerfile", ".dockerignore"]:
        if (ROOT / f).is_file():
            (ctx / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, ctx / f)
    # the wheelhouse: built by the host's pip (Python 3.11, like the base's), so the build is offline
    # (and the build backend, since the Dockerfile builds Phalanx from its source)
    for what in ([f"{ctx}[node]"], ["setuptools>=77", "wheel"]):
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(ctx / "wheels"), *what],
            check=True,
            capture_output=True,
        )
    tag = f"localhost/phalanx-dockerfile:{os.getpid()}"
    buildah(
        "build",
        "--quiet",
        "--layers=false",
        "--build-arg",
        f"BASE=oci-archive:{base}",
        "--build-arg",
        "PIP_OPTS=--no-index --find-links /src",
        "-t",
        tag,
        str(ctx),
    )
    try:
        runs_phalanx(tag, container)
    finally:
        for c in container:
            subprocess.run(["buildah", "rm", c], capture_output=True)
        container.clear()
        subprocess.run(["buildah", "rmi", "--force", tag], capture_output=True)
