"""The `Dataset` object (`scheduling.phalanx.io/v1alpha1`): where a training set lives, and who caches it.

A Dataset is namespaced; pods name it in `phalanx.io/dataset` and the caches key it as
`namespace/name`, which is also the folder it is cached in (so the name is checked as a DNS
label before it becomes a path).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from phalanx.core.errors import SpecError
from phalanx.spec.common import validate
from phalanx.spec.quantity import size_bytes

GROUP_VERSION = "scheduling.phalanx.io/v1alpha1"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "http", "https", "file")
CACHE_MODES = ("node", "distributed")
# distributed only: a pod waits until every file is cached (cached), or starts at once and reads
# what is not cached yet through the engine from the source (readThrough)
READINESS_MODES = ("cached", "readThrough")
MAX_REPLICAS = 3  # SeaweedFS replication "00N": at most 3 more copies in a rack; 3 in all is plenty


class SecretRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class DatasetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    source: str
    include: str = ""  # a glob on the path below the source, e.g. `train/*.tar`
    expected_size: int | str | None = Field(default=None, alias="expectedSize")
    read_only: bool = Field(default=True, alias="readOnly")
    secret_ref: SecretRef | None = Field(default=None, alias="secretRef")
    endpoint: str = ""  # an S3-compatible endpoint URL
    options: dict[str, str] = Field(default_factory=dict)  # more fsspec storage options
    nodes: list[str] = Field(default_factory=list)  # stage on these nodes now (a warm-up)
    # node: a whole copy per node (phalanx cache); distributed: one copy striped over the cache
    # group's volume servers (phalanx distcache, SeaweedFS), for datasets larger than a node
    cache: str = "node"
    replicas: int | None = None  # copies of each chunk in the group (distributed only; default 2)
    readiness: str | None = None  # when a pod may start (distributed only; default cached)


class Dataset(BaseModel):
    namespace: str
    name: str
    spec: DatasetSpec
    expected_bytes: int | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def distributed(self) -> bool:
        return self.spec.cache == "distributed"

    @property
    def copies(self) -> int:
        """Copies of each chunk in the cache group (1 for per-node copies: each node has its own)."""
        return self.spec.replicas or (2 if self.distributed else 1)

    @property
    def read_through(self) -> bool:
        """Pods start before the whole dataset is cached and read the rest through the engine."""
        return self.spec.readiness == "readThrough"

    @property
    def protocol(self) -> str:
        return self.spec.source.split("://", 1)[0] if "://" in self.spec.source else "file"


def dataset_key(namespace: str, name: str, where: str) -> str:
    for part, what in ((namespace, "namespace"), (name, "name")):
        if not _NAME.match(part) or ".." in part:
            raise SpecError(
                where, f"dataset {what} {part!r} is not a DNS name (lower case, digits, '-', '.')"
            )
    return f"{namespace}/{name}"


def pod_dataset(name: str, namespace: str) -> str:
    """A pod's `phalanx.io/dataset` as the caches key it: a bare name is in the pod's namespace."""
    name = name.strip()
    return name if not name or "/" in name else f"{namespace}/{name}"


def parse_dataset(obj: dict[str, Any]) -> Dataset:
    """A Dataset object from the API -> Dataset, or SpecError naming the object and the field."""
    meta = obj.get("metadata") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    where = f"Dataset {ns}/{name}"
    dataset_key(ns, name, where)
    spec = validate(DatasetSpec, obj.get("spec") or {}, f"{where}: spec")
    scheme = spec.source.split("://", 1)[0] if "://" in spec.source else ""
    if scheme not in SCHEMES:
        raise SpecError(
            f"{where}: spec.source",
            f"{spec.source!r} is not a URL Phalanx can read (one of {', '.join(s + '://' for s in SCHEMES)})",
        )
    if not spec.source.split("://", 1)[1].strip("/"):
        raise SpecError(f"{where}: spec.source", f"{spec.source!r} names no bucket or path")
    if not spec.read_only:
        raise SpecError(
            f"{where}: spec.readOnly", "cached copies are read-only; readOnly: false is not supported"
        )
    _check_cache(spec, where)
    expected = None
    if spec.expected_size is not None:
        expected = size_bytes(spec.expected_size, f"{where}: spec.expectedSize")
    return Dataset(namespace=ns, name=name, spec=spec, expected_bytes=expected)


def _check_cache(spec: DatasetSpec, where: str) -> None:
    """`cache` and what only one of its modes can honour, each refused with the field it is in."""
    if spec.cache not in CACHE_MODES:
        raise SpecError(
            f"{where}: spec.cache", f"must be one of {', '.join(CACHE_MODES)}; got {spec.cache!r}"
        )
    if spec.cache == "node":
        for field, value in (("replicas", spec.replicas), ("readiness", spec.readiness)):
            if value is not None:
                raise SpecError(
                    f"{where}: spec.{field}",
                    f"only a distributed cache (spec.cache: distributed) has {field}; "
                    "a per-node copy is always whole before a pod starts",
                )
        return
    if spec.readiness is not None and spec.readiness not in READINESS_MODES:
        raise SpecError(
            f"{where}: spec.readiness",
            f"must be one of {', '.join(READINESS_MODES)}; got {spec.readiness!r}",
        )
    if not spec.source.startswith("s3://"):
        raise SpecError(
            f"{where}: spec.source",
            f"cache: distributed mounts S3 sources only (SeaweedFS remote.mount); got {spec.source!r}",
        )
    if spec.nodes:
        raise SpecError(
            f"{where}: spec.nodes",
            "stages whole copies on those nodes; a distributed Dataset is cached across the group: drop it",
        )
    if "/" in spec.include:
        raise SpecError(
            f"{where}: spec.include",
            f"cache: distributed matches file names only (no '/'); got {spec.include!r}",
        )
    if spec.replicas is not None and not 1 <= spec.replicas <= MAX_REPLICAS:
        raise SpecError(f"{where}: spec.replicas", f"must be 1 to {MAX_REPLICAS}; got {spec.replicas}")
