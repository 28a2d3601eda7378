"""The twin's distributed data cache: datasets striped over a cache group of nodes' NVMe.

Per-node copies (`first-use`) put the whole dataset on each node a job runs on: a dataset larger
than one node's cache is never cached, and a 16-node gang fetches it 16 times. A platform that runs
Fluid with Alluxio or JuiceFS (or SeaweedFS caching a remote bucket) instead stripes the blocks over
a group of nodes and fetches each once. This models that, with `io.distributed` of runtime.yaml:

- The group: every node (`all`), the first N nodes by name (`N`), or the nodes with a label
  (`key=value`). Its room is the sum of its up members' caches; a dataset holds `replicas` x its
  cached bytes, spread evenly over the up members.
- Fetch: a job that starts on a dataset the group lacks has the group fetch the missing bytes once
  from the source, at min(`source_gbps`, members x `stage_gbps`); extra replicas are copied between
  peers at `nic_gbps` meanwhile. A job that starts while a fetch runs waits for its end. Room is made
  by evicting the least recently used datasets no running job reads; what still does not fit stays
  uncached and is read from the source every epoch (Alluxio and JuiceFS read through what they
  cannot keep).
- Read: each of a job's k nodes reads size / k per epoch. Of the cached part, replicas / members is
  on its own NVMe and the rest comes from peers over its NIC; a node outside the group reads all of
  it over the network from the members, as a Fluid FUSE client on any node does. The members' NVMe
  and NICs serve size / members each. The paths run in parallel: an epoch's read takes the longest.
- Placement, as on Kubernetes: the members carry the label the driver reads
  (`phalanx.io/distcache=true`, `Node.distcache_mount`), a job reading a dataset is a pod with
  the cache's mount (`TaskRequest.dataset_distributed`), and the core is told the bytes each member
  holds (`plugins.locality.set_distcache_bytes`) as the driver reads them from the Dataset's
  `status.distributed.servers`: the same filter, score and gang planner decide.
- A member lost (its node fails): with 2 or more replicas no data is lost (its blocks are copied
  again from the other replicas, counted, and taken as done before the next loss); with 1 its stripe
  of each dataset is gone and fetched again by the next job that starts on it. The node comes back
  empty (its NVMe wiped, the fault of issue 33), and blocks are taken as spread evenly again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from phalanx.core.errors import SpecError
from phalanx.core.model import Node, Workload
from phalanx.sim.runtime import IoSpec

_WHERE = "runtime.yaml: io.distributed.group"
# the node label of the cache nodes, as the Kubernetes driver reads it (docs/datasets.md, "Placement
# by the distributed cache"); `phalanx.k8s.keys.DISTCACHE_NODE`, which the twin does not import
MOUNT_LABEL = "phalanx.io/distcache"


def group_members(nodes: Sequence[Node], group: str) -> list[int]:
    """The node indices of the cache group `group` names (all, a count, or a label key=value)."""
    if group == "all":
        return list(range(len(nodes)))
    if group.isdigit():
        n = int(group)
        if n > len(nodes):
            raise SpecError(_WHERE, f"{n} nodes asked, the cluster has {len(nodes)}")
        return sorted(sorted(range(len(nodes)), key=lambda i: nodes[i].name)[:n])
    key, _, value = group.partition("=")
    out = [i for i, nd in enumerate(nodes) if nd.labels.get(key.strip()) == value.strip()]
    if not out:
        raise SpecError(_WHERE, f"no node has the label {group}")
    return out


def with_mount(nodes: Sequence[Node], group: str) -> list[Node]:
    """The cluster as the driver would read it: the group's members labelled `MOUNT_LABEL=true`
    and running the mount (`distcache_mount`), the other nodes not. A node labelled so outside the
    group is refused: the twin would store nothing there, the driver would place readers on it."""
    members = set(group_members(nodes, group))
    out = []
    for i, n in enumerate(nodes):
        if i in members:
            out.append(replace(n, labels={**n.labels, MOUNT_LABEL: "true"}, distcache_mount=True))
            continue
        if n.labels.get(MOUNT_LABEL) == "true" or n.distcache_mount:
            raise SpecError(
                _WHERE,
                f"node {n.name} is labelled {MOUNT_LABEL}=true but is not in the cache group {group!r}; "
                f"name the group by that label ({MOUNT_LABEL}=true) or take the label off",
            )
        out.append(n)
    return out


def reading_distributed(w: Workload) -> Workload:
    """`w` with every pod set that reads a dataset reading it through the cache's mount, as a pod
    the webhook gave the distributed cache's volume (`TaskRequest.dataset_distributed`)."""
    if not any(ps.request.dataset for ps in w.podsets):
        return w
    sets = tuple(
        replace(ps, request=replace(ps.request, dataset_distributed=True)) if ps.request.dataset else ps
        for ps in w.podsets
    )
    return replace(w, podsets=sets)


@dataclass
class Held:
    """One dataset in the group: unique bytes cached, when its fetch ends, running readers."""

    cached: float = 0.0
    ready_at: float = 0.0
    in_use: int = 0


@dataclass
class CacheGroup:
    io: IoSpec
    members: list[int]
    up: set[int] = field(default_factory=set)
    held: OrderedDict[str, Held] = field(default_factory=OrderedDict)  # least recently used first
    fetched_bytes: float = 0.0  # from the source
    recopied_bytes: float = 0.0  # between peers, after a member was lost
    changed: set[str] = field(default_factory=set)  # datasets whose bytes per node changed

    def __post_init__(self) -> None:
        self.up = set(self.members) if not self.up else self.up

    # ------------------------------------------------------------------ room
    def replicas(self) -> int:
        return max(1, min(self.io.distributed.replicas, len(self.up)))

    def capacity(self) -> float:
        return len(self.up) * self.io.capacity_gb * 1e9

    def used(self) -> float:
        return sum(h.cached for h in self.held.values()) * self.replicas()

    def stored_on(self, node: int, ds: str) -> float:
        """Bytes of `ds` on `node`'s NVMe (blocks spread evenly over the up members)."""
        h = self.held.get(ds)
        if h is None or node not in self.up:
            return 0.0
        return h.cached * self.replicas() / len(self.up)

    def bytes_per_node(self, ds: str, nodes: int) -> list[int]:
        """Whole bytes of `ds` on each of `nodes` nodes (0 off the group): what `phalanx distcache`
        would write into the Dataset's `status.distributed.servers`, one server per member."""
        out = [0] * nodes
        for i in self.members:
            out[i] = int(self.stored_on(i, ds))
        return out

    def _fit(self, keep: str, want: float) -> float:
        """Make room for `want` unique bytes of `keep` (LRU, never a dataset being read); what fits."""
        r = self.replicas()
        have = self.held[keep].cached if keep in self.held else 0.0
        while self.capacity() - (self.used() - have * r) < want * r:
            victim = next((d for d, h in self.held.items() if d != keep and not h.in_use), None)
            if victim is None:
                break
            del self.held[victim]
            self.changed.add(victim)
        return max(have, min(want, (self.capacity() - (self.used() - have * r)) / r))

    # ------------------------------------------------------------------ a job's side
    def fetch(self, ds: str, size: float, now: float) -> float:
        """A job starts on `ds`: the group fetches what it lacks; seconds until it is cached."""
        h = self.held.setdefault(ds, Held(ready_at=now))
        self.held.move_to_end(ds)
        h.in_use += 1
        target = self._fit(ds, size) if self.up else 0.0
        missing = target - h.cached
        if missing > 0:
            sp = self.io.distributed
            rate = min(sp.source_gbps, len(self.up) * self.io.stage_gbps) * 1e9 / 8
            seconds = missing / rate
            if self.replicas() > 1:  # the other replicas, from peer to peer
                seconds = max(
                    seconds, (self.replicas() - 1) * missing / len(self.up) * 8 / (sp.nic_gbps * 1e9)
                )
            h.ready_at = max(now, h.ready_at) + seconds
            h.cached = target
            self.fetched_bytes += missing
            self.changed.add(ds)
        return max(0.0, h.ready_at - now)

    def cached_fraction(self, ds: str, size: float) -> float:
        h = self.held.get(ds)
        return min(1.0, h.cached / size) if h is not None and size > 0 else 0.0

    def epoch_read_s(self, ds: str, size: float, nodes: Sequence[int], source_bps: float) -> float:
        """Seconds one epoch's reads take on `nodes` (each reads size / k), the slowest path."""
        f = self.cached_fraction(ds, size)
        g = len(self.up)
        nvme = self.io.nvme_gbps * 1e9 / 8
        nic = self.io.distributed.nic_gbps * 1e9 / 8
        shard = size / len(nodes)
        worst = shard * (1 - f) / source_bps  # what the group could not keep, from the source
        if g and f > 0:
            local = self.replicas() / g
            served = size * f / g  # each member's share of the job's cached reads
            worst = max(worst, served / nvme, served * (1 - local) / nic)
            for i in set(nodes):
                mine = local if i in self.up else 0.0
                worst = max(worst, shard * f * mine / nvme, shard * f * (1 - mine) / nic)
        return worst

    def stop(self, ds: str) -> None:
        h = self.held.get(ds)
        if h is not None and h.in_use:
            h.in_use -= 1

    # ------------------------------------------------------------------ members
    def lose(self, node: int) -> None:
        """A member is lost with its NVMe: a replica covers it, or its stripes are gone."""
        if node not in self.up:
            return
        g, r = len(self.up), self.replicas()
        self.up.discard(node)
        for ds, h in self.held.items():
            if r >= 2:
                self.recopied_bytes += h.cached * r / g
            else:
                h.cached -= h.cached / g
            self.changed.add(ds)
        self._shrink()

    def rejoin(self, node: int) -> None:
        if node in self.members and node not in self.up:
            self.up.add(node)
            self.changed.update(self.held)

    def _shrink(self) -> None:
        """Fewer members hold less: evict (LRU, not in use), then trim what is being read."""
        for ds in [d for d, h in self.held.items() if not h.in_use]:
            if self.used() <= self.capacity():
                return
            del self.held[ds]
            self.changed.add(ds)
        for ds, h in self.held.items():
            over = self.used() - self.capacity()
            if over <= 0:
                return
            h.cached = max(0.0, h.cached - over / self.replicas())
            self.changed.add(ds)
