"""`phalanx node discover` and `phalanx node reserve` (what runs on each node)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from phalanx.cli import options as opt
from phalanx.cli.errors import user_errors
from phalanx.core.errors import SpecError

node_app = typer.Typer(
    no_args_is_help=True, help="What runs on each node: device discovery, GPU reservations."
)


def _client(kubeconfig: Path | None, in_cluster: bool):  # type: ignore[no-untyped-def]
    from lightkube import Client
    from lightkube.config.kubeconfig import KubeConfig

    try:
        if in_cluster:
            return Client(KubeConfig.from_service_account())
        return Client(KubeConfig.from_file(str(kubeconfig)) if kubeconfig else KubeConfig.from_env())
    except Exception as e:
        raise SpecError("kubeconfig", f"cannot load the cluster configuration: {e}") from None


@node_app.command("discover")
def discover(
    node_name: opt.NodeName = "",
    kubeconfig: opt.Kubeconfig = None,
    in_cluster: opt.InCluster = False,
    sys_root: opt.SysRoot = Path("/sys"),
    nvml_module: Annotated[
        str, typer.Option(help="NVML binding to import (pynvml from nvidia-ml-py).")
    ] = "pynvml",
    interval: Annotated[float, typer.Option(help="Seconds between looks.")] = 300.0,
    once: Annotated[bool, typer.Option("--once", help="Look once and exit.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--print", help="Print the annotation; touch no API server.")
    ] = False,
    kubelet_config: Annotated[
        Path | None,
        typer.Option(
            help="The kubelet's configuration file: its topologyManagerPolicy and reservedSystemCPUs "
            "are published with the CPUs of each NUMA node."
        ),
    ] = None,
    mig_recut: Annotated[
        bool,
        typer.Option(
            "--mig-recut/--no-mig-recut",
            help="Carry out the MIG repartitions the scheduler writes on this Node (phalanx.io/mig-layout) "
            "through NVML, on GPUs nothing uses.",
        ),
    ] = False,
    mig_interval: Annotated[
        float, typer.Option(help="Seconds between looks for MIG repartitions (with --mig-recut).")
    ] = 5.0,
    pod_resources_socket: Annotated[
        Path,
        typer.Option(
            help="Kubelet's PodResources socket: a MIG device it handed out is in use (--mig-recut)."
        ),
    ] = Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
) -> None:
    """Publish this node's GPUs, RDMA NICs, PCIe switches, NUMA nodes and NVLink groups."""
    from phalanx.node import agent

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    with user_errors():
        if not sys_root.is_dir():
            raise SpecError("--sys-root", f"{sys_root} is not a folder")
        if dry_run:
            topo, _ = agent.find(sys_root, nvml_module, agent.read_kubelet_config(kubelet_config))
            typer.echo(json.dumps(topo, indent=2, sort_keys=True))
            return
        name = node_name or os.environ.get("NODE_NAME") or socket.gethostname()
        agent.read_kubelet_config(kubelet_config)  # a bad file: one line, before anything starts
        if mig_interval <= 0:
            raise SpecError("--mig-interval", f"must be > 0 s, got {mig_interval:g}")
        agent.run(
            _client(kubeconfig, in_cluster),
            name,
            sys_root,
            nvml_module,
            interval,
            once,
            kubelet_config,
            mig_recut,
            mig_interval,
            pod_resources_socket,
        )


@node_app.command("reserve")
def reserve(
    pod: Annotated[
        str, typer.Option(help="namespace/name of this pod (default: $POD_NAMESPACE/$POD_NAME).")
    ] = "",
    kubeconfig: opt.Kubeconfig = None,
    in_cluster: opt.InCluster = False,
    nvml_module: opt.NvmlModule = "pynvml",
    once: Annotated[bool, typer.Option("--once", help="Report the GPU and exit (tests).")] = False,
    mig: Annotated[
        bool,
        typer.Option(
            "--mig", help="The pod holds one MIG device (nvidia.com/mig-<profile>): report its UUID."
        ),
    ] = False,
) -> None:
    """Inside a GPU-reservation pod: report which GPU (or MIG device) it holds, then hold it."""
    from phalanx.node import nvml
    from phalanx.node import reserve as r

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with user_errors():
        target = pod or f"{os.environ.get('POD_NAMESPACE', '')}/{os.environ.get('POD_NAME', '')}"
        ns, _, name = target.partition("/")
        if not ns or not name:
            raise SpecError("--pod", "give namespace/name, or set POD_NAMESPACE and POD_NAME")
        try:
            r.run(_client(kubeconfig, in_cluster), ns, name, nvml_module, once, mig)
        except nvml.NvmlUnavailable as e:
            raise SpecError("NVML", str(e)) from None


@node_app.command("device-plugin")
def device_plugin(
    node_name: opt.NodeName = "",
    kubeconfig: opt.Kubeconfig = None,
    in_cluster: opt.InCluster = False,
    socket_dir: Annotated[Path, typer.Option(help="Kubelet's device-plugin folder.")] = Path(
        "/var/lib/kubelet/device-plugins"
    ),
    sys_root: opt.SysRoot = Path("/sys"),
    nvml_module: opt.NvmlModule = "pynvml",
    mig_strategy: Annotated[
        str,
        typer.Option(
            help="none: MIG GPUs are not offered (NVIDIA's plugin may offer them); mixed: each MIG profile "
            "as nvidia.com/mig-<profile>, following recuts (NVIDIA's mixed strategy)."
        ),
    ] = "none",
    pod_resources_socket: Annotated[
        Path, typer.Option(help="Kubelet's PodResources socket (with --mig-strategy mixed).")
    ] = Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
) -> None:
    """Serve nvidia.com/gpu (and MIG devices) to kubelet, allocating what Phalanx chose for each pod."""
    from phalanx.node import migplugin, nvml
    from phalanx.node.deviceplugin import ApiPods, Plugin, node_gpus

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with user_errors():
        if not socket_dir.is_dir():
            raise SpecError("--socket-dir", f"{socket_dir} is not a folder (is this a kubelet's node?)")
        if mig_strategy not in ("none", "mixed"):
            raise SpecError("--mig-strategy", f"expected none or mixed, got {mig_strategy!r}")
        try:
            gpus = node_gpus(sys_root, nvml_module)
        except nvml.NvmlUnavailable as e:
            raise SpecError("NVML", str(e)) from None
        name = node_name or os.environ.get("NODE_NAME") or socket.gethostname()
        pods = ApiPods(_client(kubeconfig, in_cluster), name)
        plugin = Plugin(gpus, pods, socket_dir)
    signal.signal(signal.SIGTERM, lambda *_: plugin.stop.set())
    if mig_strategy == "mixed":
        read = partial(migplugin.mig_slots, sys_root, nvml_module)
        args = (pods, socket_dir, read, plugin.stop, 2.0, pod_resources_socket)
        threading.Thread(target=migplugin.serve, args=args, name="mig", daemon=True).start()
    plugin.run()
