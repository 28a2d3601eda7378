"""`phalanx distcache`: Datasets with `spec.cache: distributed`, cached across a SeaweedFS cluster."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from phalanx.cli import options as opt
from phalanx.cli.errors import user_errors
from phalanx.cli.node import _client
from phalanx.core.errors import SpecError


def distcache(
    master: Annotated[str, typer.Option(help="SeaweedFS master, host:port (or host:port.grpcPort).")],
    filer: Annotated[str, typer.Option(help="SeaweedFS filer, host:port (or host:port.grpcPort).")],
    kubeconfig: opt.Kubeconfig = None,
    in_cluster: opt.InCluster = False,
    region: Annotated[str, typer.Option(help="S3 region of sources without options.region.")] = "us-east-1",
    concurrent: Annotated[int, typer.Option(min=1, max=256, help="Files fetched in parallel.")] = 8,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between looks.")] = 30.0,
    once: Annotated[bool, typer.Option("--once", help="Look once and exit.")] = False,
    weed: Annotated[
        str,
        typer.Option(
            help="The SeaweedFS `weed` binary (default: beside Python, else on PATH); the chart copies "
            "it from the SeaweedFS image, so that `weed shell` matches the cluster's version."
        ),
    ] = "",
) -> None:
    """Mount and cache distributed Datasets in SeaweedFS (one per cluster), report per volume server."""
    from phalanx.node.distcache import DistCache, Weed
    from phalanx.node.objectstore import Unavailable, find_weed

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "aiobotocore", "botocore", "s3fs", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with user_errors():
        for flag, addr in (("--master", master), ("--filer", filer)):
            if ":" not in addr:
                raise SpecError(flag, f"must be host:port; got {addr!r}")
        if weed and not os.access(weed, os.X_OK):
            raise SpecError("--weed", f"{weed} is not an executable file")
        try:
            cluster = Weed(master, filer, Path(weed) if weed else find_weed())
        except Unavailable as e:
            raise SpecError("weed", str(e)) from None
        ctl = DistCache(_client(kubeconfig, in_cluster), cluster, region, concurrent)
    signal.signal(signal.SIGTERM, lambda *_: ctl.stop.set())
    if once:
        ctl.look()
        return
    ctl.run(interval)
