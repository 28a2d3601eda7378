"""What bench_churn counts while it runs: a sample of the pods every 0.5 s; RSS, /metrics and the
`Preempted` Events every 10 s."""

from __future__ import annotations

import calendar
import contextlib
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from phalanx.k8s.client.kinds import EVENTS, OUR_POD_GROUPS, PODS

SAMPLE_S = 0.5
LASTING_S = 2.0  # a gang partial for longer than two 1 s cycles
BUCKETS = re.compile(r'^phalanx_cycle_seconds_bucket\{le="([^"]+)"[^}]*\} ([0-9.e+]+)$', re.M)


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Watcher:
    def __init__(
        self,
        kube: Any,
        ns: str,
        jobs: Any,
        replicas: list[Any],
        out: Path,
        pools: dict[str, str] | None = None,
    ) -> None:
        self.kube, self.ns, self.jobs, self.replicas, self.out = kube, ns, jobs, replicas, out
        self.pools = pools or {}  # node -> its pool (shards)
        self.wrong_pool: set[str] = set()  # pods bound to a node of another pool than theirs
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()
        self.node_of: dict[str, str] = {}  # pod uid -> node
        self.bound_ever: set[str] = set()
        self.double_binds: list[str] = []
        self.gpu_twice: set[str] = set()
        self.evicted: dict[str, tuple[float, str, float]] = {}  # pod uid -> (seen terminating, pod, wall)
        self.preempted: dict[str, tuple[str, float]] = {}  # pod uid -> its Preempted Event (message, wall)
        self.partial_since: dict[str, float] = {}
        self.partials: list[tuple[str, float, float]] = []  # (gang, from, seconds), seen in >= 2 samples
        self.no_reason: set[str] = set()
        self.no_reason_detail: dict[str, dict[str, Any]] = {}  # the first ten, as seen then
        self.rss: list[tuple[float, str, float]] = []
        self.cycles: dict[str, dict[float, float]] = {}  # incarnation -> le -> count
        self.errors = 0
        self.drain_s = 15.0  # at the end, how long to wait for the last evictions' Events at most
        self.waiting_now: list[str] = []
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._pods, self._every10)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _now(self) -> float:
        return time.monotonic() - self.t0

    # ------------------------------------------------------------------ pods
    def _pods(self) -> None:
        last_reasons = 0.0
        while not self.stop_event.wait(SAMPLE_S):
            try:
                pods, _ = self.kube.api.list(PODS)
            except Exception:
                self.errors += 1  # the API restarting
                continue
            pods = [p for p in pods if p["metadata"]["namespace"] == self.ns]
            self._bound(pods)
            if self._now() - last_reasons > 30:
                last_reasons = self._now()
                self._reasons(pods)

    def _bound(self, pods: list[dict[str, Any]]) -> None:
        now = self._now()
        bound: dict[str, str] = {}
        held: dict[tuple[str, str], str] = {}
        for p in pods:
            meta, spec = p["metadata"], p["spec"]
            name, uid, where = meta["name"], meta["uid"], spec.get("nodeName") or ""
            if meta.get("deletionTimestamp"):
                if name not in self.jobs.deleted:
                    if uid not in self.evicted:
                        self.evicted[uid] = (now, name, time.time())
                        self.jobs.on_evicted(name)
                    self._held(held, where, f"{name} (terminating)", meta)  # it holds them until gone
                    with contextlib.suppress(Exception):  # play the kubelet: a victim goes
                        self.kube.api.delete(PODS, name, self.ns, 0)
                continue
            if not where:
                continue
            bound[name] = where
            self.bound_ever.add(uid)
            if self.pools.get(where, "") != getattr(self.jobs, "pool_of", {}).get(name, ""):
                self.wrong_pool.add(
                    f"{name} ({self.jobs.pool_of.get(name)!r}) on {where} ({self.pools.get(where)!r})"
                )
            if self.node_of.setdefault(uid, where) != where:
                self.double_binds.append(f"{name}: {self.node_of[uid]} then {where}")
            self._held(held, where, name, meta)
        for job, (names, gang) in list(self.jobs.live.items()):
            if not gang:
                continue
            n = sum(1 for x in names if x in bound)
            if 0 < n < len(names):
                self.partial_since.setdefault(job, now)
            elif job in self.partial_since:
                self._partial_ended(job, now)
        self.waiting_now = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
        self.jobs.tick(bound, time.monotonic(), {p["metadata"]["name"] for p in pods})

    def _held(self, held: dict[tuple[str, str], str], where: str, name: str, meta: dict[str, Any]) -> None:
        """Whole GPUs of `where` that `name` holds; one held by two live pods is a GPU given twice."""
        notes = meta.get("annotations") or {}
        devices = notes.get("phalanx.io/gpu-devices", "")
        if where and devices and "gpu-fraction" not in notes and "phalanx.io/mig-slice" not in notes:
            for d in devices.split(","):
                other = held.setdefault((where, d), name)
                if other != name:
                    self.gpu_twice.add(f"{where} GPU {d}: {other} and {name}")

    def _partial_ended(self, job: str, now: float) -> None:
        since = self.partial_since.pop(job)
        if now - since > LASTING_S:
            self.partials.append((job, since, now - since))

    def _reasons(self, pods: list[dict[str, Any]]) -> None:
        """Pods of ours waiting over 60 s without one Event about them."""
        try:
            events, _ = self.kube.api.list(EVENTS)
        except Exception:
            return
        told = {
            (e.get("involvedObject") or {}).get("name")
            for e in events
            if e["metadata"].get("namespace") == self.ns
        }
        now = time.time()
        for p in pods:
            meta = p["metadata"]
            created = calendar.timegm(time.strptime(meta["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
            if not p["spec"].get("nodeName") and now - created > 60 and meta["name"] not in told:
                if meta["name"] not in self.no_reason and len(self.no_reason_detail) < 10:
                    self.no_reason_detail[meta["name"]] = self._why_untold(p, now - created)
                self.no_reason.add(meta["name"])

    def _why_untold(self, p: dict[str, Any], age: float) -> dict[str, Any]:
        """What can be seen of a pod left untold: its group and that group's status, its gates."""
        meta = p["metadata"]
        group = (meta.get("annotations") or {}).get("phalanx.io/pod-group", "")
        out: dict[str, Any] = {"age_s": round(age), "group": group, "gates": p["spec"].get("schedulingGates")}
        if group:
            try:
                pg = self.kube.api.get(OUR_POD_GROUPS, group, self.ns) or {}
            except Exception as e:
                pg = {"error": str(e)}
            out["podgroup"] = {"exists": bool(pg), "status": (pg.get("status") or {})}
            try:
                pods, _ = self.kube.api.list(PODS, field_selector=f"metadata.namespace={self.ns}")
            except Exception:
                pods = []
            out["members"] = sorted(
                (q["metadata"]["name"], bool(q["spec"].get("nodeName")))
                for q in pods
                if (q["metadata"].get("annotations") or {}).get("phalanx.io/pod-group") == group
            )
        return out

    def _preempted(self) -> None:
        """The Preempted Events of our pods, by the pod's uid (Events live an hour: read as we go)."""
        try:
            events, _ = self.kube.api.list(EVENTS, field_selector="reason=Preempted")
        except Exception:
            return
        for e in events:
            obj = e.get("involvedObject") or {}
            if e["metadata"].get("namespace") == self.ns and obj.get("uid"):
                at = e.get("firstTimestamp") or e["metadata"].get("creationTimestamp") or ""
                wall = calendar.timegm(time.strptime(at, "%Y-%m-%dT%H:%M:%SZ")) if at else 0.0
                self.preempted.setdefault(obj["uid"], (e.get("message", ""), wall))

    def _drain(self, most_s: float) -> float:
        """Read the Preempted Events until none of our evictions' is still arriving (10 s without
        a new one), `most_s` at most: the scheduler writes Events behind its binds. Seconds taken."""
        t0, last, quiet = time.monotonic(), -1, 0
        while self.evicted and time.monotonic() - t0 < most_s and quiet < 2:
            self._preempted()
            got = sum(1 for uid in self.evicted if uid in self.preempted)
            quiet = quiet + 1 if got == last else 0
            last = got
            time.sleep(5.0)
        return time.monotonic() - t0

    # ------------------------------------------------------------------ replicas
    def _every10(self) -> None:
        with httpx.Client(timeout=5) as c:
            while not self.stop_event.wait(10):
                self._preempted()
                for r in self.replicas:
                    if r.proc is None or r.proc.poll() is not None:
                        continue
                    self.rss.append((self._now(), r.key, _rss_mib(r.proc.pid)))
                    try:
                        text = c.get(f"http://127.0.0.1:{r.port}/metrics").text
                    except httpx.HTTPError:
                        continue
                    self.cycles[r.key] = {
                        float(le): float(n) for le, n in BUCKETS.findall(text) if le != "+Inf"
                    }

    def _said(self, uid: str, wall: float) -> tuple[str, float | None]:
        """An eviction's Preempted Event: its message and how long after the eviction was seen it
        was written (whole seconds: the Event's timestamp), or ("", None)."""
        if uid not in self.preempted:
            return "", None
        msg, at = self.preempted[uid]
        return msg, round(at - wall) if at else None

    # ------------------------------------------------------------------ the end
    def stop(self) -> dict[str, Any]:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=30)
        for job in list(self.partial_since):
            self._partial_ended(job, self._now())
        drained = self._drain(self.drain_s)
        lasting = [(j, round(f), round(s, 1)) for j, f, s in self.partials]
        return {
            "pods_bound": len(self.bound_ever),
            "evictions": len(self.evicted),
            "eviction_log": sorted(
                (round(t, 1), name, uid, *self._said(uid, wall))
                for uid, (t, name, wall) in self.evicted.items()
            ),
            "events_drained_s": round(drained),
            "double_binds": self.double_binds,
            "bound_outside_their_pool": sorted(self.wrong_pool)[:20],
            "gpu_given_twice": sorted(self.gpu_twice),
            "gangs_partial_over_2s": len(self.partials),
            "gangs_partial_longest_s": max((s for _, _, s in self.partials), default=0.0),
            "gangs_partial_detail": lasting[:20],
            "waited_over_60s_with_no_event": sorted(self.no_reason)[:20],
            "waited_no_event_count": len(self.no_reason),
            "waited_no_event_detail": self.no_reason_detail,
            "cycle_seconds": _percentiles(self.cycles),
            "rss": _rss_summary(self.rss),
            "plot": _plot(self.rss, self.out / "rss.png"),
            "sample_errors": self.errors,
            "waiting_at_the_end": len(self.waiting_now),
        }


def _percentiles(by_incarnation: dict[str, dict[float, float]]) -> dict[str, Any]:
    """p50/p90/p99 as the bucket bound they fall under, over every incarnation's cycles."""
    total: dict[float, float] = {}
    for b in by_incarnation.values():
        for le, n in b.items():
            total[le] = total.get(le, 0.0) + n
    if not total:
        return {}
    count = max(total.values())
    out: dict[str, Any] = {"cycles": int(count)}
    for q in (0.5, 0.9, 0.99):
        out[f"p{int(q * 100)}_under_s"] = next((le for le in sorted(total) if total[le] >= q * count), "inf")
    return out


def _rss_summary(rss: list[tuple[float, str, float]]) -> dict[str, Any]:
    """Per incarnation: RSS 10 min after it started (or its first sample), its peak after, growth."""
    out: dict[str, Any] = {}
    by: dict[str, list[tuple[float, float]]] = {}
    for t, key, mib in rss:
        by.setdefault(key, []).append((t, mib))
    for key, pts in by.items():
        t0 = pts[0][0]
        late = [m for t, m in pts if t - t0 >= 600] or [m for _, m in pts]
        out[key] = {
            "lived_s": round(pts[-1][0] - t0),
            "first_mib": round(pts[0][1]),
            "at_10min_mib": round(late[0]),
            "peak_mib": round(max(m for _, m in pts)),
            "growth_after_10min_pct": round(100 * (max(late) - late[0]) / max(late[0], 1), 1),
        }
    return out


def _plot(rss: list[tuple[float, str, float]], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing: no plot"
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for key in sorted({k for _, k, _ in rss}):
        pts = [(t / 60, m) for t, k, m in rss if k == key]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=key)
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title("phalanx scheduler replicas under churn (each kill starts a new incarnation)")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    return str(path)
