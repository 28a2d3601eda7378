"""The API kinds Phalanx reads, where they live, and which of them a cluster may lack.

A kind is keyed the way the store and the rest of the adapter name it: `pods`, `nodes`, or
`group/version/plural`. Core kinds are always served; every other kind is optional and is
watched only while API discovery says the server serves it (a CRD may be installed later,
or removed).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.k8s import keys


@dataclass(frozen=True, slots=True)
class Kind:
    group: str  # "" for the core API
    version: str
    plural: str
    namespaced: bool
    kind: str = ""  # the object's `kind`, for Events and messages
    optional: bool = True
    superseded_by: str = ""  # a newer version's key: this one is not watched while that one is served

    @property
    def key(self) -> str:
        return self.plural if not self.group else f"{self.group}/{self.version}/{self.plural}"

    @property
    def api_version(self) -> str:
        return self.version if not self.group else f"{self.group}/{self.version}"

    @property
    def prefix(self) -> str:
        return "/api/v1" if not self.group else f"/apis/{self.group}/{self.version}"

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        p = self.prefix
        if self.namespaced and namespace:
            p += f"/namespaces/{namespace}"
        p += f"/{self.plural}"
        if name:
            p += f"/{name}"
        if sub:
            p += f"/{sub}"
        return p


PODS = Kind("", "v1", "pods", True, "Pod", optional=False)
NODES = Kind("", "v1", "nodes", False, "Node", optional=False)
EVENTS = Kind("", "v1", "events", True, "Event", optional=False)
NAMESPACES = Kind("", "v1", "namespaces", False, "Namespace", optional=False)
LEASES = Kind("coordination.k8s.io", "v1", "leases", True, "Lease", optional=False)
CONFIG_MAPS = Kind("", "v1", "configmaps", True, "ConfigMap", optional=False)
SECRETS = Kind("", "v1", "secrets", True, "Secret", optional=False)
WEBHOOK_CONFIGS = Kind(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    False,
    "MutatingWebhookConfiguration",
)

# Kubernetes' own gang API (phalanx.k8s.read.native): alpha behind the GenericWorkload gate in 1.36,
# beta in 1.37; a server without it serves neither, and the dialect is off
NATIVE_POD_GROUPS = (
    Kind("scheduling.k8s.io", "v1beta1", "podgroups", True, "PodGroup"),
    Kind(
        "scheduling.k8s.io",
        "v1alpha2",
        "podgroups",
        True,
        "PodGroup",
        superseded_by="scheduling.k8s.io/v1beta1/podgroups",
    ),
    # 1.37 serves PodGroups in v1alpha3 too (beside its CompositePodGroups): read there only where
    # v1beta1 is not served
    Kind(
        "scheduling.k8s.io",
        "v1alpha3",
        "podgroups",
        True,
        "PodGroup",
        superseded_by="scheduling.k8s.io/v1beta1/podgroups",
    ),
)
# Kubernetes' own multi-level gangs (phalanx.k8s.read.composite): alpha in 1.37 behind the
# CompositePodGroup gate, beta planned for 1.38 (watched there when served)
COMPOSITE_POD_GROUPS = (
    Kind("scheduling.k8s.io", "v1beta1", "compositepodgroups", True, "CompositePodGroup"),
    Kind(
        "scheduling.k8s.io",
        "v1alpha3",
        "compositepodgroups",
        True,
        "CompositePodGroup",
        superseded_by="scheduling.k8s.io/v1beta1/compositepodgroups",
    ),
)
POD_GROUPS = (
    *(Kind(g, v, p, True, "PodGroup") for g, v, p in keys.POD_GROUP_KINDS),
    *NATIVE_POD_GROUPS,
    *COMPOSITE_POD_GROUPS,
)
QUEUES = tuple(Kind(g, v, p, False, "Queue") for g, v, p in keys.QUEUE_KINDS)
OUR_POD_GROUPS = POD_GROUPS[0]
OUR_QUEUES = QUEUES[0]

# Dynamic Resource Allocation (resource.k8s.io/v1): a cluster without it simply has no DRA
DEVICE_CLASSES = Kind("resource.k8s.io", "v1", "deviceclasses", False, "DeviceClass")
RESOURCE_SLICES = Kind("resource.k8s.io", "v1", "resourceslices", False, "ResourceSlice")
RESOURCE_CLAIMS = Kind("resource.k8s.io", "v1", "resourceclaims", True, "ResourceClaim")
RESOURCE_CLAIM_TEMPLATES = Kind(
    "resource.k8s.io", "v1", "resourceclaimtemplates", True, "ResourceClaimTemplate"
)
DRA = (DEVICE_CLASSES, RESOURCE_SLICES, RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES)

# Kueue (kueue.x-k8s.io): v1beta2 is the version current releases store; v1beta1 is still served
_KUEUE = (
    ("clusterqueues", False, "ClusterQueue"),
    ("localqueues", True, "LocalQueue"),
    ("resourceflavors", False, "ResourceFlavor"),
    ("cohorts", False, "Cohort"),
    ("workloads", True, "Workload"),
)
KUEUE: dict[str, tuple[Kind, Kind]] = {
    kind: (
        Kind("kueue.x-k8s.io", "v1beta2", plural, namespaced, kind),
        Kind(
            "kueue.x-k8s.io",
            "v1beta1",
            plural,
            namespaced,
            kind,
            superseded_by=f"kueue.x-k8s.io/v1beta2/{plural}",
        ),
    )
    for plural, namespaced, kind in _KUEUE
}
JOBS = Kind("batch", "v1", "jobs", True, "Job")  # Kueue's queue label is on the Job, not on its pods
# Phalanx's Datasets: where a distributed one's chunks are, and whether it failed (placement by them)
DATASETS = Kind("scheduling.phalanx.io", "v1alpha1", "datasets", True, "Dataset")

# what the scheduler watches, in the order informers start
WATCHED: tuple[Kind, ...] = (
    NODES,
    PODS,
    *POD_GROUPS,
    *QUEUES,
    *DRA,
    JOBS,
    *(k for pair in KUEUE.values() for k in pair),
    DATASETS,
)
BY_KEY: dict[str, Kind] = {
    k.key: k for k in (*WATCHED, EVENTS, NAMESPACES, LEASES, CONFIG_MAPS, SECRETS, WEBHOOK_CONFIGS)
}


def of(key: str) -> Kind:
    try:
        return BY_KEY[key]
    except KeyError:
        raise ValueError(f"unknown kind {key!r}") from None


def keys_of(kinds: tuple[Kind, ...]) -> tuple[str, ...]:
    return tuple(k.key for k in kinds)
