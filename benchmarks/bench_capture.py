"""What `phalanx capture` costs on a real kube-apiserver: time to list, file size, redaction, replay.

A fresh control plane (etcd, kube-apiserver), N nodes of 8 GPUs, P one-GPU pods of
default-scheduler (3 of 4 bound to a node, as a busy cluster has them), then: the capture
(`capture.take`: discovery and one paged list per kind, and the snapshot built once for its
`problems`), the gzipped file's size, `--redact`, loading the file back, and the replay of one
cycle (`phalanx schedule --capture`'s `compare`).

    PHALANX_K8S_ASSETS=... python benchmarks/bench_capture.py [--nodes 1000 --pods 4000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from phalanx.k8s.client.api import Api
from phalanx.k8s.client.kinds import PODS
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.lab.localcluster import ControlPlane
from phalanx.k8s.trial import capture as cap
from phalanx.k8s.trial.redact import redact
from phalanx.k8s.trial.replay import compare
from phalanx.profiles import load_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kube_objects import node, pod


def populate(api: Api, nodes: int, pods: int) -> None:
    with ThreadPoolExecutor(32) as ex:
        list(
            ex.map(
                lambda k: api.create("nodes", node(f"n{k:05d}", gpus=8, cpu="128", mem="1Ti")), range(nodes)
            )
        )

        def make(k: int) -> None:
            where = f"n{k % nodes:05d}" if k % 4 else ""
            p = pod(f"p{k:05d}", gpus=1, cpu="1", mem="1Gi", scheduler="default-scheduler", node=where)
            p["metadata"].pop("uid")
            api.create(PODS, p, "default")

        list(ex.map(make, range(pods)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=4000)
    a = ap.parse_args()
    cfg = AdapterConfig(scheduler_name="default-scheduler")
    with ControlPlane(controller_manager=False) as cp, tempfile.TemporaryDirectory() as tmp:
        api = Api.connect(kubeconfig=str(cp.kubeconfig))
        populate(api, a.nodes, a.pods)
        t0 = time.perf_counter()
        c = cap.take(api, cfg)
        t1 = time.perf_counter()
        path = Path(tmp) / "c.json.gz"
        cap.write(c, path)
        t2 = time.perf_counter()
        r = redact(c)
        t3 = time.perf_counter()
        back = cap.load(path)
        t4 = time.perf_counter()
        result = compare(back, cfg, load_profile("phalanx-queues"))
        t5 = time.perf_counter()
        print(f"{a.nodes} nodes, {a.pods} pods ({sum(len(v) for v in c.objects.values())} objects, "
              f"{len(c.objects)} kinds served)")  # fmt: skip
        print(f"capture (list + snapshot for problems): {t1 - t0:.2f} s")
        print(f"write gzipped: {t2 - t1:.2f} s, {path.stat().st_size / 2**20:.2f} MiB")
        print(f"redact: {t3 - t2:.2f} s ({len(r.objects['pods'])} pods)")
        print(f"load: {t4 - t3:.2f} s")
        print(f"replay one cycle: {t5 - t4:.2f} s ({len(result.result.binds)} binds, {result.placed} placed)")
        api.close()


if __name__ == "__main__":
    main()
