"""Carry out a cycle's decisions through the API: evictions, then gangs of binds.

A gang is bound in two phases. First every pod of it gets its device annotations and the
chosen node (`phalanx.io/node`); only then are the pods bound, one by one. If the scheduler
dies in between, the next one finds the chosen nodes on the pods and finishes the binds
(`World.unfinished`). A bind that answers 409 is checked: bound to the same node means an
earlier attempt got through (we never bind twice); bound elsewhere, or the pod gone, breaks
the gang, and the pods we bound are evicted so that no gang stays partly bound by us.
Conflicts, 5xx and timeouts are retried with exponential backoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from phalanx.core.decisions import Bind, CycleResult
from phalanx.k8s.api import Api, Conflict, NotFound
from phalanx.k8s.devices import ALL, encode

log = logging.getLogger("phalanx.k8s")
T = TypeVar("T")


@dataclass
class Outcome:
    bound: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)  # workload -> why its gang was undone
    deferred: list[str] = field(default_factory=list)  # binds left for the next cycle (API trouble)
    not_evicted: list[str] = field(default_factory=list)  # evictions refused (PDB) or failed


class Retry(Exception):
    """Gave up after the retries; the work stays for the next cycle."""


def split(task: str) -> tuple[str, str]:
    ns, _, name = task.partition("/")
    return ns, name


class Executor:
    def __init__(
        self, api: Api, attempts: int = 4, backoff: float = 0.1, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.api = api
        self.attempts = attempts
        self.backoff = backoff
        self.sleep = sleep

    def _retry(self, fn: Callable[[], T], conflicts: bool = False) -> T:
        """Call with backoff on 5xx, timeouts and dropped connections (and on 409 if `conflicts`)."""
        delay = self.backoff
        for k in range(self.attempts):
            try:
                return fn()
            except NotFound:
                raise
            except Conflict as e:
                if not conflicts:
                    raise
                if k == self.attempts - 1:
                    raise Retry(str(e)) from e
                self.sleep(delay)
                delay *= 2
            except Exception as e:  # 5xx, timeouts, dropped connections
                if k == self.attempts - 1:
                    raise Retry(str(e)) from e
                log.info("API call failed (%s), retrying in %.2f s", type(e).__name__, delay)
                self.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ evictions
    def evict(self, task: str, reason: str, out: Outcome) -> None:
        ns, name = split(task)
        try:
            self._retry(lambda: self.api.evict(ns, name, reason))
            out.evicted.append(task)
        except NotFound:
            out.evicted.append(task)  # already gone
        except (Conflict, Retry) as e:
            log.warning("could not evict %s: %s", task, e)
            out.not_evicted.append(task)

    # ------------------------------------------------------------------ binds
    def apply(self, result: CycleResult, uids: dict[str, str]) -> Outcome:
        out = Outcome()
        for ev in result.evictions:
            self.evict(ev.task, ev.reason, out)
        # capacity a refused eviction (e.g. a PodDisruptionBudget) did not free must not be used
        held = {ev.node for ev in result.evictions if ev.task in out.not_evicted}
        gangs: dict[str, list[Bind]] = {}
        for b in result.binds:
            gangs.setdefault(b.workload, []).append(b)
        for workload, binds in gangs.items():
            if any(b.node in held for b in binds):
                out.deferred += [b.task for b in binds]
                continue
            self.bind_gang(workload, binds, uids, out, write_intent=True)
        return out

    def finish(self, binds: list[Bind], uids: dict[str, str], out: Outcome) -> None:
        """Binds chosen by an earlier run (annotations already written)."""
        gangs: dict[str, list[Bind]] = {}
        for b in binds:
            gangs.setdefault(b.workload, []).append(b)
        for workload, group in gangs.items():
            self.bind_gang(workload, group, uids, out, write_intent=False)

    def clear_intent(self, task: str) -> None:
        ns, name = split(task)
        try:
            self._retry(lambda: self.api.patch_pod_annotations(ns, name, dict.fromkeys(ALL)), conflicts=True)
        except (NotFound, Conflict, Retry) as e:
            log.info("could not clear the chosen node of %s: %s", task, e)

    def bind_gang(
        self, workload: str, binds: list[Bind], uids: dict[str, str], out: Outcome, write_intent: bool
    ) -> None:
        written: list[Bind] = []
        if write_intent:
            for b in binds:
                ns, name = split(b.task)
                try:
                    self._retry(partial(self.api.patch_pod_annotations, ns, name, encode(b)), conflicts=True)
                    written.append(b)
                except (NotFound, Conflict, Retry) as e:
                    for w in written:
                        self.clear_intent(w.task)
                    out.broken[workload] = f"could not record the assignment of {b.task}: {e}"
                    return
        done: list[Bind] = []
        for b in binds:
            state = self._bind_one(b, uids.get(b.task, ""))
            if state == "bound":
                done.append(b)
                out.bound.append(b.task)
            elif state == "later":
                out.deferred.append(b.task)
            else:
                self._undo(workload, done, binds, state, out)
                return

    def _bind_one(self, b: Bind, uid: str) -> str:
        """'bound', 'later' (API trouble: the intent stays, the next cycle retries), or why it broke."""
        ns, name = split(b.task)
        try:
            self._retry(lambda: self.api.bind(ns, name, uid, b.node))
            return "bound"
        except Retry:
            return self._verify(b) or "later"
        except NotFound:
            return f"pod {b.task} is gone"
        except Conflict:
            return self._verify(b) or f"pod {b.task} conflicts"

    def _verify(self, b: Bind) -> str | None:
        """After a 409 or a timeout: is the pod bound, and where?"""
        ns, name = split(b.task)
        try:
            pod: dict[str, Any] | None = self._retry(lambda: self.api.get_pod(ns, name))
        except Retry:
            return None
        if pod is None:
            return f"pod {b.task} is gone"
        node = (pod.get("spec") or {}).get("nodeName")
        if node == b.node:
            return "bound"
        if node:
            return f"pod {b.task} was bound to {node} by someone else"
        return None

    def _undo(self, workload: str, done: list[Bind], binds: list[Bind], why: str, out: Outcome) -> None:
        """The gang cannot complete: evict what we bound, forget what we chose."""
        log.warning("gang %s broke (%s): undoing %d bind(s)", workload, why, len(done))
        out.broken[workload] = why
        for b in done:
            self.evict(b.task, f"gang {workload} could not be completed: {why}", out)
            out.bound.remove(b.task)
        for b in binds:
            if b not in done:
                self.clear_intent(b.task)
