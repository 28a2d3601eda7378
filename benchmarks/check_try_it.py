"""docs/try-it.md walked as a newcomer would, on real kubelets (the test machine's node kit).

Runs the guide's own shell blocks, as they are written, against a kit cluster with work in it
(kube-scheduler's pods: one running, a 2-pod gang whose PodGroup asks 3, one that cannot fit),
with only what a reader's machine differs by substituted: the kubeconfig's path, the image
(imported on the kit's node, no registry) and a wait where the guide backgrounds a command and
a person would wait a moment before the next. Every command must exit 0 and print no
traceback. A check, not a CI test (it needs root, the kit and the image built from this tree).

    flock /tmp/kit.lock env PHALANX_K8S_ASSETS=... PHALANX_NODEKIT=... PHALANX_HELM=... \\
        python benchmarks/check_try_it.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from check_shadow_nodes import _pod, default_scheduler_work
from e2e_kube import wait_for
from nodes_kube import IMAGE_NAME, KitCluster, helm_bin, kit_cluster

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "try-it.md"


def blocks() -> list[str]:
    """The guide's bash blocks, in order, continuation lines joined."""
    found = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return [b.replace("\\\n", " ") for b in found]


def adapt(block: str, kubeconfig: Path, ca: Path) -> str:
    """What differs on this machine from a reader's; nothing else is changed."""
    block = block.replace("~/.kube/config", str(kubeconfig))
    block = block.replace(
        "--set image.repository=REGISTRY/phalanx",
        f"--set image.repository={IMAGE_NAME} --set image.tag=0.1.0 --set image.pullPolicy=Never",
    )
    out = []
    for line in block.splitlines():
        if line.startswith("phalanx scheduler") and not line.rstrip().endswith("&"):
            # runs until stopped: half a minute of it, which must not end by itself
            line = f"timeout 30 {line} || [ $? -eq 124 ]"
        out.append(line)
        if line.startswith(
            "kubectl create namespace "
        ):  # the node kit's limitation 11: token mounts wait for it
            ns = line.split()[3]
            out.append(
                f"kubectl -n {ns} create configmap openshift-service-ca.crt --from-file=service-ca.crt={ca}"
            )
        m = re.search(r"(?:port-forward \S+ |--port )(\d+)\b.*&\s*$", line)
        if m:  # a person waits a moment before the next line; the script waits for the port
            probe = f"(exec 3<>/dev/tcp/127.0.0.1/{m.group(1)}) 2>/dev/null"
            out.append(f"for i in $(seq 60); do {probe} && break; sleep 1; done")
    return "\n".join(out)


def run_block(k: KitCluster, n: int, script: str, workdir: Path) -> None:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(
        [str(k.cp.bins), str(Path(helm_bin()).parent), str(Path(sys.executable).parent), env["PATH"]]
    )
    env["KUBECONFIG"] = str(k.cp.kubeconfig)
    # a reader runs the guide from a clone's root (the chart's path is relative): the clone's
    # deploy/ is linked into a scratch directory, so that what the commands write stays there
    if not (workdir / "deploy").exists():
        (workdir / "deploy").symlink_to(ROOT / "deploy")
    full = f"set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}\n"
    (workdir / f"block-{n}.sh").write_text(full)
    t0 = time.monotonic()
    r = subprocess.run(
        ["bash", "-x", str(workdir / f"block-{n}.sh")],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    took = time.monotonic() - t0
    print(f"--- block {n}: rc {r.returncode}, {took:.0f} s")
    print(r.stdout[-4000:])
    trace = "Traceback (most recent call last)" in r.stdout + r.stderr
    if r.returncode != 0 or trace:
        print(r.stderr[-6000:])
        raise SystemExit(f"block {n} failed (rc {r.returncode}, traceback printed: {trace})")


def work(k: KitCluster) -> None:
    """Something for the guide to look at: kube-scheduler's pods, running and waiting, and one
    that fits nowhere (8 GPUs on a 4-GPU node)."""
    placed = default_scheduler_work(k)
    big = _pod("too-big")
    big["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    k.kube.create(big)
    wait_for("kube-scheduler placed the pods", lambda: all(k.kube.node_of(n) for n in placed), timeout=90)


def main() -> None:
    t0 = time.monotonic()
    with kit_cluster(nodes=1) as k, tempfile.TemporaryDirectory(prefix="try-it-") as tmp:
        k.gpus(4)
        work(k)
        for n, block in enumerate(blocks(), 1):
            run_block(k, n, adapt(block, k.cp.kubeconfig, k.cp.ca_crt), Path(tmp))
    print(f"the guide walked in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
