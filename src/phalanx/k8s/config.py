"""Settings of the Kubernetes adapter (command-line flags of `phalanx scheduler`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phalanx.spec.common import pairs
from phalanx.spec.shards import ShardOf

DEFAULT_LEVELS = (
    ("zone", "topology.kubernetes.io/zone"),
    ("spine", "topology.phalanx.io/spine"),
    ("rack", "topology.phalanx.io/rack"),
)


@dataclass(frozen=True)
class ReservationPodExtras:
    """What a cluster adds to the GPU reservation pods (`--reservation-pod FILE`): the NVIDIA
    runtime's class where it is not the default (NVML comes from it), and variables and volumes
    (an API server address, a driver folder). Parsed and checked by `phalanx.k8s.act.shares`."""

    runtime_class_name: str = ""
    env: tuple[dict[str, Any], ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()
    volume_mounts: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class AdapterConfig:
    scheduler_name: str = "phalanx"
    profile: str = "phalanx-queues"
    # topology levels, outermost first: (level name, node label key)
    levels: tuple[tuple[str, str], ...] = DEFAULT_LEVELS
    # extended resources that count RDMA NICs
    rdma_resources: tuple[str, ...] = ("rdma/rdma_shared_device_a", "rdma/hca", "nvidia.com/rdma")
    pool_label: str = "phalanx.io/node-pool"
    # the scheduling shard this process is (`phalanx.spec.shards`; None: one scheduler for the cluster)
    shard: ShardOf | None = None
    default_queue: str = "default"
    lease_namespace: str = "phalanx-system"  # for the leader-election Lease
    leader_elect: bool = True
    lease_seconds: int = 15  # a replica takes over after this long without a renewal
    cycle_seconds: float = 1.0
    # a quiet cluster (nothing waiting, nothing changed) is looked at again at least this often
    quiet_recheck_s: float = 30.0
    # the snapshot is kept between cycles (phalanx.k8s.read.carry); this often it is also built
    # from scratch and compared, and replaced if they differ (0: never compared)
    world_audit_s: float = 300.0
    # the cyclic garbage collector: everything alive frozen after each cycle, a full collection
    # between cycles this often (0: as CPython runs it; `phalanx.k8s.loop.heap`)
    gc_full_every_s: float = 600.0
    rediscover_seconds: float = 30.0  # how often API discovery looks for kinds not served yet
    bind_workers: int = 48  # concurrent binds (each gang is bound by one worker)
    # DRA drivers whose devices are RDMA NICs (paired with GPUs on their PCIe root)
    dra_nic_drivers: tuple[str, ...] = ("dra.net", "rdma.nvidia.com", "sriovnetwork.k8snetworkplumbingwg.io")
    # GPU shares on the stock device plugin (phalanx.k8s.act.shares): "off" or "reservation"
    gpu_shares: str = "off"
    reservation_namespace: str = "phalanx-system"
    reservation_image: str = "phalanx:0.1.0"
    reservation_priority_class: str = "phalanx-gpu-reservation"
    reservation_timeout_s: float = 120.0  # a reservation pod without a GPU by then is deleted
    reservation_extras: ReservationPodExtras = ReservationPodExtras()
    share_limit_env: bool = False  # also write HAMi-core's CUDA_DEVICE_MEMORY_LIMIT / _SM_LIMIT
    # MPS shares (`core.backends`): the node folder of the MPS control daemon's pipes, given to an
    # MPS share as CUDA_MPS_PIPE_DIRECTORY; the webhook mounts it into every share container when
    # the scheduler's profile may pick MPS (`mps_shares`), else only where the pod asks for MPS
    mps_pipe_directory: str = "/run/nvidia/mps"
    mps_shares: bool = False
    # Kueue users (phalanx.k8s.read.kueue): "auto" (coexist when a Kueue controller runs), "coexist",
    # "migrate" (Phalanx enforces the ClusterQueues) or "off"
    kueue: str = "auto"
    # seconds a gang short of pods (minMember above the pods that exist) is taken to be still
    # being created: its pods are told "waiting for N more pods" as a Normal Event; later, a Warning
    gang_creation_grace_s: float = 60.0
    # seconds per cycle for start forecasts and "fits now if" checks of waiting workloads (0: off)
    forecast_budget_s: float = 0.2
    # the dataset cache (`phalanx cache --root`) on every node, and where pods see their dataset
    dataset_root: str = "/var/lib/phalanx/datasets"
    dataset_mount: str = "/phalanx/datasets"
    # seconds a staging request stays on a Node after the scheduler last wanted it (0: no requests)
    stage_ahead_s: float = 600.0
    # attained service and fair-share history kept on the API (phalanx.k8s.loop.service): the leader
    # writes them at most this often, and reads them back when it starts to lead
    service_save_s: float = 60.0
    # half-life of each queue's time-decayed usage history (the fair-share history; 0: not kept)
    history_half_life_s: float = 86400.0
    extra: dict[str, str] = field(default_factory=dict)

    def shard_suffix(self) -> str:
        """What a shard's own objects add to their names (its Lease, its attained-service record)."""
        return f"-{self.shard.me.name}" if self.shard is not None else ""


def parse_levels(text: str) -> tuple[tuple[str, str], ...]:
    """`zone=topology.kubernetes.io/zone,rack=example.com/rack` -> ((zone, key), (rack, key))."""
    return tuple(pairs(text, "--topology-levels", "level=label-key"))
