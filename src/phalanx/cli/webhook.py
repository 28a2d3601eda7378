"""`phalanx webhook`: the admission webhook that lets GPU shares reach their containers."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from phalanx.cli import options as opt
from phalanx.cli.errors import user_errors
from phalanx.cli.kube import _connect
from phalanx.core.errors import SpecError
from phalanx.k8s.config import AdapterConfig


def webhook(
    kubeconfig: opt.Kubeconfig = None,
    in_cluster: opt.InCluster = False,
    scheduler_name: opt.SchedulerName = "phalanx",
    namespace: Annotated[
        str, typer.Option(help="Namespace of the webhook's Service and Secret.")
    ] = "phalanx-system",
    service: Annotated[str, typer.Option(help="Name of the webhook's Service.")] = "phalanx-webhook",
    port: Annotated[int, typer.Option(help="HTTPS port (0: any free port).")] = 8443,
    cert_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder with tls.crt, tls.key (and ca.crt), e.g. from cert-manager; default: make them."
        ),
    ] = None,
    san: Annotated[
        list[str] | None, typer.Option(help="Extra DNS name or IP for a made certificate (repeatable).")
    ] = None,
    check_seconds: Annotated[float, typer.Option(help="Seconds between certificate checks.")] = 3600.0,
    dataset_root: Annotated[
        str, typer.Option(help="The dataset cache folder on the nodes (phalanx cache --root).")
    ] = AdapterConfig.dataset_root,
    dataset_mount: Annotated[
        str, typer.Option(help="Where a pod sees its dataset: <this>/<dataset name>.")
    ] = AdapterConfig.dataset_mount,
    distcache_root: Annotated[
        str,
        typer.Option(
            help="Where the distributed cache's FUSE mount lives on the nodes (the chart's "
            "distcache.mount.hostPath); set: pods on a distributed Dataset mount it from there.",
        ),
    ] = "",
    mps_pipe_directory: opt.MpsPipeDirectory = AdapterConfig.mps_pipe_directory,
    mps_shares: Annotated[
        bool,
        typer.Option(
            "--mps-shares",
            help="The scheduler's profile may serve any share by MPS: mount the MPS pipe directory "
            "into every share container (without it, only into pods that ask phalanx.io/gpu-backend: mps).",
        ),
    ] = False,
) -> None:
    """Serve the admission webhook: GPU shares, and dataset mounts (Helm chart: webhook.enabled)."""
    from phalanx.k8s.admission.mutation import Distributed
    from phalanx.k8s.admission.webhook import DATASETS, CertSource, Webhook

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    with user_errors():
        if cert_dir is not None and not (cert_dir / "tls.crt").is_file():
            raise SpecError("--cert-dir", f"{cert_dir} has no tls.crt")
        if check_seconds <= 0:
            raise SpecError("--check-seconds", f"must be > 0, got {check_seconds}")
        api = _connect(kubeconfig, in_cluster)
        source = CertSource(api, namespace, service, cert_dir, tuple(san or ()))
        flags: tuple[tuple[str, str], ...] = (
            ("--dataset-root", dataset_root),
            ("--dataset-mount", dataset_mount),
            ("--mps-pipe-directory", mps_pipe_directory),
        )
        if distcache_root:
            flags += (("--distcache-root", distcache_root),)
        for flag, value in flags:
            if not value.startswith("/"):
                raise SpecError(flag, f"must be an absolute path, got {value!r}")
        cfg = AdapterConfig(
            scheduler_name=scheduler_name,
            dataset_root=dataset_root,
            dataset_mount=dataset_mount,
            mps_pipe_directory=mps_pipe_directory,
            mps_shares=mps_shares,
        )
        dist = None
        if distcache_root:
            dist = Distributed(distcache_root, lambda ns, name: api.get(DATASETS, name, ns))
        hook = Webhook(source, cfg, port=port, dist=dist)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        hook.serve(stop, check_seconds)
