"""Consolidate: when a gang waits only because free capacity is scattered, move restartable tasks.

A pending gang whose requests the free capacity could hold in total (so it waits on
fragmentation, not capacity) gets a node freed for each task that does not fit: movable
tasks there (preemptible single-task workloads, or an elastic workload's optional tasks,
running for at least `min_runtime`) are evicted and placed elsewhere. Only if every moved
task finds a new place and the gang then fits is anything committed. At most `max_moves`
moves per cycle.
"""

from __future__ import annotations

import numpy as np

from phalanx.actions.gang import gang_tasks, upper_bound
from phalanx.core.feasibility import find_candidates
from phalanx.core.model import MILLI, Task
from phalanx.core.session import Session
from phalanx.core.snapshot import Allocation, WorkloadEntry
from phalanx.core.statement import Statement


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

    def movable(self, session: Session, a: Allocation, gang: str) -> bool:
        entry = session.snapshot.workloads[a.task.workload]
        w = entry.workload
        if entry.name == gang or not w.preemptible or session.clock - a.since < self.min_runtime:
            return False
        return len(entry.tasks) == 1 or len(entry.bound) > w.gang_size

    def execute(self, session: Session) -> None:
        moves = attempts = 0
        self._room = None
        failed: set[object] = set()  # demands that found no way this cycle: their likes will not either
        fragmented: dict[object, bool] = {}  # per demand, until something moves
        for entry in session.ordered_pending():
            if moves >= self.max_moves or attempts >= self.max_attempts:
                return
            key = entry.demand_key
            if entry.name not in session.pending or entry.bound or key in failed:
                continue
            gang, _ = gang_tasks(entry)
            if not gang:
                continue
            if key not in fragmented:
                # short of capacity rather than fragmented, or it fits as is: nothing to do
                fragmented[key] = self.enough_in_total(session, gang) and upper_bound(session, gang) < len(
                    gang
                )
            if not fragmented[key]:
                continue
            if session.admit(entry, gang) is not None:
                continue
            attempts += 1
            used = self.consolidate(session, entry, gang, self.max_moves - moves)
            if used:
                moves += used
                self._room = None
                fragmented.clear()
                session.pending.pop(entry.name, None)
            else:
                failed.add(entry.demand_key)

    def enough_in_total(self, session: Session, gang: list[Task]) -> bool:
        """The free capacity, summed over the nodes the gang may use, would hold it."""
        s = session.snapshot
        c = s.cluster
        reqs = [session.effective(t.request) for t in gang]
        ok = np.asarray(c.node_ready, dtype=np.bool_)
        for r in reqs:
            ok = ok & s.static_mask(r)
        gpus = sum(r.gpu.devices for r in reqs if r.gpu.total_milli >= MILLI)
        return (
            int(c.gpu_whole_free[ok].sum()) >= gpus
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

    def room(self, session: Session) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per node: movable tasks, and the whole GPUs, CPU and memory they would free."""
        if self._room is None:
            s = session.snapshot
            n = len(s.cluster)
            count = np.zeros(n, dtype=np.int64)
            gpus = np.zeros(n, dtype=np.int64)
            cpu = np.zeros(n, dtype=np.int64)
            mem = np.zeros(n, dtype=np.int64)
            for a in s.allocations.values():
                if self.movable(session, a, ""):
                    i = a.node
                    count[i] += 1
                    gpus[i] += len(a.devices.gpus) if a.devices.milli >= MILLI else 0
                    cpu[i] += a.cpu_milli
                    mem[i] += a.memory_mib
            self._room = (count, gpus, cpu, mem)
        return self._room

    def target_nodes(self, session: Session, gang: str, task: Task, taken: np.ndarray) -> list[int]:
        """Nodes where moving out movable tasks would make room, fewest moves first."""
        s = session.snapshot
        c = s.cluster
        req = session.effective(task.request)
        need = req.gpu.devices if req.gpu.total_milli >= MILLI else 1
        count, gpus, cpu, mem = self.room(session)
        ok = (
            ~taken
            & c.node_ready
            & s.static_mask(req)
            & (count > 0)
            & (c.gpu_whole_free + gpus >= need)
            & (c.cpu_free + cpu >= req.cpu_milli)
            & (c.mem_free + mem >= req.memory_mib)
        )
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
        movers = sorted(
            (a for a in s.on_node[i].values() if self.movable(session, a, gang)),
            key=lambda a: (a.devices.milli * len(a.devices.gpus), a.cpu_milli, a.task.name),
        )
        evicted: list[Allocation] = []
        for a in movers:
            if len(find_candidates(s, session.effective(task.request), here)):
                break
            if len(evicted) >= budget:
                stmt.rollback(start)
                return None
            stmt.evict(a, f"moved to make room for {gang}")
            evicted.append(a)
        elsewhere = ~(here | taken)
        for a in evicted:
            if session.place(a.task, stmt, elsewhere) is None:
                stmt.rollback(start)
                return None
        if session.place(task, stmt, here) is None:
            stmt.rollback(start)
            return None
        return len(evicted)
