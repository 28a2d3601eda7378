"""`phalanx cache`: the node's dataset cache agent (one process per node, a DaemonSet).

Each look it reads the Datasets, its own Node and the pods bound to it, and stages what this
node is asked for, most urgent first: datasets of pods already bound here (cache on first use),
then the scheduler's requests (`phalanx.io/stage-datasets` on the Node: a gang it is about to
place here), then the Datasets that name this node (`spec.nodes`, a warm-up). It publishes what
it holds in `phalanx.io/cached-datasets` (ready copies) and `phalanx.io/staging-datasets`
(`staged/total` bytes), which the scheduler's locality plugin reads, and its state per node in
the Dataset's status. A copy a pod on this node uses is never evicted; others go least recently
used first when space is needed, and when their Dataset is deleted. A pod bound here whose
dataset cannot be cached (its Dataset missing or bad, its staging failed) is told why by a
Warning Event `DatasetNotCached` (once per pod and reason): its own Events otherwise show only
kubelet's FailedMount.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod, Secret
from lightkube.types import PatchType
from prometheus_client import CollectorRegistry, Counter, Gauge

from phalanx.core.errors import SpecError
from phalanx.node import stager
from phalanx.node.cachestore import CacheStore
from phalanx.spec.datasets import Dataset, dataset_key, parse_dataset, pod_dataset

log = logging.getLogger("phalanx.cache")
CACHED = "phalanx.io/cached-datasets"
STAGING = "phalanx.io/staging-datasets"
REQUESTS = "phalanx.io/stage-datasets"
DATASET = "phalanx.io/dataset"
PER_NODE_VOLUME = "phalanx-dataset"  # the webhook's volume of a per-node copy (k8s.keys.DATASET_VOLUME)
DatasetRes = create_namespaced_resource("scheduling.phalanx.io", "v1alpha1", "Dataset", "datasets")
RETRY_S = 30.0


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.cached = Gauge("phalanx_cache_bytes", "Bytes of ready dataset copies", registry=r)
        self.capacity = Gauge("phalanx_cache_capacity_bytes", "Cache capacity", registry=r)
        self.datasets = Gauge("phalanx_cache_datasets", "Ready dataset copies", registry=r)
        self.hits = Counter("phalanx_cache_hits", "Pods whose dataset was ready when bound here", registry=r)
        self.misses = Counter(
            "phalanx_cache_misses", "Pods whose dataset was not ready when bound", registry=r
        )
        self.staged = Counter("phalanx_cache_staged_bytes", "Bytes downloaded into the cache", registry=r)
        self.rate = Gauge("phalanx_cache_staging_bytes_per_second", "Throughput of the staging", registry=r)
        self.evicted = Counter("phalanx_cache_evictions", "Dataset copies evicted", registry=r)
        self.failures = Counter("phalanx_cache_failures", "Stagings that failed", ["reason"], registry=r)


@dataclass
class Want:
    key: str
    why: str  # "in use", "requested by the scheduler", "spec.nodes"


class CacheAgent:
    def __init__(
        self,
        client: Client,
        node: str,
        store: CacheStore,
        workers: int = 16,
        checksum: bool = False,
        max_rate: float = 0.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.client = client
        self.node = node
        self.store = store
        self.workers = workers
        self.checksum = checksum
        self.max_rate = max_rate
        self.metrics = metrics or Metrics()
        self.stop = threading.Event()
        self.failed: dict[str, tuple[float, str]] = {}  # key -> (when, reason), retried after RETRY_S
        self.seen_pods: set[str] = set()
        self.told: set[tuple[str, str]] = set()  # (pod uid, reason) a DatasetNotCached Event said
        self.pod_uids: dict[str, str] = {}  # namespace/name -> uid of the pods bound here
        self.per_node_mount: set[str] = set()  # namespace/name of pods given the per-node hostPath
        self.published: dict[str, str] = {}
        self.metrics.capacity.set(store.capacity)

    # ------------------------------------------------------------------ one look
    def look(self) -> list[Want]:
        """Read the cluster, stage the most urgent dataset wanted here, publish. What is still wanted."""
        datasets, bad = self._datasets()
        # a distributed Dataset is cached across the group by `phalanx distcache`, never copied here
        elsewhere = {k for k, d in datasets.items() if d.distributed}
        every_use = self._in_use(datasets)
        datasets = {k: d for k, d in datasets.items() if k not in elsewhere}
        in_use = {k: v for k, v in every_use.items() if k not in elsewhere}
        wants = self._wants(datasets, in_use)
        self.store.touch([k for k in self.store.ready() if k in in_use])
        for key, why in bad.items():
            if any(w.key == key for w in wants):
                self._status(key, {"state": "failed", "reason": why})
        for key in list(self.store.ready()):
            if key not in datasets and key not in bad and key not in in_use:
                log.info("dataset %s: its Dataset is gone; evicting the copy", key)
                self._evict(key)
        todo = [w for w in wants if w.key not in self.store.ready() and w.key in datasets]
        now = time.monotonic()
        todo = [w for w in todo if now - self.failed.get(w.key, (-1e9, ""))[0] >= RETRY_S]
        self._publish()
        if todo:
            w = todo[0]
            self._stage(datasets[w.key], w, {x.key for x in wants} & set(in_use))
            self._publish()
        self._tell(in_use, datasets, bad)
        self._tell_distributed({k: v for k, v in every_use.items() if k in elsewhere})
        return todo

    def _tell(self, in_use: dict[str, list[str]], datasets: dict[str, Dataset], bad: dict[str, str]) -> None:
        """A Warning Event on each pod here whose dataset cannot be cached, saying why."""
        for key, pods in in_use.items():
            if key in self.store.ready():
                continue
            if key in bad:
                why = f"Dataset {key} cannot be read: {bad[key]}"
            elif key not in datasets:
                why = f"Dataset {key} does not exist: create it, or fix the pod's {DATASET} annotation"
            elif key in self.failed:
                why = f"staging Dataset {key} on node {self.node} failed: {self.failed[key][1]}"
            else:
                continue
            self._warn(pods, why)

    def _tell_distributed(self, in_use: dict[str, list[str]]) -> None:
        """Pods here naming a distributed Dataset that the webhook gave the per-node mount (where the
        distributed cache does not run, or the Dataset was created after the pod): that copy is never
        made. Said once, not left silent; a pod on the distributed mount is not told anything."""
        for key, pods in in_use.items():
            why = (
                f"Dataset {key} is distributed (spec.cache: distributed) but this pod mounts a per-node "
                "copy, which is never made: run the distributed cache (the Helm chart's distcache.enabled) "
                "and create the pod again, or set spec.cache: node"
            )
            self._warn([p for p in pods if p in self.per_node_mount], why)

    def _warn(self, pods: list[str], why: str) -> None:
        for pod in pods:
            uid = self.pod_uids.get(pod, "")
            if (uid, why) in self.told:
                continue
            self.told.add((uid, why))
            ns, name = pod.split("/", 1)
            try:
                self.client.create(_event(ns, name, uid, self.node, why))
            except Exception as e:  # an Event is a courtesy: the Dataset's status says it too
                log.warning("could not tell pod %s that its dataset is not cached: %s", pod, e)

    def run(self, interval: float) -> None:
        while not self.stop.is_set():
            try:
                todo = self.look()
            except Exception:
                log.exception("cache agent look failed; trying again")
                todo = []
            if not todo:
                self.stop.wait(interval)

    # ------------------------------------------------------------------ reading
    def _datasets(self) -> tuple[dict[str, Dataset], dict[str, str]]:
        out: dict[str, Dataset] = {}
        bad: dict[str, str] = {}
        for obj in self.client.list(DatasetRes, namespace="*"):
            raw: dict[str, Any] = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)  # type: ignore[no-untyped-call]
            meta = raw.get("metadata") or {}
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            try:
                ds = parse_dataset(raw)
            except SpecError as e:
                bad[key] = str(e)
                continue
            out[ds.key] = ds
        return out, bad

    def _pods(self) -> list[dict[str, Any]]:
        pods = self.client.list(Pod, namespace="*", fields={"spec.nodeName": self.node})
        return [p.to_dict() for p in pods]

    def _in_use(self, datasets: dict[str, Dataset]) -> dict[str, list[str]]:
        """Datasets named by pods bound here and not finished -> those pods."""
        out: dict[str, list[str]] = {}
        for p in self._pods():
            meta = p.get("metadata") or {}
            name = (meta.get("annotations") or {}).get(DATASET)
            if not name or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            ns = str(meta.get("namespace") or "default")
            key_ns, _, key_name = pod_dataset(name, ns).partition("/")
            try:
                key = dataset_key(key_ns, key_name, f"pod {ns}/{meta.get('name')}: annotation {DATASET}")
            except SpecError as e:
                log.warning("%s", e)
                continue
            out.setdefault(key, []).append(f"{ns}/{meta.get('name')}")
            if any(v.get("name") == PER_NODE_VOLUME for v in (p.get("spec") or {}).get("volumes") or []):
                self.per_node_mount.add(f"{ns}/{meta.get('name')}")
            uid = str(meta.get("uid") or "")
            self.pod_uids[f"{ns}/{meta.get('name')}"] = uid
            if uid and uid not in self.seen_pods:
                self.seen_pods.add(uid)
                (self.metrics.hits if key in self.store.ready() else self.metrics.misses).inc()
        return out

    def _wants(self, datasets: dict[str, Dataset], in_use: dict[str, list[str]]) -> list[Want]:
        node = self.client.get(Node, self.node)
        notes = dict(node.metadata.annotations or {}) if node.metadata else {}
        requested: list[str] = []
        if notes.get(REQUESTS):
            try:
                raw = json.loads(notes[REQUESTS])
                requested = sorted(raw) if isinstance(raw, dict) else []
            except ValueError:
                log.warning("node %s: annotation %s is not JSON; ignored", self.node, REQUESTS)
        out = [Want(k, "in use by " + ", ".join(v[:3])) for k, v in sorted(in_use.items())]
        out += [Want(k, "requested by the scheduler") for k in requested]
        out += [Want(k, "spec.nodes") for k, d in sorted(datasets.items()) if self.node in d.spec.nodes]
        first: dict[str, Want] = {}
        for w in out:
            first.setdefault(w.key, w)  # the most urgent reason for each dataset
        return list(first.values())

    # ------------------------------------------------------------------ staging
    def _filesystem(self, ds: Dataset) -> tuple[Any, str]:
        return open_source(self.client, ds)

    def _stage(self, ds: Dataset, want: Want, keep: set[str]) -> None:
        key = ds.key
        folder = self.store.staging_dir(key)
        try:
            fs, root = self._filesystem(ds)
            files = stager.read_manifest(folder, ds.spec.source)
            if files is None:
                files = stager.list_source(fs, root, ds.spec.include, ds.spec.source)
                stager.write_manifest(folder, ds.spec.source, files)
            for attempt in range(3):
                total = sum(f.size for f in files)
                self._status(
                    key,
                    {"state": "staging", "bytes": self.store.staged_bytes(key), "reason": want.why},
                    top={"totalBytes": total, "files": len(files)},
                )
                self._make_room(key, total, keep | {key})
                log.info(
                    "staging %s (%s): %d files, %s, %s",
                    key,
                    want.why,
                    len(files),
                    _size(total),
                    ds.spec.source,
                )
                t0 = time.monotonic()
                p = stager.stage(
                    fs,
                    files,
                    folder,
                    self.workers,
                    self._reporter(key),
                    stop=self.stop,
                    checksum=self.checksum,
                    max_rate=self.max_rate,
                )
                self.metrics.staged.inc(p.fetched)
                if p.done_files < len(files):
                    return  # stopped
                again = stager.list_source(fs, root, ds.spec.include, ds.spec.source)
                moved = stager.changed(files, again)
                if not moved:
                    break
                log.warning(
                    "dataset %s: %d object(s) changed while staging; fetching them again", key, len(moved)
                )
                for rel in moved:
                    for p_ in (folder / rel, folder / (rel + ".part")):
                        p_.unlink(missing_ok=True)
                files = again
                stager.write_manifest(folder, ds.spec.source, files)
                if attempt == 2:
                    raise stager.StageError("the source kept changing while it was staged (3 tries)")
            self.store.promote(key, ds.spec.source)
            self.failed.pop(key, None)
            dt = time.monotonic() - t0
            log.info(
                "dataset %s ready: %s in %.1f s (%s/s)",
                key,
                _size(total),
                dt,
                _size(p.fetched / max(dt, 1e-9)),
            )
            self._status(key, {"state": "ready", "bytes": total, "files": len(files), "reason": ""})
        except stager.StageError as e:
            self._fail(key, str(e))
        except OSError as e:
            self._fail(key, f"{type(e).__name__}: {e}")

    def _fail(self, key: str, reason: str) -> None:
        log.error("dataset %s: staging failed: %s", key, reason)
        self.failed[key] = (time.monotonic(), reason)
        self.metrics.failures.labels(reason=reason.split(":")[0][:40]).inc()
        self._status(key, {"state": "failed", "reason": reason, "bytes": self.store.staged_bytes(key)})

    def _make_room(self, key: str, total: int, keep: set[str]) -> None:
        if total > self.store.capacity:
            cap = _size(self.store.capacity)
            raise stager.StageError(f"the dataset ({_size(total)}) is larger than this node's cache ({cap})")
        need = total - self.store.staged_bytes(key)
        victims = self.store.victims(need, keep)
        if victims is None:
            cap = _size(self.store.capacity)
            raise stager.StageError(
                f"cache full: {_size(need)} more needed; the rest of {cap} holds datasets in use"
            )
        for v in victims:
            log.info("dataset %s: evicted (least recently used) to make room for %s", v, key)
            self._evict(v)

    def _evict(self, key: str) -> None:
        self._status(key, {"state": "evicting", "reason": ""})
        self.store.evict(key)
        self.metrics.evicted.inc()
        self._status(key, None)

    def _reporter(self, key: str):  # type: ignore[no-untyped-def]
        last = [0.0]

        def report(p: stager.Progress) -> None:
            rate = p.rate()
            self.metrics.rate.set(rate)
            pct = 100.0 * p.done_bytes / p.total_bytes if p.total_bytes else 100.0
            log.info(
                "staging %s: %s of %s (%.0f %%), %d/%d files, %s/s",
                key,
                _size(p.done_bytes),
                _size(p.total_bytes),
                pct,
                p.done_files,
                p.total_files,
                _size(rate),
            )
            if time.monotonic() - last[0] >= 2.0:
                last[0] = time.monotonic()
                self._status(key, {"state": "staging", "bytes": p.done_bytes})
                self._publish(staging={key: (p.done_bytes, p.total_bytes)})

        return report

    # ------------------------------------------------------------------ publishing
    def _publish(self, staging: dict[str, tuple[int, int]] | None = None) -> None:
        ready = self.store.ready()
        self.metrics.cached.set(sum(ready.values()))
        self.metrics.datasets.set(len(ready))
        staged = staging or {}
        notes = {
            CACHED: json.dumps({k: str(v) for k, v in sorted(ready.items())}, separators=(",", ":")),
            STAGING: json.dumps(
                {k: f"{a}/{b}" for k, (a, b) in sorted(staged.items())}, separators=(",", ":")
            ),
        }
        if notes == self.published:
            return
        self.client.patch(Node, self.node, {"metadata": {"annotations": notes}})
        self.published = notes

    def _status(self, key: str, entry: dict[str, Any] | None, top: dict[str, Any] | None = None) -> None:
        """Merge this node's entry into the Dataset's status (None removes it)."""
        ns, name = key.split("/", 1)
        if entry is not None:
            entry = {**entry, "lastUpdate": _now()}
            ready = self.store.index.get(key)
            if ready is not None:
                entry["lastUsed"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ready.last_used))
        body: dict[str, Any] = {"status": {"nodes": {self.node: entry}, **(top or {})}}
        try:
            self.client.patch(DatasetRes.Status, name, body, namespace=ns, patch_type=PatchType.MERGE)
        except Exception as e:  # the Dataset may be gone; the node annotation still says the truth
            log.debug("dataset %s: status not written: %s", key, e)


def open_source(client: Client, ds: Dataset) -> tuple[Any, str]:
    """The Dataset's source as an fsspec filesystem and its root path (its Secret read for S3 keys)."""
    import fsspec

    opts: dict[str, Any] = dict(ds.spec.options)
    if ds.protocol == "s3":
        if ds.spec.endpoint:
            opts["endpoint_url"] = ds.spec.endpoint
        if ds.spec.secret_ref is not None:
            data = read_secret(client, ds)
            for field_name, opt in (
                ("AWS_ACCESS_KEY_ID", "key"),
                ("AWS_SECRET_ACCESS_KEY", "secret"),
                ("AWS_SESSION_TOKEN", "token"),
            ):
                if field_name in data:
                    opts[opt] = data[field_name]
        opts.setdefault("skip_instance_cache", True)
    try:
        fs, path = fsspec.core.url_to_fs(ds.spec.source, **opts)
    except (ImportError, ValueError, TypeError) as e:
        raise stager.StageError(f"cannot open {ds.spec.source}: {e}") from None
    return fs, path


def read_secret(client: Client, ds: Dataset) -> dict[str, str]:
    """The Dataset's `secretRef` Secret, decoded; StageError when it cannot be read."""
    import base64

    ref = ds.spec.secret_ref
    assert ref is not None
    try:
        sec = client.get(Secret, ref.name, namespace=ds.namespace)
    except Exception as e:
        raise stager.StageError(f"cannot read Secret {ds.namespace}/{ref.name}: {e}") from None
    return {k: base64.b64decode(v).decode() for k, v in (sec.data or {}).items()}


def _event(ns: str, pod: str, uid: str, node: str, why: str) -> Event:
    now = datetime.now(UTC)
    return Event(
        metadata=ObjectMeta(generateName=f"{pod}.", namespace=ns),
        involvedObject=ObjectReference(kind="Pod", namespace=ns, name=pod, uid=uid, apiVersion="v1"),
        reason="DatasetNotCached",
        message=why,
        type="Warning",
        source=EventSource(component="phalanx-cache", host=node),
        firstTimestamp=now,
        lastTimestamp=now,
        count=1,
    )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _size(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def open_store(root: Path, capacity: int) -> CacheStore:
    root.mkdir(parents=True, exist_ok=True)
    return CacheStore(root, capacity)
