"""Built-in clusters, nameable with `phalanx simulate --cluster NAME`.

The simulator already used these when a trace came without a cluster (the embedded Tiresias
replay's 16 V100, Gavel's philly spec, the Pollux testbed); giving them names lets a user replay
another trace on them, or say which one a result came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from phalanx.core.errors import SpecError
from phalanx.core.model import Gpu, Node
from phalanx.sim.traces import gavel, openb, pollux

Layout = tuple[list[Node], list[str]]


def tiresias_16xv100() -> Layout:
    """4 nodes x 4 V100 in 2 racks: 16 GPUs, small enough that the 60-job trace queues."""
    nodes = [
        Node(
            f"v100-{k}",
            32_000,
            256 * 1024,
            tuple(Gpu(j, "V100", 16384, pcie_switch=j // 2) for j in range(4)),
            topology={"rack": f"rack{k // 2}"},
        )
        for k in range(4)
    ]
    return nodes, ["rack"]


def openb_slice() -> Layout:
    path = Path(str(resources.files("phalanx.data") / "openb-slice-nodes.csv"))
    return openb.load_nodes(path), []


@dataclass(frozen=True)
class BuiltinCluster:
    what: str
    build: Callable[[], Layout]


BUILTIN_CLUSTERS: dict[str, BuiltinCluster] = {
    "tiresias-16xV100": BuiltinCluster(
        "4 nodes x 4 V100 in 2 racks (the embedded Tiresias replay's cluster)", tiresias_16xv100
    ),
    "gavel-philly-500xV100": BuiltinCluster(
        "Gavel philly spec: 125 x 4-GPU V100 servers, racks of 16", gavel.philly_cluster
    ),
    "pollux-64xT4": BuiltinCluster("Pollux testbed: 16 nodes x 4 T4", pollux.testbed_cluster),
    "openb-slice": BuiltinCluster("every 8th node of the openb GPU node list (embedded)", openb_slice),
}


def builtin_names() -> str:
    return ", ".join(BUILTIN_CLUSTERS)


def builtin_cluster(name: str) -> tuple[list[Node], list[str], str]:
    """Nodes, topology levels and a description of the built-in cluster `name`."""
    b = BUILTIN_CLUSTERS.get(name)
    if b is None:
        raise SpecError(
            "--cluster", f"unknown built-in cluster {name!r} (built-in: {builtin_names()}; or a file)"
        )
    nodes, levels = b.build()
    return nodes, levels, f"{name}: {b.what}"
