"""Label, annotation and resource keys Phalanx reads and writes, ours and the dialects we accept.

`docs/kubernetes.md` has the table of what each key means in Phalanx.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.spec import mig_layout

GROUP = "scheduling.phalanx.io"
VERSION = "v1alpha1"


def is_ours(obj: Mapping[str, object]) -> bool:
    """Whether an object (PodGroup, Queue) is of our API group rather than another scheduler's:
    ours win a name clash, and only ours get their status written by us."""
    return str(obj.get("apiVersion", "")).startswith(GROUP)


# written by Phalanx on pods before the bind (device assignment; see docs/kubernetes.md)
GPU_DEVICES = "phalanx.io/gpu-devices"  # "0,1": GPU indices on the node
GPU_FRACTION = "phalanx.io/gpu-fraction"  # "0.5": share of each GPU in GPU_DEVICES
GPU_MEMORY = "phalanx.io/gpu-memory"  # "10240": MiB of each GPU in GPU_DEVICES (shares)
MIG_SLICE = "phalanx.io/mig-slice"  # "3g.40gb@4": profile and start slot on GPU_DEVICES[0]
MIG_LAYOUT = mig_layout.LAYOUT  # node annotation: the MIG layouts the scheduler wants
MIG_LAYOUT_STATUS = mig_layout.STATUS  # node annotation: the node agent's answers to them
RDMA_NICS = "phalanx.io/rdma-nics"  # "0,1": RDMA NIC indices
GPU_BACKEND_CHOSEN = "phalanx.io/gpu-backend-chosen"  # "mig" | "mps" | "time-slice": what serves a share
NODE_INTENT = "phalanx.io/node"  # the node chosen for the pod (on the Binding; before it, by older versions)
GANG_PLAN = "phalanx.io/gang-plan"  # on a gang's first pod, before its binds: every member's assignment
# GPU shares on the stock device plugin (docs/kubernetes.md, "Device-plugin clusters")
GPU_CONFIGMAP = "phalanx.io/gpu-configmap"  # set at admission: the ConfigMap the share's env comes from
GPU_RESERVATION = "phalanx.io/gpu-reservation"  # label of reservation pods: "<gpu index>"
RESERVED_GPU = "phalanx.io/reserved-gpu"  # on a reservation pod, by `phalanx node reserve`: its GPU's UUID
KAI_FRACTION_CONTAINER = "gpu-fraction-container-name"  # KAI: which container gets the share

# read by Phalanx
DEVICE_TOPOLOGY = "phalanx.io/device-topology"  # node annotation, JSON (docs/kubernetes.md)
CACHED_DATASETS = "phalanx.io/cached-datasets"  # node annotation, JSON {"ns/name": "150Gi"}: ready copies
# read as a label of every node whose dataset cache agent publishes CACHED_DATASETS (never written):
# a pod that mounts its dataset from the node's cache (DATASET_VOLUME) goes only to such a node
CACHE_AGENT = "phalanx.io/dataset-cache-agent"
DATASET_VOLUME = "phalanx-dataset"  # the webhook's hostPath volume of a pod's cached dataset
# the distributed dataset cache: the webhook's hostPath volume of a pod reading a distributed Dataset
# through the node's FUSE mount, and the node label of the cache nodes (the chart's volume servers
# select on it; they must run the mount too): such a pod goes only to a node labelled "true"
DISTCACHE_VOLUME = "phalanx-distcache"
DISTCACHE_NODE = "phalanx.io/distcache"
STAGING_DATASETS = "phalanx.io/staging-datasets"  # node annotation, JSON {"ns/name": "<staged>/<total>"}
STAGE_DATASETS = "phalanx.io/stage-datasets"  # node annotation by the scheduler: {"ns/name": "<workload>"}
QUEUE = "phalanx.io/queue"
POD_GROUP = "phalanx.io/pod-group"
MIN_AVAILABLE = "phalanx.io/min-available"
PREEMPTIBLE = "phalanx.io/preemptible"
CHECKPOINT_INTERVAL = "phalanx.io/checkpoint-interval"
RESTART_SECONDS = "phalanx.io/restart-seconds"  # pod annotation: what an eviction costs it to restart
LAST_CHECKPOINT = "phalanx.io/last-checkpoint"  # pod annotation, RFC 3339: written by the job
ESTIMATED_RUNTIME = "phalanx.io/estimated-runtime"
DATASET = "phalanx.io/dataset"
TOPOLOGY_LEVEL = "phalanx.io/topology-level"
TOPOLOGY_REQUIRED = "phalanx.io/topology-required"
RDMA_SAME_PCIE = "phalanx.io/rdma-same-pcie"

# the queue of a pod, in order of precedence (label or annotation)
QUEUE_KEYS = (
    QUEUE,
    "kai.scheduler/queue",
    "runai/queue",
    "scheduling.volcano.sh/queue-name",
    "kueue.x-k8s.io/queue-name",
)
# the pod group a pod belongs to (label or annotation)
GROUP_KEYS = (
    POD_GROUP,
    "pod-group-name",  # KAI
    "scheduling.k8s.io/group-name",  # Volcano
    "scheduling.volcano.sh/group-name",
    "scheduling.x-k8s.io/pod-group",  # scheduler-plugins coscheduling
    "kueue.x-k8s.io/pod-group-name",
)
KUEUE_GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"

# KAI GPU sharing annotations
KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
KAI_FRACTION_DEVICES = "gpu-fraction-num-devices"
# the pod's own choice of what serves its fraction: mig | mps | time-slice | auto (core.backends)
GPU_BACKEND = "phalanx.io/gpu-backend"

# resources
GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
HAMI_GPUMEM = "nvidia.com/gpumem"
HAMI_GPUMEM_PERCENT = "nvidia.com/gpumem-percentage"

# NVIDIA GPU Feature Discovery labels
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_MIG_CONFIG = "nvidia.com/mig.config"

# PodGroup kinds we read: (group, version, plural)
POD_GROUP_KINDS = (
    (GROUP, VERSION, "podgroups"),
    ("scheduling.run.ai", "v2alpha2", "podgroups"),
    ("scheduling.volcano.sh", "v1beta1", "podgroups"),
    ("scheduling.x-k8s.io", "v1alpha1", "podgroups"),
)
QUEUE_KINDS = (
    (GROUP, VERSION, "queues"),
    ("scheduling.run.ai", "v2", "queues"),
    ("scheduling.volcano.sh", "v1beta1", "queues"),
)

# owners whose pods form one workload when no pod group is named
AUTO_GROUP_OWNERS = ("Job", "JobSet", "PyTorchJob", "MPIJob", "RayCluster", "LeaderWorkerSet", "TFJob")
# labels that name the real owner when the direct owner is an intermediate object
OWNER_LABELS = (
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),
    ("ray.io/cluster", "RayCluster"),
    ("training.kubeflow.org/job-name", "PyTorchJob"),
)
