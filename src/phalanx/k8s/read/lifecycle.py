"""A gang's phase and members through its pods' whole life: what PodGroup status, `phalanx status`
and the dashboard all say.

Members are counted from the pods: running (bound, containers running), starting (bound, not
running yet), ended (Succeeded or Failed: members that ran), waiting (not placed), and those
the minimum still needs that do not exist yet. The phase, in the words Volcano's and KAI's
PodGroups use:

| phase | when |
|---|---|
| Pending | fewer than `minMember` members are placed or ended (waiting for room, or for pods) |
| Scheduled | `minMember` are placed or ended, not all of them running yet |
| Running | `minMember` are running or ended, and some member is left |
| Succeeded | every member ended, and no fewer than `minMember` succeeded (or none failed) |
| Failed | every member ended, some failed, and fewer than `minMember` succeeded |
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from phalanx.k8s.read.native import gang_minimum
from phalanx.k8s.read.world import World

PHASES = ("Pending", "Scheduled", "Running", "Succeeded", "Failed")


@dataclass(frozen=True)
class GangStatus:
    phase: str
    min_member: int
    running: int = 0
    starting: int = 0
    succeeded: int = 0
    failed: int = 0
    waiting: int = 0
    missing: int = 0  # not created yet

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed

    @property
    def placed(self) -> bool:
        """The gang got its minimum once: it is placed, running or done."""
        return self.phase != "Pending"

    @property
    def text(self) -> str:
        """`1 running, 1 ended (1 succeeded), 0 waiting; minMember 2`."""
        parts = [f"{self.running} running"]
        if self.starting:
            parts.append(f"{self.starting} starting")
        if self.ended:
            how = [f"{n} {what}" for n, what in ((self.succeeded, "succeeded"), (self.failed, "failed")) if n]
            parts.append(f"{self.ended} ended ({', '.join(how)})")
        parts.append(f"{self.waiting} waiting")
        if self.missing:
            parts.append(f"{self.missing} not created yet")
        return f"{', '.join(parts)}; minMember {self.min_member}"

    def counts(self) -> dict[str, int]:
        return {
            "running": self.running,
            "starting": self.starting,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "waiting": self.waiting,
        }


def gang_status(world: World, name: str, bound_now: Collection[str] = ()) -> GangStatus | None:
    """The gang `name` (a workload, or a PodGroup with no pods left or none yet); None if unknown.

    `bound_now`: pods bound by this cycle (the world was read before it).
    """
    g = world.groups.get(name)
    ended = world.ended.get(name, {})
    if g is not None:
        min_member = max(1, g.min_available)
        pods = g.pods
        missing = g.missing
    else:
        pg = world.pod_groups.get(name)
        if pg is None:
            return None
        _, raw = gang_minimum(pg)
        try:  # a gang with no pods is only shown: a minimum that does not read shows as 1
            min_member = max(1, int(raw))
        except (TypeError, ValueError):
            min_member = 1
        pods = []
        missing = max(0, min_member - sum(ended.values()))
    running = starting = waiting = 0
    for p in pods:
        if p.node or p.key in bound_now:
            if p.phase == "Running":
                running += 1
            else:
                starting += 1
        else:
            waiting += 1
    succeeded, failed = ended.get("Succeeded", 0), ended.get("Failed", 0)
    done = succeeded + failed
    if not pods and done:
        phase = "Failed" if failed and succeeded < min_member else "Succeeded"
    elif pods and running + starting + done >= min_member:
        phase = "Running" if running + done >= min_member else "Scheduled"
    else:
        phase = "Pending"
    return GangStatus(phase, min_member, running, starting, succeeded, failed, waiting, missing)


def gang_names(world: World) -> list[str]:
    """Gangs worth a row: every PodGroup object, and groups with a minimum above one or ended members."""
    names = {n for n, g in world.groups.items() if g.pod_group is not None or g.min_available > 1 or g.ended}
    return sorted(names | set(world.pod_groups))
