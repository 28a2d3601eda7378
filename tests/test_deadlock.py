"""The deadlock: two 4-pod x 1-GPU training jobs on 3 nodes x 2 GPUs (6 GPUs)."""

from builders import Scenario, make_node, make_workload


def _cluster():
    return [make_node(f"n{i}").gpus(2, model="V100", memory="32Gi").build() for i in range(3)]


def _jobs():
    # created together: their controllers create pods concurrently
    return [
        make_workload(n).podset("worker", 4, cpu=4, gpu=1).created(0.0).build() for n in ("job-a", "job-b")
    ]


def test_k8s_default_deadlocks_with_both_jobs_partly_placed():
    sc = Scenario(_cluster(), _jobs(), profile="k8s-default")
    last = sc.run()
    assert sc.bound("job-a") == 3
    assert sc.bound("job-b") == 3
    # stuck: another cycle changes nothing, and both jobs wait for their 4th pod
    again = sc.cycle()
    assert not again.binds
    assert sc.bound("job-a") == 3 and sc.bound("job-b") == 3
    for job in ("job-a", "job-b"):
        p = last.pending_for(job)
        assert p is not None and "insufficient free GPU" in p.message
        assert not sc.snapshot.workloads[job].is_ready  # a gang that never starts: deadlocked


def test_phalanx_runs_one_job_whole_and_the_other_waits_then_runs():
    sc = Scenario(_cluster(), _jobs(), profile="phalanx")
    last = sc.run()
    assert sorted([sc.bound("job-a"), sc.bound("job-b")]) == [0, 4]
    winner, loser = ("job-a", "job-b") if sc.bound("job-a") == 4 else ("job-b", "job-a")
    p = last.pending_for(loser)
    assert p is not None
    assert "4 tasks of 1 GPU each, all at once: 2 GPUs free on 1 node in the cluster; 2 of 4 placed" in (
        p.message
    )
    assert "insufficient free GPU (1 GPU) on 3 nodes" in p.message
    sc.complete(winner)
    sc.run()
    assert sc.bound(loser) == 4
