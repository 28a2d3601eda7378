"""Consolidate: when a gang waits only because free capacity is scattered, move restartable tasks.

A pending gang whose requests the free capacity could hold in total (so it waits on
fragmentation, not capacity) gets a node freed for each task that does not fit: movable
tasks there (preemptible single-task workloads, or an elastic workload's optional tasks,
running for at least `min_runtime`) are evicted and placed elsewhere. Only if every moved
task finds a new place and the gang then fits is anything committed. At most `max_moves`
moves per cycle.

Free capacity counts only on nodes some task of the try may use: a node a filter refuses
outright (`NodeBound`, e.g. one reserved for a large gang) both to the gang and to every
movable task can take nobody in the try, however much it has free. A gang short of room
elsewhere is then known to fail without the try (its evictions and their undoing), and it
counts as a failed try, so the same gangs are tried as before. Only where the sums are exact
(whole GPUs and shares by milli, no memory-sized or MIG-served shares) and the profile breaks
ties by name (a skipped try draws no random numbers).
"""

from __future__ import annotations

import numpy as np

from phalanx.actions.evict import lost_work
from phalanx.actions.gang import gang_tasks, refused
from phalanx.core.cluster import DeviceAssignment
from phalanx.core.feasibility import may_host
from phalanx.core.model import MIG_BACKEND, MILLI, GpuKind, Task, TaskRequest
from phalanx.core.session import Session
from phalanx.core.snapshot import Allocation, Snapshot, WorkloadEntry
from phalanx.core.statement import Statement
from phalanx.core.traits import node_bounds


class Consolidate:
    name = "consolidate"

    def __init__(
        self, max_moves: int = 8, min_runtime: float = 0.0, max_nodes: int = 8, max_attempts: int = 8
    ) -> None:
        self.max_moves = max_moves
        self.min_runtime = min_runtime
        self.max_nodes = max_nodes
        self.max_attempts = max_attempts
        self._room: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._shut: np.ndarray | None = None  # nodes refused to every movable task; with `_room`

    def movable(self, session: Session, a: Allocation, gang: str) -> bool:
        if session.clock - a.since < self.min_runtime:  # first: the cheapest, and often so
            return False
        entry = session.snapshot.workloads[a.task.workload]
        w = entry.workload
        name = w.name
        if name == gang or not w.preemptible:
            return False
        if name in session.streamed:  # handed out earlier in the cycle: its binds are final
            return False
        if w.subgroups or w.preempt_whole:  # moved, a task could leave its subgroup's domain; or
            return False  # its workload is disrupted only whole (disruptionMode: PodGroup)
        return len(entry.tasks) == 1 or len(entry.bound) > w.gang_size

    def execute(self, session: Session) -> None:
        moves = attempts = 0
        self._room = self._shut = None
        failed: set[object] = set()  # demands that found no way this cycle: their likes will not either
        fragmented: dict[object, bool] = {}  # per demand, until something moves
        for entry in session.ordered_pending():
            if moves >= self.max_moves or attempts >= self.max_attempts:
                return
            key = entry.demand_key
            if entry.name not in session.pending or entry.bound or key in failed:
                continue
            if not entry.workload.preempts:  # preemptionPolicy Never: moves nobody to be placed
                continue
            gang, _ = gang_tasks(entry)
            if not gang:
                continue
            if key not in fragmented:
                # short of capacity rather than fragmented: nothing to do (allocate found no room)
                fragmented[key] = self.enough_in_total(session, gang)
            if not fragmented[key]:
                continue
            if session.admit(entry, gang) is not None:
                continue
            attempts += 1
            # known to fail (counted as tried, so that the same gangs get tries as without the look)
            used = (
                self.consolidate(session, entry, gang, self.max_moves - moves)
                if self.may_fit(session, gang)
                else 0
            )
            if used:
                moves += used
                self._room = self._shut = None
                fragmented.clear()
                session.pending.pop(entry.name, None)
            else:
                failed.add(entry.demand_key)

    def enough_in_total(self, session: Session, gang: list[Task]) -> bool:
        """The free capacity, summed over the nodes the gang may use, would hold it."""
        s = session.snapshot
        ok = np.asarray(s.cluster.node_ready, dtype=np.bool_)
        reqs = [session.effective(t.request) for t in gang]
        for r in {id(r): r for r in reqs}.values():  # a gang's tasks mostly share one request
            ok = ok & s.static_mask(r)
        return self.holds(session, reqs, ok)

    @staticmethod
    def holds(session: Session, reqs: list[TaskRequest], ok: np.ndarray) -> bool:
        """The free capacity summed over the nodes `ok` would hold `reqs`."""
        c = session.snapshot.cluster
        milli = sum(r.gpu.total_milli for r in reqs)  # shares can be moved together to free whole GPUs
        return (
            int(c.gpu_free_total[ok].sum()) >= milli
            and int(c.cpu_free[ok].sum()) >= sum(r.cpu_milli for r in reqs)
            and int(c.mem_free[ok].sum()) >= sum(r.memory_mib for r in reqs)
        )

    def consolidate(self, session: Session, entry: WorkloadEntry, gang: list[Task], budget: int) -> int:
        s = session.snapshot
        n = len(s.cluster)
        stmt = session.statement()
        targets = np.zeros(n, dtype=np.bool_)
        used = 0
        for task in gang:
            if session.place(task, stmt) is not None:
                continue
            done = False
            for i in self.target_nodes(session, entry.name, task, targets):
                moved = self.free_node(session, stmt, i, entry.name, task, targets, budget - used)
                if moved is not None:
                    used += moved
                    targets[i] = True
                    done = True
                    break
            if not done:
                stmt.discard()
                return 0
        if used == 0:
            stmt.discard()
            return 0
        stmt.commit()
        return used

    def may_fit(self, session: Session, gang: list[Task]) -> bool:
        """False when the try is bound to fail: the capacity free where someone in it may go is short.

        A try places the gang's tasks and moves tasks from node to node, each through the
        profile's filters. A node refused outright to all of them gains no task; every placement
        takes from the free capacity of the others, and a moved task's GPUs freed there are
        taken again where it goes. So those others must hold the gang in total.
        """
        if session.profile.tie_break != "name":  # a skipped try draws no random numbers: later draws differ
            return True
        if not all(exact_charge(session.effective(t.request)) for t in gang):
            return True
        shut = self.shut(session)
        for t in unlike(gang):
            if not shut.any():
                return True
            out = refused(session, t)
            shut = shut & out if out is not None else np.zeros_like(shut)
        if not shut.any():
            return True
        # every node that is not shut, not only the gang's: a task moved off one of the gang's
        # nodes may go to a node the gang may not use
        live = np.asarray(session.snapshot.cluster.node_ready, dtype=np.bool_) & ~shut
        return self.holds(session, [session.effective(t.request) for t in gang], live)

    def shut(self, session: Session) -> np.ndarray:
        """Nodes a filter refuses outright to every movable task (all of them when none is movable)."""
        if self._shut is None:
            s = session.snapshot
            shut = np.ones(len(s.cluster), dtype=np.bool_)
            seen: dict[tuple[int, ...], list[np.ndarray | None]] = {}  # kept, so that no id is reused
            bounds = node_bounds(session.profile.filters)
            exact: dict[int, bool] = {}  # per request object (each held by an allocation meanwhile)
            for a in s.allocations.values():
                if not self.movable(session, a, ""):
                    continue
                req = a.task.request
                kind = req.gpu.kind
                if kind is GpuKind.WHOLE or kind is GpuKind.NONE:  # `effective` leaves these as they are
                    ok = exact_charge(req)
                else:
                    had = exact.get(id(req))
                    if had is None:
                        had = exact[id(req)] = exact_charge(session.effective(req))
                    ok = had
                if not ok:
                    shut[:] = False  # moved, it may take more or less than it frees: no skip
                    break
                out = [f.excluded(session, a.task) for f in bounds]
                key = tuple(id(x) for x in out)  # the filters mostly hand every task one shared mask
                if key in seen:
                    continue
                seen[key] = out
                shut &= union(len(s.cluster), out)
                if not shut.any():
                    break
            self._shut = shut
        return self._shut

    def room(self, session: Session) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per node: movable tasks, GPU milli they hold per device, and the CPU and memory they would free."""
        if self._room is None:
            s = session.snapshot
            c = s.cluster
            n = len(c)
            count = np.zeros(n, dtype=np.int64)
            milli = np.zeros((n, c.max_gpus), dtype=np.int64)
            cpu = np.zeros(n, dtype=np.int64)
            mem = np.zeros(n, dtype=np.int64)
            for a in s.allocations.values():
                if self.movable(session, a, ""):
                    i = a.node
                    count[i] += 1
                    for d in a.devices.gpus:
                        milli[i, d] += device_milli(a.devices)
                    cpu[i] += a.cpu_milli
                    mem[i] += a.memory_mib
            self._room = (count, milli, cpu, mem)
        return self._room

    def target_nodes(self, session: Session, gang: str, task: Task, taken: np.ndarray) -> list[int]:
        """Nodes where moving out movable tasks would make room, fewest movable tasks first.

        GPU room is counted per device: a share needs one GPU whose free plus movable milli
        reaches it, whole GPUs need that many devices that would be wholly free.
        """
        s = session.snapshot
        c = s.cluster
        req = session.effective(task.request)
        count, milli, cpu, mem = self.room(session)
        ok = (
            ~taken
            & c.node_ready
            & s.static_mask(req)
            & (count > 0)
            & (c.cpu_free + cpu >= req.cpu_milli)
            & (c.mem_free + mem >= req.memory_mib)
        )
        if req.gpu.kind is not GpuKind.NONE:
            need, per = gpu_need(req)
            ok &= ((c.gpu_milli_free + milli) >= per).sum(axis=1) >= need
        idx = np.nonzero(ok)[0]
        if not len(idx):
            return []
        order = np.lexsort((s.node_rank[idx], count[idx]))[: self.max_nodes]
        return [int(i) for i in idx[order]]

    def free_node(
        self, session: Session, stmt: Statement, i: int, gang: str, task: Task, taken: np.ndarray, budget: int
    ) -> int | None:
        """Evict movable tasks from node i until `task` fits, move them elsewhere; None if that fails."""
        s = session.snapshot
        start = stmt.checkpoint()
        here = np.zeros(len(s.cluster), dtype=np.bool_)
        here[i] = True
        req = session.effective(task.request)
        # one of the task's own shape would need the room it leaves: moving it gains nothing
        shape = req.shape_key
        movers = [
            a
            for a in s.on_node[i].values()
            if self.movable(session, a, gang) and session.effective(a.task.request).shape_key != shape
        ]
        evicted: list[Allocation] = []
        for a in self.eviction_order(s, i, req, movers):
            # the scalar look first: most moves leave the node still short, and then no filter runs
            if may_host(s, req, i) and len(session.candidates(task, here).candidates):
                break
            if len(evicted) >= budget:
                stmt.rollback(start)
                return None
            # a move restarts the task: its work since the last checkpoint counts in GPU-hour budgets
            lost = lost_work(session, s.workloads[a.task.workload], (a,))
            stmt.evict(a, f"moved to make room for {gang}", gang, lost)
            evicted.append(a)
        elsewhere = ~(here | taken)
        # the largest first, as a packer would: small ones fit into what is left
        for a in sorted(evicted, key=lambda a: (-held_milli(a), a.task.name)):
            if session.place(a.task, stmt, elsewhere) is None:
                stmt.rollback(start)
                return None
        if session.place(task, stmt, here) is None:
            stmt.rollback(start)
            return None
        return len(evicted)

    @staticmethod
    def eviction_order(s: Snapshot, i: int, req: TaskRequest, movers: list[Allocation]) -> list[Allocation]:
        """Movers on the GPUs needing the fewest evictions to take `req` first, then the rest, smallest first.

        Evicting from the devices nearest to fitting (largest movers first within a device)
        keeps the number of moves low; what remains only matters for CPU and memory.
        """
        rest = sorted(movers, key=lambda a: (held_milli(a), a.cpu_milli, a.task.name))
        if req.gpu.kind is GpuKind.NONE:
            return rest
        need, per = gpu_need(req)
        c = s.cluster
        # a GPU with room already did not take the task: unless CPU or memory is what is short,
        # its profile's filters kept it off (say, an untouched GPU kept for whole-GPU tasks)
        short = bool(c.cpu_free[i] < req.cpu_milli or c.mem_free[i] < req.memory_mib)
        plans: list[tuple[int, int, list[Allocation]]] = []
        free_row: list[int] = c.gpu_milli_free[i].tolist()  # one conversion, not a numpy scalar per GPU
        for d in range(int(c.gpu_count[i])):
            on = sorted(
                (a for a in movers if d in a.devices.gpus),
                key=lambda a: (-device_milli(a.devices), a.task.name),
            )
            free = free_row[d]
            chosen: list[Allocation] = []
            for a in on:
                if free >= per:
                    break
                free += device_milli(a.devices)
                chosen.append(a)
            if free >= per and (chosen or short):
                plans.append((len(chosen), d, chosen))
        plans.sort(key=lambda p: (p[0], p[1]))
        # keyed by task: a mover on several GPUs may be in more than one plan
        first = {a.task.name: a for _, _, chosen in plans[:need] for a in chosen}
        return [*first.values(), *(a for a in rest if a.task.name not in first)]


def union(n: int, masks: list[np.ndarray | None]) -> np.ndarray:
    out = np.zeros(n, dtype=np.bool_)
    for m in masks:
        if m is not None:
            out |= m
    return out


def exact_charge(req: TaskRequest) -> bool:
    """A placement takes exactly the request's GPU milli from the free total wherever it goes (not so
    for a memory-sized share, charged by each GPU's memory, nor for one a MIG slice may serve)."""
    g = req.gpu
    return g.kind in (GpuKind.NONE, GpuKind.WHOLE, GpuKind.FRACTION) and MIG_BACKEND not in g.backends


def unlike(tasks: list[Task]) -> list[Task]:
    """One task per workload and request: a `NodeBound` filter refuses all such tasks the same nodes."""
    return list({(t.workload, id(t.request)): t for t in tasks}.values())


def device_milli(d: DeviceAssignment) -> int:
    """GPU milli an assignment holds on each of its GPUs (a MIG slice counts as none)."""
    return 0 if d.mig is not None else (MILLI if d.whole else d.milli)


def held_milli(a: Allocation) -> int:
    return device_milli(a.devices) * len(a.devices.gpus)


def gpu_need(req: TaskRequest) -> tuple[int, int]:
    """How many GPUs a request needs and how much of each (memory-sized shares and MIG count whole)."""
    if req.gpu.kind is GpuKind.FRACTION:
        return req.gpu.devices, req.gpu.milli
    return max(req.gpu.devices, 1), MILLI
