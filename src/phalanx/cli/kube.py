"""`phalanx scheduler` (run in Kubernetes) and `phalanx status` (the operator's view)."""

from __future__ import annotations

import logging
import signal
import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from phalanx.cli import options as opt
from phalanx.cli.errors import user_errors
from phalanx.cli.serving import serving_tls
from phalanx.cli.tables import name_column, print_table
from phalanx.core.errors import SpecError
from phalanx.k8s.act.shares import parse_reservation_extras
from phalanx.k8s.client.api import Api
from phalanx.k8s.config import DEFAULT_LEVELS, AdapterConfig, ReservationPodExtras, parse_levels
from phalanx.k8s.loop.leader import LeaseNamespaceMissing
from phalanx.k8s.loop.scheduler import Scheduler
from phalanx.k8s.view.authn import Guard
from phalanx.k8s.view.server import serve
from phalanx.k8s.view.status import collect, shard_row, shard_worlds, summarize
from phalanx.profiles import load_profile
from phalanx.spec.common import load_yaml
from phalanx.spec.shards import ShardOf, load_shards


def _connect(kubeconfig: Path | None, in_cluster: bool) -> Api:
    if kubeconfig is not None and in_cluster:
        raise SpecError("--kubeconfig/--in-cluster", "give one of them, not both")
    if kubeconfig is not None and not kubeconfig.is_file():
        raise SpecError("--kubeconfig", f"cannot read file {kubeconfig}")
    try:
        return Api.connect(kubeconfig=str(kubeconfig) if kubeconfig else None, in_cluster=in_cluster)
    except Exception as e:  # no config found, unreadable token, ...
        raise SpecError("kubeconfig", f"cannot load the cluster configuration: {e}") from None


def scheduler(
    kubeconfig: opt.Kubeconfig = None,
    in_cluster: opt.InCluster = False,
    scheduler_name: opt.SchedulerName = "phalanx",
    profile: opt.SchedulerProfile = "",
    topology_levels: opt.TopologyLevels = None,
    lease_namespace: opt.LeaseNamespace = "phalanx-system",
    leader_elect: opt.LeaderElect = True,
    lease_duration: opt.LeaseDuration = 15,
    cycle_seconds: opt.CycleSeconds = 1.0,
    port: opt.MetricsPort = 8080,
    identity: opt.Identity = None,
    bind_workers: opt.BindWorkers = 48,
    gpu_shares: opt.GpuShares = "off",
    reservation_namespace: opt.ReservationNamespace = "phalanx-system",
    reservation_image: opt.ReservationImage = "phalanx:0.1.0",
    reservation_pod: opt.ReservationPod = None,
    kueue: opt.Kueue = "auto",
    share_limit_env: opt.ShareLimitEnv = False,
    mps_pipe_directory: opt.MpsPipeDirectory = AdapterConfig.mps_pipe_directory,
    insecure_metrics: opt.InsecureMetrics = False,
    tls_cert_file: opt.TlsCertFile = None,
    tls_private_key_file: opt.TlsPrivateKeyFile = None,
    bind_address: opt.BindAddress = "0.0.0.0",
    shadow: opt.Shadow = False,
    shadow_scheduler_name: opt.ShadowSchedulerName = "default-scheduler",
    shards: opt.ShardsFile = None,
    shard: opt.ShardName = "",
) -> None:
    """Run as a secondary Kubernetes scheduler: watch, decide with the core, bind, explain.

    /healthz and /readyz are open; /metrics and /dashboard/ need a bearer token the API server
    authenticates (TokenReview) and authorizes for that URL (SubjectAccessReview), over HTTPS."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per request otherwise
    tls_files = (tls_cert_file, tls_private_key_file)
    with user_errors():
        _check_scheduler_options(cycle_seconds, lease_duration, bind_workers, kueue, gpu_shares)
        _check_tls_options(tls_files, insecure_metrics)
        extras = ReservationPodExtras()
        if reservation_pod is not None:
            where = f"--reservation-pod {reservation_pod}"
            extras = parse_reservation_extras(load_yaml(reservation_pod), where)
        mine = _shard(shards, shard)
        profile = profile or (mine.me.profile if mine is not None else "") or "phalanx-queues"
        cfg = AdapterConfig(
            scheduler_name=scheduler_name,
            profile=profile,
            levels=parse_levels(topology_levels) if topology_levels else DEFAULT_LEVELS,
            lease_namespace=lease_namespace,
            leader_elect=leader_elect,
            lease_seconds=lease_duration,
            cycle_seconds=cycle_seconds,
            bind_workers=bind_workers,
            gpu_shares=gpu_shares,
            reservation_namespace=reservation_namespace,
            reservation_image=reservation_image,
            reservation_extras=extras,
            share_limit_env=share_limit_env,
            mps_pipe_directory=mps_pipe_directory,
            kueue=kueue,
            shard=mine,
        )
        prof = load_profile(profile)
        _check_backends(mps_pipe_directory)
        api = _connect(kubeconfig, in_cluster)
    if shadow:
        from dataclasses import replace

        from phalanx.cli.shadow import run_shadow

        watched = replace(cfg, scheduler_name=shadow_scheduler_name, leader_elect=False)
        run_shadow(api, watched, prof, port, insecure_metrics, tls_files, bind_address)
        return
    s = Scheduler(api, cfg, prof, identity=identity or socket.gethostname())
    with user_errors():
        _serve_endpoints(s, api, port, insecure_metrics, tls_files, bind_address)
    _run_until_stopped(s)


def _shard(path: Path | None, name: str) -> ShardOf | None:
    """This process's scheduling shard (`--shards FILE --shard NAME`), or None for one scheduler."""
    if path is None and not name:
        return None
    if path is None or not name:
        raise SpecError("--shards/--shard", "give both: the shards file and which shard this process is")
    every = load_shards(path)
    return ShardOf(every, every.get(name))


def _check_kueue(kueue: str) -> None:
    """scheduler, status and dashboard take the same Kueue modes, and say so alike."""
    if kueue not in ("auto", "coexist", "migrate", "off"):
        raise SpecError("--kueue", f"must be auto, coexist, migrate or off, got {kueue!r}")


def _check_scheduler_options(
    cycle_seconds: float, lease_duration: int, bind_workers: int, kueue: str, gpu_shares: str
) -> None:
    """Refuse values the loop would only trip over once it runs, each named by its flag."""
    if cycle_seconds <= 0:
        raise SpecError("--cycle-seconds", f"must be > 0, got {cycle_seconds}")
    if lease_duration < 1:
        raise SpecError("--lease-duration", f"must be >= 1 second, got {lease_duration}")
    if bind_workers < 1:
        raise SpecError("--bind-workers", f"must be >= 1, got {bind_workers}")
    _check_kueue(kueue)
    if gpu_shares not in ("off", "reservation"):
        raise SpecError("--gpu-shares", f"must be 'off' or 'reservation', got {gpu_shares!r}")


def _check_backends(mps_pipe_directory: str) -> None:
    """The MPS pipe directory is a path inside the share's containers: absolute. (Every backend works
    with `--gpu-shares reservation`: a share a MIG instance serves gets a reservation pod for it.)"""
    if not mps_pipe_directory.startswith("/"):
        raise SpecError("--mps-pipe-directory", f"must be an absolute path, got {mps_pipe_directory!r}")


def _check_tls_options(tls_files: tuple[Path | None, Path | None], insecure_metrics: bool) -> None:
    """A certificate comes with its key, never with --insecure-metrics, and both can be read."""
    tls_cert_file, tls_private_key_file = tls_files
    if (tls_cert_file is None) != (tls_private_key_file is None):
        raise SpecError("--tls-cert-file", "give --tls-cert-file and --tls-private-key-file together")
    if insecure_metrics and tls_cert_file is not None:
        raise SpecError("--insecure-metrics", "serves plain HTTP: drop --tls-cert-file, or this flag")
    for f in tls_files:
        if f is not None and not f.is_file():
            raise SpecError("--tls-cert-file", f"cannot read file {f}")


def _serve_endpoints(
    s: Scheduler,
    api: Api,
    port: int,
    insecure_metrics: bool,
    tls_files: tuple[Path | None, Path | None],
    bind_address: str,
) -> None:
    """/metrics, /healthz, /readyz and the dashboard on a daemon thread: HTTPS to callers the API
    server authenticates and authorizes, or plain HTTP to anyone with --insecure-metrics."""
    log = logging.getLogger("phalanx.k8s")
    if insecure_metrics:
        server = serve(port, s.metrics, s.ready, s.board, address=bind_address)
        log.warning(
            "--insecure-metrics: /metrics and the dashboard are served over plain HTTP to anyone "
            "who reaches %s:%d",
            bind_address,
            server.server_port,
        )
        return
    tls_cert_file, tls_private_key_file = tls_files
    tls = serving_tls(tls_cert_file, tls_private_key_file)
    server = serve(port, s.metrics, s.ready, s.board, guard=Guard(api), tls=tls, address=bind_address)
    log.info(
        "serving https://%s:%d: /healthz and /readyz open; /metrics and /dashboard/ to callers "
        "the API server authenticates and authorizes (%s certificate)",
        bind_address,
        server.server_port,
        "given" if tls_cert_file else "self-made",
    )


def _run_until_stopped(s: Scheduler) -> None:
    """The loop until SIGTERM or Ctrl-C; a Lease namespace that is missing is the user's to fix."""
    signal.signal(signal.SIGTERM, lambda *_: s.stop())
    s.start()
    try:
        with user_errors():
            try:
                s.run()
            except LeaseNamespaceMissing as e:
                raise SpecError("--lease-namespace", str(e)) from None
    except KeyboardInterrupt:
        pass
    finally:
        s.close()


def status(
    kubeconfig: opt.Kubeconfig = None,
    in_cluster: opt.InCluster = False,
    scheduler_name: opt.SchedulerName = "phalanx",
    profile: Annotated[
        str, typer.Option(help="Profile the scheduler runs (for the reasons).")
    ] = "phalanx-queues",
    topology_levels: opt.TopologyLevels = None,
    kueue: Annotated[
        str, typer.Option(help="Kueue mode the scheduler runs with (see `scheduler --help`).")
    ] = "auto",
    shadow: Annotated[
        str | None,
        typer.Option(
            help="URL of a `phalanx scheduler --shadow` (e.g. https://localhost:8080 through "
            "kubectl port-forward): print what it found instead (agreements by reason, gangs placed "
            "partially, pods it would place now)."
        ),
    ] = None,
    token: Annotated[
        str, typer.Option(envvar="PHALANX_TOKEN", help="With --shadow: bearer token it accepts.")
    ] = "",
    insecure_skip_tls_verify: Annotated[
        bool,
        typer.Option("--insecure-skip-tls-verify", help="With --shadow: accept a self-made certificate."),
    ] = False,
    shards: opt.StatusShards = None,
) -> None:
    """Queues, which GPU holds which pods, fractions or slices, gangs with their phase and members
    (running, ended, waiting), and pending workloads with the reason the scheduler gives (naming
    what holds back a preemption, and until when) and their start forecast: when each is expected
    to start, and what would let it start now. Read-only: a dry cycle, nothing is written."""
    if shadow is not None:
        from phalanx.cli.shadow import status_shadow

        status_shadow(shadow, token, not insecure_skip_tls_verify)
        return
    with user_errors():
        _check_kueue(kueue)
        cfg = AdapterConfig(
            scheduler_name=scheduler_name,
            profile=profile,
            levels=parse_levels(topology_levels) if topology_levels else DEFAULT_LEVELS,
            kueue=kueue,
        )
        load_profile(profile)
        every = load_shards(shards) if shards is not None else None
        api = _connect(kubeconfig, in_cluster)
        try:
            if every is None:
                views = [("", collect(api, cfg))]
            else:
                pairs = shard_worlds(api, cfg, every)
                views = [(sh.name, summarize(w, cfg)) for sh, w in pairs]
                rows = [shard_row(sh, w, st) for (sh, w), (_, st) in zip(pairs, views, strict=True)]
        except Exception as e:
            raise SpecError("API server", f"cannot read the cluster: {e}") from None
    console = Console()
    if every is not None:
        _table(console, "Shards", rows)
    for name, st in views:
        of = f" (shard {name})" if name else ""
        _table(console, f"Queues (GPUs){of}", st.queues)
        _table(console, f"GPUs{of}", st.gpus)
        _table(console, f"Gangs{of}", st.gangs)
        _table(console, f"Pending workloads{of}", st.pending)
        for p in st.problems:
            console.print(f"[yellow]problem{of}:[/] {p}", highlight=False)


def _table(console: Console, title: str, rows: list[dict[str, object]]) -> None:
    if not rows:
        console.print(f"{title}: none")
        return
    t = Table(title=title)
    for k in rows[0]:
        if k in NAME_KEYS:
            name_column(t, k)
        else:
            t.add_column(k)
    for r in rows:
        t.add_row(*[f"{v:g}" if isinstance(v, float) else str(v) for v in r.values()])
    print_table(t, console)


# the columns of `phalanx status` that hold names (never broken over lines; the others wrap)
NAME_KEYS = frozenset({"shard", "queue", "parent", "node", "workload"})


def demo() -> None:
    """kube-scheduler and Phalanx side by side on one real API server (needs PHALANX_K8S_ASSETS)."""
    from phalanx.k8s.lab import demo as d
    from phalanx.k8s.lab.localcluster import Unavailable

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    with user_errors():
        console.print(
            "Starting a real Kubernetes control plane; each scheduler gets "
            f"{d.NODES} nodes x {d.GPUS_PER_NODE} GPUs,\n"
            f"two training gangs of {d.GANG_SIZE} pods x {d.GANG_GPUS} GPUs "
            f"({2 * d.GANG_SIZE * d.GANG_GPUS} GPUs asked, {d.NODES * d.GPUS_PER_NODE} there; "
            "pods created interleaved)\n"
            f"and {d.INFER} inference pods at {d.SHARE:g} GPU each (KAI's gpu-fraction annotation).",
            highlight=False,
        )
        try:
            reports = d.run()
        except Unavailable as e:
            raise SpecError("PHALANX_K8S_ASSETS", str(e)) from None
    for r in reports:
        t = Table(title=r.scheduler, title_justify="left")
        name_column(t, "workload")
        for col in ("pods bound", "GPUs held", "state"):
            t.add_column(col)
        for row in r.rows:
            t.add_row(row.name, f"{row.bound}/{row.pods}", f"{row.gpus_held:g}", row.state)
        print_table(t, console)
    for r in reports:
        console.print(
            f"{r.scheduler}: {r.stuck_gpus:g} GPUs held by gangs that cannot start, "
            f"{r.overpromised:g} GPUs promised twice, {r.idle_gpus:g} GPUs idle.",
            highlight=False,
        )


def dashboard(
    kubeconfig: opt.Kubeconfig = None,
    in_cluster: opt.InCluster = False,
    scheduler_name: opt.SchedulerName = "phalanx",
    profile: Annotated[
        str, typer.Option(help="Profile the scheduler runs (for reasons and forecasts).")
    ] = "phalanx-queues",
    port: Annotated[int, typer.Option(help="Port to serve the dashboard on (0: any free port).")] = 8090,
    address: Annotated[
        str,
        typer.Option(
            help="Address to listen on. The dashboard shows the cluster as your kubeconfig sees it, "
            "to anyone who reaches it: 0.0.0.0 shares it with your network."
        ),
    ] = "127.0.0.1",
    interval: Annotated[float, typer.Option(help="Seconds between reads of the cluster.")] = 5.0,
    kueue: Annotated[str, typer.Option(help="Kueue mode the scheduler runs with.")] = "auto",
    shards: Annotated[
        Path | None,
        typer.Option(
            help="The shards file the schedulers run with: one board of every shard, each deciding "
            "its share with its own profile (--profile for a shard that names none)."
        ),
    ] = None,
) -> None:
    """Serve the dashboard read-only, e.g. from a laptop: http://localhost:PORT/dashboard/."""
    import threading

    from phalanx.k8s.view.board import Board
    from phalanx.k8s.view.status import follow

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    with user_errors():
        if interval <= 0:
            raise SpecError("--interval", f"must be > 0, got {interval}")
        _check_kueue(kueue)
        load_profile(profile)
        every = load_shards(shards) if shards is not None else None
        for s in every.shards if every is not None else ():
            load_profile(s.profile or profile)
        cfg = AdapterConfig(scheduler_name=scheduler_name, profile=profile, kueue=kueue)
        api = _connect(kubeconfig, in_cluster)
    board = Board(mode="read-only")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = serve(port, None, lambda: True, board, address=address)
    shown = "localhost" if address in ("127.0.0.1", "localhost") else address
    typer.echo(
        f"dashboard: listening on {address}:{server.server_port}, "
        f"http://{shown}:{server.server_port}/dashboard/ (read-only; Ctrl-C to stop)"
    )
    if address not in ("127.0.0.1", "localhost", "::1"):
        typer.echo(f"dashboard: anyone who reaches {address} sees the cluster as your kubeconfig does")
    try:
        follow(api, cfg, board, interval, stop, shards=every)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
