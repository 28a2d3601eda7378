"""Multi-level gangs in the time replay: disaggregated inference servers (a prefill group and a
decode group, each in one rack, the server in one spine) arrive faster than they finish; each
runs whole at its levels or waits, and every one ends."""

from __future__ import annotations

import io
import json

from phalanx.core.model import Gpu, Node
from phalanx.profiles import load_profile
from phalanx.sim.jobs import JobGroup, JobSpec
from phalanx.sim.replay import replay


def cluster() -> list[Node]:
    return [
        Node(
            f"n{k}",
            64_000,
            512 * 1024,
            tuple(Gpu(j, "H100", 81920) for j in range(8)),
            topology={"spine": f"s{k // 4}", "rack": f"r{k // 2}"},
        )
        for k in range(8)
    ]


def server(name: str, submit: float) -> JobSpec:
    groups = (JobGroup("prefill", 2, level="rack"), JobGroup("decode", 4, min_tasks=2, level="rack"))
    return JobSpec(name, submit, 600.0, gpus=24, tasks=6, groups=groups)


def test_disaggregated_servers_run_whole_at_every_level_in_the_replay():
    jobs = [server(f"s{k}", 30.0 * k) for k in range(6)]
    log = io.StringIO()
    res = replay(
        cluster(), jobs, load_profile("phalanx"), topology_levels=["spine", "rack"], log=log, check=True
    )
    assert len(res.completed()) == 6 and not res.deadlocked and not res.starved
    racks = {f"n{k}": f"r{k // 2}" for k in range(8)}
    placed: dict[str, dict[str, set[str]]] = {}
    for line in log.getvalue().splitlines():
        d = json.loads(line)
        if d["kind"] == "bind":
            group = "prefill" if "/prefill-" in d["task"] else "decode"
            placed.setdefault(d["workload"], {}).setdefault(group, set()).add(racks[d["node"]])
    assert set(placed) == {j.name for j in jobs}
    for name, groups in placed.items():  # each group in one rack (a job placed again may move)
        assert all(len(r) == 1 for r in groups.values()), (name, groups)
    waited = [j for j in res.jobs if j.wait]
    assert waited  # four fit at their minimums (16 GPUs each of 64): the rest wait, none partly placed
