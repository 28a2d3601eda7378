"""Placement policies as the FGD artifact defines them, checked on hand-computed cases."""

import numpy as np
import pytest

from builders import Scenario, make_node, make_workload
from phalanx.core.fragmentation import TypeTable
from phalanx.core.model import GpuRequest, TaskRequest
from phalanx.core.session import Session
from phalanx.core.snapshot import Snapshot, TaskType
from phalanx.plugins.bestfit import BestFitScorer
from phalanx.plugins.dotprod import DotProdScorer
from phalanx.plugins.fgd import FgdScorer, after_states
from phalanx.plugins.gpuclustering import GpuClusteringScorer
from phalanx.plugins.gpupacking import GpuPackingScorer
from phalanx.profiles import load_profile


def session_for(snap: Snapshot, profile: str = "fgd") -> Session:
    return Session(snap, load_profile(profile), 0.0, np.random.default_rng(0))


def ctx_for(session: Session, workload: str):
    task = session.snapshot.workloads[workload].tasks[0]
    return session.candidates(task)


def occupy(snap: Snapshot, node: str, cpu: int, milli_per_gpu: list[int]) -> None:
    """Charge usage directly to a node's arrays (setup helper)."""
    from phalanx.core.cluster import DeviceAssignment

    i = snap.node_index(node)
    gpus = tuple(j for j, m in enumerate(milli_per_gpu) if m)
    # one assignment per GPU so the amounts may differ
    snap.cluster.take(i, cpu, 0, DeviceAssignment())
    for j in gpus:
        mem = int(snap.cluster.gpu_mem_cap[i, j]) * milli_per_gpu[j] // 1000
        snap.cluster.take(i, 0, 0, DeviceAssignment(gpus=(j,), milli=milli_per_gpu[j], gpu_memory_mib=(mem,)))


def test_fgd_fragmentation_of_a_node_by_hand():
    nodes = [make_node("n").cpu(10).gpus(2, model="G", memory="16Gi").build()]
    snap = Snapshot(nodes)
    types = [
        TaskType(TaskRequest(1000, 0, GpuRequest.fraction(0.5)), 0.5),
        TaskType(TaskRequest(1000, 0, GpuRequest.whole(1)), 0.25),
        TaskType(TaskRequest(1000, 0, GpuRequest.none()), 0.25),
    ]
    table = TypeTable.build(types, snap.cluster)
    frag = table.frag(np.array([10000, 500]), np.array([[1000, 300], [1000, 300]]), np.array([0, 0]))
    assert frag[0] == pytest.approx(0.5 * 300 + 0.25 * 300 + 0.25 * 1300)
    assert frag[1] == pytest.approx(1300)  # too little CPU: everything idle is fragmented


def test_fgd_score_is_the_quantised_sigmoid_of_the_frag_reduction():
    nodes = [make_node("n").cpu(10).gpus(2, model="G", memory="16Gi").build()]
    types = [
        TaskType(TaskRequest(1000, 0, GpuRequest.fraction(0.5)), 0.5),
        TaskType(TaskRequest(1000, 0, GpuRequest.whole(1)), 0.25),
        TaskType(TaskRequest(1000, 0, GpuRequest.none()), 0.25),
    ]
    snap = Snapshot(
        nodes, [make_workload("w").podset("p", cpu=1, memory=0, fraction=0.5).build()], task_types=types
    )
    occupy(snap, "n", 0, [0, 700])
    session = session_for(snap)
    ctx = ctx_for(session, "w")
    scorer = FgdScorer(quantize=True)
    # before: 550; after putting 0.5 on the free GPU: [500, 300] -> 0.5*300 + 0.25*800 + 0.25*800 = 550
    assert scorer.score(ctx)[0] == 50.0
    exact = FgdScorer(quantize=False).score(ctx)[0]
    assert exact == pytest.approx(50.0)


def test_fgd_picks_the_gpu_that_fragments_least():
    nodes = [make_node("n").cpu(64).gpus(2, model="G", memory="16Gi").build()]
    types = [TaskType(TaskRequest(1000, 0, GpuRequest.fraction(0.5)), 1.0)]
    snap = Snapshot(
        nodes, [make_workload("w").podset("p", cpu=1, memory=0, fraction=0.5).build()], task_types=types
    )
    occupy(snap, "n", 0, [500, 0])  # GPU0 has 500 free, GPU1 is whole
    session = session_for(snap)
    ctx = ctx_for(session, "w")
    devices = FgdScorer().select(ctx, 0)
    assert devices.gpus == (0,)  # filling the half-used GPU leaves a whole one


def test_after_states_pack_whole_gpus_and_branch_shares():
    assert after_states(10, (1000, 300, 1000), (2, 1000, 2)) == [(8, (300, 0, 0))]
    assert after_states(10, (1000, 600, 600), (1, 500, 1)) == [(9, (1000, 100, 600)), (9, (500, 600, 600))]


def test_bestfit_and_dotprod_prefer_the_fuller_node():
    nodes = [
        make_node("a").cpu(64).gpus(8, model="G").build(),
        make_node("b").cpu(64).gpus(8, model="G").build(),
    ]
    snap = Snapshot(nodes, [make_workload("w").podset("p", cpu=8, memory=0, gpu=1).build()])
    occupy(snap, "b", 32000, [1000] * 6 + [0, 0])
    ctx = ctx_for(session_for(snap, "bestfit"), "w")
    # a: 1-(56/128*.5+7/8*.5)=0.34375 -> 34 ; b: 1-(24/128*.5+1/8*.5)=0.84375 -> 84 ; normalised to 0 / 100
    assert list(BestFitScorer().score(ctx)) == [0.0, 100.0]
    # a: 1-(0.5*0.0625+1*0.125)/2 = 0.921875 -> 92 ; b: 1-(0.25*0.0625+0.25*0.125)/2 = 0.9765625 -> 97
    assert list(DotProdScorer().score(ctx)) == [92.0, 97.0]


def test_gpupacking_bands():
    nodes = [make_node(n).cpu(64).gpus(8, model="G").build() for n in ("idle", "shared", "used")]
    snap = Snapshot(
        nodes,
        [
            make_workload("s").podset("p", cpu=1, memory=0, fraction=0.3).build(),
            make_workload("w").podset("p", cpu=1, memory=0, gpu=2).build(),
        ],
    )
    occupy(snap, "shared", 0, [500] + [0] * 7)
    occupy(snap, "used", 0, [1000] + [0] * 7)
    session = session_for(snap, "gpupacking")
    share = GpuPackingScorer().score(ctx_for(session, "s"))
    whole = GpuPackingScorer().score(ctx_for(session, "w"))
    assert list(share) == [25.0, 95.0, 49.0]  # idle: max(33-8, 8); shared GPU: 100 - 50/10; used node: 50 - 1
    assert list(whole) == [25.0, 48.0, 48.0]


def test_gpuclustering_keeps_shapes_together():
    nodes = [make_node(n).cpu(64).gpus(8, model="G").build() for n in ("empty", "shares", "mixed", "other")]
    sc = Scenario(nodes, [], profile="gpuclustering")
    for k, (node, wl) in enumerate(
        [
            ("shares", make_workload("a").podset("p", fraction=0.5)),
            ("mixed", make_workload("b").podset("p", fraction=0.5)),
            ("mixed", make_workload("c").podset("p", gpu=1)),
            ("other", make_workload("d").podset("p", gpu=2)),
        ]
    ):
        w = wl.build()
        sc.snapshot.add_workload(w)
        from phalanx.core.devices import default_assignment, gpu_usable

        i = sc.snapshot.node_index(node)
        req = w.podsets[0].request
        usable = gpu_usable(sc.snapshot.cluster, np.array([i]), req)[0]
        dev = default_assignment(sc.snapshot.cluster, i, usable, req)
        sc.snapshot.bind_existing(w.tasks()[0].name, node, dev)
        del k
    sc.snapshot.add_workload(make_workload("new").podset("p", fraction=0.25).build())
    ctx = ctx_for(session_for(sc.snapshot, "gpuclustering"), "new")
    scores = dict(
        zip(
            [sc.snapshot.nodes[i].name for i in ctx.candidates.nodes],
            GpuClusteringScorer().score(ctx),
            strict=True,
        )
    )
    assert scores["shares"] > scores["mixed"] > scores["empty"] > scores["other"]
    assert scores["shares"] == 75 + 25 * 500 // 8000


def test_random_policy_spreads_over_nodes():
    nodes = [make_node(f"n{k}").gpus(8, model="G").build() for k in range(4)]
    wl = [make_workload(f"w{k}").podset("p", gpu=1).build() for k in range(16)]
    sc = Scenario(nodes, wl, profile="random", seed=3)
    sc.run()
    used = {b.node for b in sc.binds()}
    assert len(used) >= 3


def test_binpack_fills_before_spread():
    nodes = [make_node(f"n{k}").gpus(8, model="G").build() for k in range(3)]
    wl = [make_workload(f"w{k}").podset("p", gpu=1).created(k).build() for k in range(3)]
    packed = Scenario(nodes, wl, profile="binpack")
    packed.run()
    spread = Scenario(nodes, wl, profile="spread")
    spread.run()
    assert len({b.node for b in packed.binds()}) == 1
    assert len({b.node for b in spread.binds()}) == 3
