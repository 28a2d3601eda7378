"""Property tests for queues, preemption and reclaim on random trees, quotas and workloads.

Every cycle: no queue goes over its limit; non-preemptible work stays within deserved quota;
reclaim never takes a queue below its deserved share; no eviction unless the preemptor then
fits; no workload is evicted twice within its minimum runtime.
"""

from __future__ import annotations

import re

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.core.cycle import run_cycle
from phalanx.core.model import Gpu, GpuRequest, Node, PodSet, TaskRequest, Workload
from phalanx.core.queues import INF, Queue, QueueTree, ResourceQuota
from phalanx.core.snapshot import Snapshot
from phalanx.profiles import compile_profile

MIN_RUNTIME = 3.0
EPS = 1e-6


def profile(preempt=True, transfer=False):
    actions = [
        {"name": "allocate"},
        {"name": "reclaim", "args": {"min_runtime": MIN_RUNTIME, "transfer": transfer}},
        {"name": "preempt", "args": {"min_runtime": MIN_RUNTIME}},
        {"name": "backfill"},
    ]
    return compile_profile(
        {
            "name": "props",
            "tie_break": "name",
            "actions": actions if preempt else [a for a in actions if a["name"] != "preempt"],
            "order": [{"name": "priority"}],
            "admission": [{"name": "quota"}],
            "queue_order": {"name": "fairshare"},
        }
    )


@st.composite
def trees(draw):
    n = draw(st.integers(2, 4))
    nested = draw(st.booleans())
    queues = [Queue("org", quotas={"gpu": ResourceQuota(draw(st.integers(0, 8)) * 1000)})] if nested else []
    for k in range(n):
        deserved = draw(st.integers(0, 6))
        limit = draw(st.sampled_from([INF, deserved + draw(st.integers(0, 6))]))
        borrow = draw(st.sampled_from([INF, draw(st.integers(0, 4))]))
        lend = draw(st.sampled_from([INF, draw(st.integers(0, deserved))]))
        q = ResourceQuota(deserved * 1000, limit * 1000, draw(st.integers(1, 3)), borrow * 1000, lend * 1000)
        parent = "org" if nested and k < 2 else ""
        queues.append(Queue(f"q{k}", parent, {"gpu": q}, draw(st.integers(0, 1))))
    return QueueTree(queues)


@st.composite
def arrivals(draw, leaves):
    out = []
    for k in range(draw(st.integers(3, 12))):
        per = draw(st.sampled_from([1, 2]))
        count = draw(st.integers(1, 3))
        ps = PodSet("p", count, TaskRequest(1000, 1024, GpuRequest.whole(per)))
        out.append(
            (
                draw(st.integers(0, 6)),
                draw(st.integers(2, 10)),
                Workload(
                    f"w{k}",
                    (ps,),
                    min_available=draw(st.integers(0, count)),
                    queue=draw(st.sampled_from(leaves)),
                    priority=draw(st.integers(0, 2)),
                    preemptible=draw(st.booleans()) or draw(st.booleans()),
                    creation_time=float(k),
                ),
            )
        )
    return out


def nodes():
    return [
        Node(f"n{i}", 64_000, 256 * 1024, tuple(Gpu(j, "A100", 40960) for j in range(4))) for i in range(3)
    ]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_queue_invariants(data):
    tree = data.draw(trees())
    leaves = sorted(n for n in tree.queues if tree.is_leaf(n))
    plan = data.draw(arrivals(leaves))
    snap = Snapshot(nodes(), queues=tree)
    prof = profile(
        preempt=data.draw(st.booleans(), label="with preempt"),
        transfer=data.draw(st.booleans(), label="transfer reclaim"),
    )
    rng = np.random.default_rng(0)
    started: dict[str, float] = {}
    finish: dict[str, float] = {}
    for t in range(14):
        now = float(t)
        for at, dur, w in plan:
            if at == t:
                snap.add_workload(w)
                finish[w.name] = float(dur)
        for name in [
            n for n, e in snap.running.items() if started.get(n) is not None and now - started[n] >= finish[n]
        ]:
            snap.remove_workload(name)
            started.pop(name)
        result = run_cycle(snap, prof, now, rng)
        for ev in result.evictions:
            st_ = started.get(ev.workload)
            assert st_ is not None and now - st_ >= MIN_RUNTIME - EPS, f"{ev.workload} evicted too soon"
        snap.apply(result, now)
        snap.cluster.check_invariants()
        bound_now = {b.workload for b in result.binds}
        for ev in result.evictions:
            m = re.search(r"(?:preempted by|for) (\S+?)(?: \(|$)", ev.reason)
            assert m, ev.reason
            assert m.group(1) in bound_now, f"{ev.reason}: the preemptor was not placed"
            vq = snap.workloads[ev.workload].workload.queue
            # preemption inside vq later in the cycle may lower it further: that is vq's own choice
            inside = any(
                e.reason.startswith("preempted") and snap.workloads[e.workload].workload.queue == vq
                for e in result.evictions
            )
            if ev.reason.startswith("reclaimed") and not inside:
                assert snap.usage_of(vq)[0] >= tree.deserved[vq][0] - EPS, f"reclaim took {vq} below deserved"
        for name in list(started):
            if name not in snap.running:
                started.pop(name)
        for name in snap.running:
            started.setdefault(name, now)
        for q in tree.queues:
            assert snap.usage_of(q)[0] <= tree.ceiling(q)[0] + EPS, f"queue {q} over its limit"
        for q in leaves:
            fixed = sum(
                a.devices.milli * len(a.devices.gpus)
                for e in snap.workloads.values()
                if e.workload.queue == q and not e.workload.preemptible
                for a in e.bound.values()
            )
            assert fixed <= tree.deserved[q][0] + EPS, f"non-preemptible work over quota in {q}"
