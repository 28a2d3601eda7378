"""bench_churn --full (issue 40 item 4): the churn run on a cluster kept full, so that reclaim and
priority preemption fire all the run, and what the evictions did.

The cluster: `--nodes` nodes of 8 x H100 (whole GPUs only, so that "a GPU given twice" is exact),
`--queues` Queues (`q0`, `q1`, ...) whose deserved GPUs sum to the cluster, borrowing allowed. Jobs
arrive above what the cluster holds: gangs 4 x 8, 2 x 8 and 2 x 4 GPUs, singles of 8, 2 and 1 GPUs
(priority class `churn-train`, 0) and one-GPU inference pods (`churn-inference`, 1000), each job in
one queue. One queue is hot at a time (`HOT` of the arrivals, turning every `phase_s`), so it
borrows what the others leave, and the next hot queue reclaims it. A job ends (its pods deleted)
120-480 s after it is whole; a queue keeps at most `max_waiting` jobs waiting (arrivals beyond are
turned away and counted). An evicted job comes back as a Job or training operator would bring it:
its pods made again under the same names (its PodGroup stays), so it waits, runs and may be evicted
again. The scheduler runs a copy of the default profile `phalanx-queues` with reclaim's
`min_runtime` cut to `reclaim_min_runtime` (the default's hour would let nothing be reclaimed in a
run of an hour), its `margin` set by `--reclaim-margin` if given (the default's 0.6 lets no queue
of this run reclaim), and an eviction budget on reclaim and preempt; every other key as shipped,
`repeat_window: 3600` and `max_loss_per_gpu: 3600` included.

The preemptor of each eviction is read from the victim pod's `Preempted` Event (matched by the
pod's uid; polled with `fieldSelector=reason=Preempted` every 10 s and once more at the end): its
message is `preempted by churn/<workload> (...)` or `reclaimed by queue <q> for churn/<workload>`.
The preemptor's shape (pods, GPUs per pod, gang or not: the scheduler's demand key, all pods here
asking the same CPU and memory) and priority come from the run's own table of the jobs it made.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from kube_objects import node, pod, pod_group
from phalanx.k8s.client.kinds import OUR_POD_GROUPS, PODS

NS = "churn"
WINDOW_S = 3600.0  # the default profile's repeat_window, and the budget's hour
HOT = 0.55  # share of the arrivals that go to the hot queue
PRIORITY = {"churn-train": 0, "churn-inference": 1000}
SHAPES = [  # (kind, pods, GPUs per pod, weight, priority class)
    ("gang", 4, 8, 0.10, "churn-train"),
    ("gang", 2, 8, 0.10, "churn-train"),
    ("gang", 2, 4, 0.15, "churn-train"),
    ("single", 1, 8, 0.10, "churn-train"),
    ("single", 1, 2, 0.15, "churn-train"),
    ("single", 1, 1, 0.15, "churn-train"),
    ("inference", 1, 1, 0.25, "churn-inference"),
]
EVENT = re.compile(r"^(?:preempted by (\S+) \(|reclaimed by queue (\S+) for (\S+)$)")


def setup(kube: Any, nodes: int, queues: int) -> None:
    """H100 nodes, the Queues (deserved GPUs summing to the cluster) and the priority classes."""
    objs = [
        node(f"h100-{k:04d}", gpus=8, labels={"topology.phalanx.io/rack": f"r{k // 32}"})
        for k in range(nodes)
    ]
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda o: kube.api.create("nodes", o), objs))
    total = nodes * 8
    for j in range(queues):
        share = total // queues + (1 if j < total % queues else 0)
        kube.create({
            "apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": f"q{j}"},
            "spec": {"resources": {"gpu": {"quota": share, "overQuotaWeight": 1}}},
        })  # fmt: skip
    for name, value in PRIORITY.items():
        kube.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                    "value": value})  # fmt: skip


def profile(
    path: Path, reclaim_min_runtime: float, budget_queue: int, budget_cluster: int, margin: float | None
) -> Path:
    """The default profile, reclaim's minimum runtime cut (and its `margin`, if given), a budget on
    reclaim and preempt."""
    text = (importlib.resources.files("phalanx.profiles") / "phalanx-queues.yaml").read_text()
    prof = yaml.safe_load(text)
    prof["name"] = "churn-full"
    budget = {k: v for k, v in (("queue", budget_queue), ("cluster", budget_cluster)) if v}
    for action in prof["actions"]:
        if action["name"] == "reclaim":
            action["args"]["min_runtime"] = reclaim_min_runtime
            if margin is not None:
                action["args"]["margin"] = margin
        if action["name"] in ("reclaim", "preempt") and budget:
            action["args"]["budget"] = dict(budget)
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return path


class FullJobs:
    """Jobs of `SHAPES` in queues, arriving above what the cluster holds; evicted ones come back."""

    def __init__(self, kube: Any, seed: int, queues: int, phase_s: float, max_waiting: int) -> None:
        self.kube, self.rng, self.queues = kube, random.Random(seed), queues
        self.phase_s, self.max_waiting = phase_s, max_waiting
        self.pool_of: dict[str, str] = {}  # pod -> pool: none here
        self.live: dict[str, tuple[list[str], bool]] = {}  # job -> (pods, gang?)
        self.ends: dict[str, float] = {}
        self.deleted: set[str] = set()
        self.made = 0
        self.turned_away = 0
        self.remade = 0
        self.job_of: dict[str, str] = {}  # pod -> job
        self.info: dict[str, tuple[str, tuple[int, int, bool], int]] = {}  # job -> (queue, shape, priority)
        self.body: dict[str, dict[str, Any]] = {}  # pod -> what was created
        self.gone: set[str] = set()  # evicted pods to make again once they are gone
        self.bound_now: set[str] = set()
        self.t0: float | None = None
        self.lock = threading.Lock()

    def queue_now(self, now: float) -> str:
        if self.t0 is None:
            self.t0 = now
        hot = int((now - self.t0) // self.phase_s) % self.queues
        if self.queues == 1 or self.rng.random() < HOT:
            return f"q{hot}"
        return f"q{self.rng.choice([j for j in range(self.queues) if j != hot])}"

    def waiting(self, queue: str) -> int:
        return sum(
            1
            for job, (names, _) in list(self.live.items())
            if self.info[job][0] == queue and not all(n in self.bound_now for n in names)
        )

    def make(self, now: float | None = None) -> None:
        q = self.queue_now(time.monotonic() if now is None else now)
        kind, n, gpus, _, klass = self.rng.choices(SHAPES, weights=[s[3] for s in SHAPES])[0]
        if self.waiting(q) >= self.max_waiting:
            self.turned_away += 1
            return
        self.made += 1
        job = f"{kind}-{self.made:06d}"
        names = [f"{job}-{k}" for k in range(n)]
        notes: dict[str, str] = {}
        if kind == "gang":
            self.kube.create(pod_group(job, n, ns=NS, queue=q))
            notes["phalanx.io/pod-group"] = job
        with self.lock:
            self.info[job] = (q, (n, gpus, kind == "gang"), PRIORITY[klass])
        for name in names:
            p = pod(name, ns=NS, gpus=gpus, annotations=notes, labels={"phalanx.io/queue": q, "job": job})
            del p["metadata"]["uid"], p["metadata"]["creationTimestamp"], p["spec"]["priority"]
            p["spec"]["priorityClassName"] = klass  # admission refuses a pod that sets the number too
            self.body[name], self.job_of[name] = p, job
            self.kube.api.create(PODS, p, NS)
        with self.lock:
            self.live[job] = (names, kind == "gang")

    def on_evicted(self, name: str) -> None:
        job = self.job_of.get(name)
        if job is not None and job in self.live:
            self.gone.add(name)
            self.ends.pop(job, None)  # whole again later: a new run length then

    def tick(self, bound: dict[str, str], now: float, present: set[str] | None = None) -> None:
        self.bound_now = set(bound)
        for name in sorted(self.gone):
            if present is not None and name in present:
                continue  # still terminating
            self.gone.discard(name)
            if self.job_of[name] not in self.live:
                continue
            with contextlib.suppress(Exception):  # the API restarting: made next sample
                self.kube.api.create(PODS, self.body[name], NS)
                self.remade += 1
                continue
            self.gone.add(name)
        for job, (names, gang) in list(self.live.items()):
            if job not in self.ends and all(n in bound for n in names):
                self.ends[job] = now + self.rng.uniform(120, 480)
            if self.ends.get(job, float("inf")) <= now:
                with self.lock:
                    self.deleted.update(names)
                    del self.live[job]
                for n in names:
                    with contextlib.suppress(Exception):
                        self.kube.api.delete(PODS, n, NS, 0)
                if gang:
                    with contextlib.suppress(Exception):
                        self.kube.api.delete(OUR_POD_GROUPS, job, NS)


def _job(workload: str, jobs: FullJobs) -> str:
    """`churn/<name>` -> the job: a gang's PodGroup is the job, a single pod's job is its own."""
    name = workload.split("/", 1)[-1]
    return name if name in jobs.info else jobs.job_of.get(name, "")


def _repeat(s: dict[str, Any], r: dict[str, Any]) -> bool:
    """`r` evicts the victim of the earlier `s` again for a preemptor of its shape, within the window."""
    return (
        s["victim"] == r["victim"]
        and s["shape"] is not None
        and s["shape"] == r["shape"]
        and (r["t"] - s["t"] < WINDOW_S)
    )


def analyse(
    evictions: list[tuple[float, str, str, str, float | None]],
    jobs: FullJobs,
    minutes: float,
    budget_queue: int,
    budget_cluster: int,
) -> dict[str, Any]:
    """`evictions`: (seconds into the run, pod, uid, its Preempted Event's message or "", seconds from
    the eviction seen to the Event's timestamp or None).

    A workload eviction is its pods' evictions seen within 30 s of each other (a gang goes whole).
    A repeat: one workload evicted twice for preemptors of one shape within `WINDOW_S`; "guarded"
    when the preemptor's priority is not above the victim's (the repeat window applies), "by
    priority" otherwise (exempt by design)."""
    by_job: dict[str, list[tuple[float, str, str]]] = {}
    pods_named = 0
    unnamed: list[str] = []
    lags = sorted(e[4] for e in evictions if e[4] is not None)
    for t, name, _uid, msg, _lag in sorted(evictions):
        m = EVENT.match(msg)
        pre = _job((m.group(1) or m.group(3)) if m else "", jobs)
        if pre:
            pods_named += 1
        else:
            unnamed.append(f"{name}: {msg or 'no Preempted Event'}")
        by_job.setdefault(jobs.job_of.get(name, name), []).append((t, name, pre))
    records: list[dict[str, Any]] = []
    for job, evs in by_job.items():
        group: list[tuple[float, str, str]] = []
        for e in [*evs, (float("inf"), "", "")]:
            if group and (e[0] - group[0][0] > 30 or e[1] in {g[1] for g in group}):
                pres = sorted({g[2] for g in group if g[2]})
                queue, _, prio = jobs.info.get(job, ("?", (0, 0, False), 0))
                pre = pres[0] if pres else ""
                pre_prio = jobs.info[pre][2] if pre else -1
                records.append({
                    "t": group[0][0], "victim": job, "queue": queue, "pods": len(group), "preemptor": pre,
                    "preemptors": len(pres), "shape": jobs.info[pre][1] if pre else None,
                    "by_priority": pre_prio > prio,
                    "kind": "reclaim" if pre and jobs.info[pre][0] != queue else ("preempt" if pre else "?"),
                })  # fmt: skip
                group = []
            group.append(e)
    records.sort(key=lambda r: r["t"])
    repeats: dict[str, list[str]] = {"guarded": [], "by_priority": []}
    for k, r in enumerate(records):  # each eviction that repeats an earlier one, counted once
        s = next((s for s in reversed(records[:k]) if _repeat(s, r)), None)
        if s is not None:
            said = f"{r['victim']} at {s['t']:.0f} s and {r['t']:.0f} s for shape {r['shape']}"
            repeats["by_priority" if r["by_priority"] else "guarded"].append(said)
    over = {"queue": 0, "cluster": 0}
    peak_queue: dict[str, int] = {}
    peak_cluster = 0
    for r in records:
        hour = [s for s in records if r["t"] - WINDOW_S < s["t"] <= r["t"]]
        same = sum(1 for s in hour if s["queue"] == r["queue"])
        peak_queue[r["queue"]] = max(peak_queue.get(r["queue"], 0), same)
        peak_cluster = max(peak_cluster, len(hour))
        if not r["by_priority"] and r["preemptor"]:  # held back by the budget; priority ones only count
            over["queue"] += bool(budget_queue and same > budget_queue)
            over["cluster"] += bool(budget_cluster and len(hour) > budget_cluster)
    kinds: dict[str, int] = {}
    for r in records:
        key = f"{r['kind']}{' by priority' if r['by_priority'] else ''}"
        kinds[key] = kinds.get(key, 0) + 1
    return {
        "pod_evictions": len(evictions),
        "pod_evictions_whose_event_names_the_preemptor": pods_named,
        "pod_evictions_without": unnamed[:20],
        "event_lag_s": {
            "p50": lags[len(lags) // 2] if lags else None,
            "p90": lags[int(len(lags) * 0.9)] if lags else None,
            "max": lags[-1] if lags else None,
        },
        "workload_evictions": len(records),
        "workload_evictions_by_kind": kinds,
        "workload_evictions_per_hour": round(len(records) / (minutes / 60), 1) if minutes else 0,
        "workload_evictions_named_not_by_priority_per_hour": round(
            sum(1 for r in records if r["preemptor"] and not r["by_priority"]) / (minutes / 60), 1
        )
        if minutes
        else 0,
        "most_in_any_hour": {"cluster": peak_cluster, "by_queue": dict(sorted(peak_queue.items()))},
        "budget": {"queue": budget_queue, "cluster": budget_cluster},
        "guarded_evictions_over_budget": over,
        "evicted_twice_for_one_shape_within_3600s": len(repeats["guarded"]),
        "evicted_twice_for_one_shape_within_3600s_by_priority": len(repeats["by_priority"]),
        "repeat_detail": {k: v[:10] for k, v in repeats.items()},
        "evicted_with_several_preemptors": sum(1 for r in records if r["preemptors"] > 1),
        "jobs_turned_away": jobs.turned_away,
        "pods_made_again_after_eviction": jobs.remade,
    }
