"""`phalanx cache`: the node's dataset cache agent."""

from __future__ import annotations

import logging
import os
import signal
import socket
from pathlib import Path
from typing import Annotated

import typer

from phalanx.cli import options as opt
from phalanx.cli.errors import user_errors
from phalanx.cli.node import _client
from phalanx.core.errors import SpecError
from phalanx.spec.quantity import size_bytes


def cache(
    root: Annotated[
        Path, typer.Option(help="The cache folder on the node's NVMe (hostPath in the DaemonSet).")
    ],
    capacity: Annotated[str, typer.Option(help="Bytes the cache may hold, e.g. 3Ti.")],
    node_name: opt.NodeName = "",
    kubeconfig: opt.Kubeconfig = None,
    in_cluster: opt.InCluster = False,
    workers: Annotated[int, typer.Option(min=1, max=256, help="Files fetched in parallel.")] = 16,
    checksum: Annotated[
        bool, typer.Option("--checksum", help="Also hash every file whose ETag is an MD5 (costs CPU).")
    ] = False,
    max_bandwidth: Annotated[
        str, typer.Option(help="Cap on staging throughput per second, e.g. 500Mi (0: none).")
    ] = "0",
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between looks when idle.")] = 5.0,
    metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port (0: off).")] = 9402,
    once: Annotated[
        bool, typer.Option("--once", help="Look once (stage at most one dataset) and exit.")
    ] = False,
) -> None:
    """Stage Datasets onto this node's NVMe, evict least recently used ones, publish what is cached."""
    from phalanx.node.cacheagent import CacheAgent, Metrics, open_store

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "aiobotocore", "botocore", "s3fs", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with user_errors():
        cap = size_bytes(capacity, "--capacity")
        if cap <= 0:
            raise SpecError("--capacity", f"must be above 0, got {capacity!r}")
        rate = size_bytes(max_bandwidth, "--max-bandwidth")
        name = node_name or os.environ.get("NODE_NAME") or socket.gethostname()
        try:
            store = open_store(root, cap)
        except OSError as e:
            raise SpecError("--root", f"cannot use {root} as the cache folder: {e}") from None
        metrics = Metrics()
        if metrics_port:
            from prometheus_client import start_http_server

            start_http_server(metrics_port, registry=metrics.registry)
        agent = CacheAgent(_client(kubeconfig, in_cluster), name, store, workers, checksum, rate, metrics)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    if once:
        agent.look()
        return
    agent.run(interval)
