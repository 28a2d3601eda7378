"""The Helm chart (deploy/helm/phalanx) as the tests see it: `helm template` output, as dicts.

`helm` is PHALANX_HELM, else `helm` on PATH. Without it the tests that render the chart skip and
say why, unless PHALANX_REQUIRE_HELM=1, where a missing helm is a failure.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "phalanx"
CRDS = CHART / "crds"


def helm_binary() -> str:
    """The helm to run: $PHALANX_HELM, else `helm` on PATH, else ""."""
    return os.environ.get("PHALANX_HELM") or shutil.which("helm") or ""


def require_helm() -> str:
    """helm's path, or a skip (a failure with PHALANX_REQUIRE_HELM=1) that says why not."""
    helm = helm_binary()
    found = shutil.which(helm) if helm else None  # a path, or a name looked up on PATH
    if found:
        return found
    why = f"PHALANX_HELM={helm} is not an executable" if helm else "no helm (set PHALANX_HELM, or PATH)"
    if os.environ.get("PHALANX_REQUIRE_HELM") == "1":
        pytest.fail(f"PHALANX_REQUIRE_HELM=1 but {why}")
    pytest.skip(why)


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    """helm with these arguments (not checked: the caller reads returncode and output)."""
    return subprocess.run([require_helm(), *args], capture_output=True, text=True, timeout=120)


@functools.cache
def _render(values_json: str, release: str, namespace: str) -> tuple[dict[str, Any], ...]:
    with tempfile.TemporaryDirectory(prefix="phalanx-helm-") as tmp:
        values = Path(tmp) / "values.yaml"
        values.write_text(yaml.safe_dump(json.loads(values_json)))
        res = run_helm(
            "template", release, str(CHART), "--namespace", namespace, "--include-crds", "-f", str(values)
        )
    if res.returncode != 0:
        raise RuntimeError(f"helm template failed ({res.returncode}): {res.stderr.strip()}")
    return tuple(d for d in yaml.safe_load_all(res.stdout) if d)


def render(
    values: dict[str, Any] | None = None, release: str = "phalanx", namespace: str = "phalanx-system"
) -> list[dict[str, Any]]:
    """The chart's objects (CRDs included) for these values, in helm's order; a fresh copy each call."""
    require_helm()
    return copy.deepcopy(list(_render(json.dumps(values or {}, sort_keys=True), release, namespace)))


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of this kind and name."""
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"{len(hits)} objects {kind}/{name}"
    return hits[0]


def component(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The objects of one component (label app.kubernetes.io/component)."""
    return [
        d for d in docs if ((d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == name)
    ]
