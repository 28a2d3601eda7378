"""Input I/O in the time replay: datasets read from remote storage, node caches, staging ahead.

A job reads its dataset once per epoch; its nodes each read a shard (size / nodes). Its
epochs come from the trace (iterations x batch / samples of the dataset) or the default.
Three modes, as the node cache agent can run (`phalanx cache`):

- `none`: every epoch is read from remote storage at `read_gbps` per node (a training loader's
  small random reads), shared by the GPUs of the node (a job gets its GPUs' part); an epoch
  takes max(compute, shard / read bandwidth), the rest is waiting.
- `first-use`: the job's nodes copy the whole dataset when it starts there (bulk, parallel,
  at `stage_gbps` per node), and the job waits for the copy, or reads cold if that is sooner
  (the runtime model weighs both); later jobs on those nodes find it cached (LRU, `capacity_gb`).
- `ahead`: as `first-use`, and the scheduler also asks the nodes its start forecast gives a
  waiting gang to stage its dataset before the gang starts (one staging at a time per node).
- `warm`: as `first-use`, and the first time a job arrives with a dataset that takes a while to
  copy, every node copies it into free cache space (never evicting a cached dataset for it;
  after the copies `ahead` asked for): a dataset in use is kept warm where any of its jobs may
  start. No forecast: it costs copies (TB staged), not scheduling time.
- `distributed`: each dataset striped over a cache group of nodes and fetched from the source once
  for the group, then read from the members' NVMe over the network (`phalanx.sim.distcache`); jobs
  reading one are placed by the core's distributed-cache filter, score and planner, as on Kubernetes.

In the per-node modes a node holds a whole copy or none (as the cache agent does): a job with a
node that cannot hold one reads every epoch from the source. Egress (bytes from the source) is the
copies plus such reads; a job that reads cold rather than wait for the copy is taken to fill the
cache as it reads (read-through), so its first epoch's bytes are the copy's.

The wait is added to the job's run time, and GPU time lost to it is recorded per job.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from phalanx.core.forecast import RuntimeOf, estimated_runtime, forecast
from phalanx.core.model import Node, Workload
from phalanx.core.profile import Profile
from phalanx.core.snapshot import Snapshot
from phalanx.plugins.locality import set_distcache_bytes
from phalanx.sim.distcache import CacheGroup, group_members, reading_distributed, with_mount
from phalanx.sim.jobs import JobSpec
from phalanx.sim.runtime import IoSpec

_BATCH = re.compile(r"batch size (\d+)")
MODES = ("none", "first-use", "ahead", "warm", "distributed")


@dataclass
class NodeCache:
    capacity: float
    cached: OrderedDict[str, float] = field(default_factory=OrderedDict)  # dataset -> bytes, LRU first
    in_use: dict[str, int] = field(default_factory=dict)
    queue: list[str] = field(default_factory=list)  # datasets being staged ahead, in order
    warm: list[str] = field(default_factory=list)  # datasets to copy into free space (`warm`)

    def free(self) -> float:
        return self.capacity - self.used()

    def used(self) -> float:
        return sum(self.cached.values())

    def touch(self, ds: str) -> None:
        if ds in self.cached:
            self.cached.move_to_end(ds)

    def make_room(self, need: float, keep: str) -> bool:
        """Evict least recently used datasets not in use until `need` more bytes fit."""
        while self.capacity - self.used() < need:
            victim = next((d for d in self.cached if d != keep and not self.in_use.get(d)), None)
            if victim is None:
                return False
            del self.cached[victim]
        return True


@dataclass
class DataCache:
    spec: IoSpec
    sizes: dict[str, float]  # dataset -> bytes
    mode: str = "first-use"
    nodes: list[NodeCache] = field(default_factory=list)
    last: float = 0.0
    last_plan: float = -math.inf
    staged_bytes: float = 0.0
    starts: int = 0
    warm_starts: int = 0
    planned: dict[str, set[int]] = field(default_factory=dict)  # gang -> nodes staging was asked on
    considered: set[str] = field(default_factory=set)  # gangs the forecast was asked about
    planned_starts: int = 0  # gangs planned that started
    planned_right: int = 0  # ... on nodes that were all planned
    warmed: set[str] = field(default_factory=set)  # datasets `warm` has asked every node to copy

    remote_bytes: float = 0.0  # read from the source past the cache (no cache, or no room in it)
    later_epoch_bytes: float = 0.0  # ... of those, in a job's second and later epochs
    group: CacheGroup | None = None  # `distributed`: the cache group
    ready: np.ndarray | None = None  # `distributed`: the nodes up, as last seen

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown data-cache mode {self.mode!r} ({', '.join(MODES)})")

    def cluster(self, nodes: Sequence[Node]) -> Sequence[Node]:
        """`distributed`: the nodes with the group's members labelled as cache nodes (the driver's
        view, `distcache.with_mount`); the per-node modes leave them as they are."""
        return with_mount(nodes, self.spec.distributed.group) if self.mode == "distributed" else nodes

    def workload(self, w: Workload) -> Workload:
        """`distributed`: a job reading a dataset reads it through the cache's mount, so the core
        keeps it on the members and near the chunks; the per-node modes leave it as it is."""
        return reading_distributed(w) if self.mode == "distributed" else w

    def attach(self, snap: Snapshot) -> None:
        self.nodes = [NodeCache(self.spec.capacity_gb * 1e9) for _ in snap.nodes]
        if self.mode == "distributed":
            self.group = CacheGroup(self.spec, group_members(snap.nodes, self.spec.distributed.group))

    # ------------------------------------------------------------------ the job's side
    def epochs(self, job: JobSpec) -> float:
        samples = self.spec.samples.get(job.dataset, self.spec.samples.get(_base(job.dataset), 0))
        m = _BATCH.search(job.model or "")
        if samples and m and job.iterations:
            return max(1.0, job.iterations * int(m.group(1)) / samples)
        return self.spec.epochs

    def start(self, snap: Snapshot, job: JobSpec, nodes: list[int], now: float) -> float:
        """The job starts on `nodes`: seconds it waits on input over its run."""
        size = self.sizes.get(job.dataset, 0.0)
        if not job.dataset or size <= 0 or not nodes:
            return 0.0
        self.advance(snap, now)
        sp = self.spec
        epochs = self.epochs(job)
        epoch_s = job.duration / epochs
        shard = size / len(nodes)
        # a node's link to remote storage is shared by the jobs on it: each GPU gets its part
        per_node = max(1, round(job.gpu_amount / len(nodes)))
        gpus = max(1, int(snap.cluster.gpu_count.max(initial=1)))
        read = sp.read_gbps * 1e9 * min(1.0, per_node / gpus)
        cold = epochs * max(0.0, shard * 8 / read - epoch_s)
        self.starts += 1
        if job.name in self.planned:
            self.planned_starts += 1
            self.planned_right += int(set(nodes) <= self.planned.pop(job.name))
        if self.mode == "none":
            self._read_remote(size, epochs)
            return cold
        if self.group is not None:
            return self._start_group(snap, job.dataset, size, nodes, now, epochs, epoch_s, read, cold)
        missing = max(size - self.nodes[i].cached.get(job.dataset, 0.0) for i in nodes)
        self.warm_starts += int(missing <= 0)
        copy = missing * 8 / (sp.stage_gbps * 1e9)
        warm = epochs * max(0.0, shard * 8 / (sp.nvme_gbps * 1e9) - epoch_s)
        fits = True
        for i in nodes:
            nc = self.nodes[i]
            nc.in_use[job.dataset] = nc.in_use.get(job.dataset, 0) + 1
            if job.dataset in nc.queue:
                nc.queue.remove(job.dataset)
            have = nc.cached.get(job.dataset, 0.0)
            if have < size and nc.make_room(size - have, job.dataset):
                self.staged_bytes += size - have
                nc.cached[job.dataset] = size
            fits = fits and nc.cached.get(job.dataset, 0.0) >= size
            nc.touch(job.dataset)
            snap.set_cached(job.dataset, i, int(nc.cached.get(job.dataset, 0.0)))
        if not fits:  # a node cannot hold a whole copy (the agent's rule): every epoch from the source
            self._read_remote(size, epochs)
            return cold
        # wait for the copy, or start now and read cold (read-through: those reads are the copy)
        return min(cold, copy + warm)

    def _start_group(
        self,
        snap: Snapshot,
        ds: str,
        size: float,
        nodes: list[int],
        now: float,
        epochs: float,
        epoch_s: float,
        read: float,
        cold: float,
    ) -> float:
        """`distributed`: the group fetches what it lacks once; the job reads from the members."""
        assert self.group is not None
        g = self.group
        before = g.fetched_bytes
        fetch = g.fetch(ds, size, now)
        self.staged_bytes += g.fetched_bytes - before
        self.warm_starts += int(fetch <= 0 and g.cached_fraction(ds, size) >= 1.0)
        self._read_remote(size * (1.0 - g.cached_fraction(ds, size)), epochs)
        self._publish(snap)
        warm = epochs * max(0.0, g.epoch_read_s(ds, size, nodes, read / 8) - epoch_s)
        return min(cold, fetch + warm)

    def _read_remote(self, per_epoch: float, epochs: float) -> None:
        """Bytes a job reads from the source past the cache: the first epoch's, and the later ones'."""
        self.remote_bytes += per_epoch * epochs
        self.later_epoch_bytes += per_epoch * max(0.0, epochs - 1.0)

    def _publish(self, snap: Snapshot) -> None:
        """The core learns the group's bytes per node of the datasets that changed, as the driver
        reads them from `status.distributed.servers` (between cycles: a job's start, a node's fault)."""
        assert self.group is not None
        for ds in sorted(self.group.changed):
            set_distcache_bytes(snap, ds, self.group.bytes_per_node(ds, len(snap.nodes)))
        self.group.changed.clear()

    def egress_bytes(self) -> float:
        """Everything fetched from the source: copies into caches and reads past them."""
        return self.staged_bytes + self.remote_bytes

    def stop(self, job: JobSpec, nodes: list[int]) -> None:
        if not job.dataset or self.mode == "none":
            return
        if self.group is not None:
            self.group.stop(job.dataset)
            return
        for i in nodes:
            nc = self.nodes[i]
            if nc.in_use.get(job.dataset):
                nc.in_use[job.dataset] -= 1

    # ------------------------------------------------------------------ staging ahead
    def arrive(self, job: JobSpec) -> None:
        """`warm`: the first job with a dataset that is slow to copy has every node copy it."""
        ds = job.dataset
        if self.mode != "warm" or not ds or ds in self.warmed:
            return
        if self.sizes.get(ds, 0.0) <= self.spec.min_copy_s * self.spec.stage_gbps * 1e9 / 8:
            return
        self.warmed.add(ds)
        for nc in self.nodes:
            if ds not in nc.cached:
                nc.warm.append(ds)

    def advance(self, snap: Snapshot, now: float) -> None:
        """Staging ahead moves on: each node copies its queue in order at `stage_gbps`."""
        dt = now - self.last
        self.last = now
        if self.group is not None:
            self._members(snap)
        if dt <= 0 or self.mode not in ("ahead", "warm"):
            return
        rate = self.spec.stage_gbps * 1e9 / 8
        for i, nc in enumerate(self.nodes):
            budget = dt * rate
            while nc.queue and budget > 0:
                ds = nc.queue[0]
                size = self.sizes.get(ds, 0.0)
                have = nc.cached.get(ds, 0.0)
                step = min(budget, size - have)
                if step > 0 and not nc.make_room(step, ds):
                    nc.queue.pop(0)  # no room: the copy waits for the job to start here
                    continue
                nc.cached[ds] = have + step
                nc.touch(ds)
                self.staged_bytes += step
                budget -= step
                snap.set_cached(ds, i, int(nc.cached[ds]))
                if nc.cached[ds] >= size:
                    nc.queue.pop(0)
            if budget > 0 and nc.warm:
                self._warm(snap, i, nc, budget)

    def _members(self, snap: Snapshot) -> None:
        """`distributed`: a node that went down is lost to the group with its NVMe; back, it rejoins."""
        assert self.group is not None
        ready = snap.cluster.node_ready
        if self.ready is not None and np.array_equal(ready, self.ready):
            return
        for i in self.group.members:
            if not ready[i]:
                self.group.lose(i)
            else:
                self.group.rejoin(i)
        self.ready = ready.copy()
        self._publish(snap)

    def _warm(self, snap: Snapshot, i: int, nc: NodeCache, budget: float) -> float:
        """Copy `warm` datasets into free space only, in order; the budget left."""
        while nc.warm and budget > 0:
            ds = nc.warm[0]
            size = self.sizes.get(ds, 0.0)
            have = nc.cached.get(ds, 0.0)
            step = min(budget, size - have, nc.free())
            if step <= 0:
                nc.warm.pop(0)  # copied already (a job started here), or no free room for it
                continue
            nc.cached[ds] = have + step
            self.staged_bytes += step
            budget -= step
            snap.set_cached(ds, i, int(nc.cached[ds]))
            if nc.cached[ds] >= size:
                nc.warm.pop(0)
        return budget

    def plan(
        self, snap: Snapshot, profile: Profile, now: float, runtime_of: RuntimeOf = estimated_runtime
    ) -> None:
        """Ask the nodes the forecast gives the first waiting gangs to stage their datasets."""
        if self.mode != "ahead":
            return
        # only datasets whose copy takes a while: a small one is copied at the start in no time
        slow = self.spec.min_copy_s * self.spec.stage_gbps * 1e9 / 8
        waiting = [
            e.name
            for e in snap.pending_workloads()
            if not e.is_ready
            and any(self.sizes.get(ps.request.dataset, 0.0) > slow for ps in e.workload.podsets)
        ][: self.spec.plan_gangs]
        # at the interval, and as soon as a gang that needs staging starts to wait
        due = now - self.last_plan >= self.spec.plan_every_s
        if not waiting or not (due or any(n not in self.considered for n in waiting)):
            return
        self.considered.update(waiting)
        self.last_plan = now
        self.advance(snap, now)
        f = forecast(snap, profile, now, runtime_of, targets=set(waiting), max_steps=self.spec.plan_steps)
        for name in waiting:
            start = f.starts.get(name)
            if start is None or start - now > self.spec.horizon_s:
                continue
            ds = next(
                ps.request.dataset for ps in snap.workloads[name].workload.podsets if ps.request.dataset
            )
            size = self.sizes.get(ds, 0.0)
            self.planned.setdefault(name, set()).update(f.nodes.get(name, []))
            for i in f.nodes.get(name, []):
                nc = self.nodes[i]
                if nc.cached.get(ds, 0.0) < size and ds not in nc.queue:
                    nc.queue.append(ds)


def dataset_sizes(jobs: list[JobSpec], spec: IoSpec) -> dict[str, float]:
    """Bytes of each dataset the jobs read: the trace's size, else the runtime model's table."""
    out: dict[str, float] = {}
    for j in jobs:
        if not j.dataset:
            continue
        table = spec.dataset_gb.get(j.dataset, spec.dataset_gb.get(_base(j.dataset), 0.0))
        size = float(j.dataset_bytes) if j.dataset_bytes else table * 1e9
        out[j.dataset] = max(out.get(j.dataset, 0.0), size)
    return out


def _base(dataset: str) -> str:
    """`team-a/imagenet` -> `imagenet`: a copy of a known dataset under another name."""
    return dataset.rsplit("/", 1)[-1]
