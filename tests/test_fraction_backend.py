"""One fractional request, the right backend: a MIG instance, an MPS share or a time-slice share,
by the profile's `fraction_backend` policy or the pod's own choice (`phalanx.core.backends`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from builders import Scenario, make_node, make_workload
from phalanx.core.backends import parse_override
from phalanx.core.errors import SpecError
from phalanx.core.model import GpuRequest, Workload
from phalanx.core.profile import Profile
from phalanx.profiles import compile_profile, load_profile

MIG_FIRST = {"order": ["mig", "mps", "time-slice"]}


def policy(fraction_backend: dict[str, Any] | None, base: str = "phalanx") -> Profile:
    """A built-in profile with a `fraction_backend` policy added, compiled as a YAML file would be."""
    data = yaml.safe_load(load_profile_text(base))
    if fraction_backend is not None:
        data["fraction_backend"] = fraction_backend
    return compile_profile(data, f"{base}.yaml")


def load_profile_text(name: str) -> str:
    from importlib import resources

    return (resources.files("phalanx.profiles") / f"{name}.yaml").read_text()


def cluster(mig_gpus: int = 1, share_gpus: int = 1) -> list:
    """One H100 node cut by MIG on demand, one with whole H100s that take shares."""
    return [
        make_node("a-mig").gpus(mig_gpus, model="H100", memory="80Gi", mig=True).build(),
        make_node("b-share").gpus(share_gpus, model="H100", memory="80Gi").build(),
    ]


def with_backend(w: Workload, *backends: str) -> Workload:
    """The workload as a pod with `phalanx.io/gpu-backend` set asks it."""
    ps = w.podsets[0]
    g = replace(ps.request.gpu, backends=backends)
    return replace(w, podsets=(replace(ps, request=replace(ps.request, gpu=g)),))


def test_without_a_policy_a_fraction_is_a_time_slice_share_as_before():
    wl = [make_workload("f").podset("p", fraction=0.1).build()]
    sc = Scenario(cluster(), wl)
    sc.run()
    b = sc.bind_of("f/p-0")
    assert (b.node, b.mig, b.backend, b.gpu_milli) == ("b-share", None, "", 100)
    assert "backend" not in b.to_dict()


def test_mig_first_serves_a_fraction_with_the_smallest_instance_that_holds_it():
    wl = [
        make_workload("tenth").podset("p", fraction=0.1).build(),  # 8 GiB, 1/10 compute: 1g.10gb
        make_workload("mem15").podset("p", gpu_memory=15 * 1024).created(1.0).build(),  # 1g.20gb
        make_workload("half").podset("p", fraction=0.5).created(2.0).build(),  # 40 GiB, 1/2: 4g (3g has 3/7)
    ]
    sc = Scenario(cluster(mig_gpus=2), wl, profile=policy(MIG_FIRST))
    sc.run()
    got = {w: sc.bind_of(f"{w}/p-0") for w in ("tenth", "mem15", "half")}
    assert {w: (b.node, b.backend, b.mig.profile if b.mig else "") for w, b in got.items()} == {
        "tenth": ("a-mig", "mig", "1g.10gb"),
        "mem15": ("a-mig", "mig", "1g.20gb"),
        "half": ("a-mig", "mig", "4g.40gb"),
    }
    assert got["tenth"].to_dict()["backend"] == "mig"
    # accounted as the instance: the share node's GPU is untouched
    c = sc.snapshot.cluster
    assert int(c.gpu_milli_free[c.index["b-share"], 0]) == 1000


def test_when_no_instance_is_free_the_next_backend_serves_it():
    wl = [make_workload(f"w{k}").podset("p", fraction=0.5).created(float(k)).build() for k in range(3)]
    sc = Scenario(cluster(mig_gpus=1, share_gpus=1), wl, profile=policy(MIG_FIRST))
    sc.run()
    got = sorted((sc.bind_of(f"w{k}/p-0").backend, sc.bind_of(f"w{k}/p-0").node) for k in range(3))
    # one 4g.40gb fits a MIG GPU (a second 4g does not), then MPS shares of the whole GPU
    assert got == [("mig", "a-mig"), ("mps", "b-share"), ("mps", "b-share")]


def test_mps_and_time_slice_never_share_a_gpu():
    prof = policy({"order": ["mps", "time-slice"]})
    mps = make_workload("mps").podset("p", fraction=0.25).build()
    ts = with_backend(make_workload("ts").podset("p", fraction=0.25).created(1.0).build(), "time-slice")
    sc = Scenario([make_node("n").gpus(2, model="H100", memory="80Gi").build()], [mps, ts], profile=prof)
    sc.run()
    a, b = sc.bind_of("mps/p-0"), sc.bind_of("ts/p-0")
    assert (a.backend, b.backend) == ("mps", "time-slice")
    assert a.gpus != b.gpus
    # a third share, MPS by the policy, goes beside the first MPS client, not on the time-sliced GPU
    sc.add(make_workload("mps2").podset("p", fraction=0.25).created(2.0).build())
    sc.run()
    assert sc.bind_of("mps2/p-0").gpus == a.gpus
    assert sc.bind_of("mps2/p-0").backend == "mps"


def test_time_slice_falls_back_when_every_gpu_runs_mps():
    prof = policy({"order": ["time-slice"]})
    mps = with_backend(make_workload("m").podset("p", fraction=0.5).build(), "mps")
    ts = make_workload("t").podset("p", fraction=0.25).created(1.0).build()
    sc = Scenario([make_node("n").gpus(1, model="H100", memory="80Gi").build()], [mps, ts], profile=prof)
    last = sc.run()
    assert sc.bind_of("m/p-0").backend == "mps"
    assert sc.bound("t") == 0
    assert "insufficient GPU share" in last.pending_for("t").message


def test_the_pods_choice_overrides_the_policy():
    wl = [
        with_backend(make_workload("ts").podset("p", fraction=0.1).build(), "time-slice"),
        with_backend(make_workload("mps").podset("p", fraction=0.1).created(1.0).build(), "mps"),
        with_backend(make_workload("mig").podset("p", fraction=0.1).created(2.0).build(), "mig"),
    ]
    # the profile says nothing: the pod's own choice still decides
    sc = Scenario(cluster(share_gpus=2), wl)
    sc.run()
    got = {w: (sc.bind_of(f"{w}/p-0").node, sc.bind_of(f"{w}/p-0").backend) for w in ("ts", "mps", "mig")}
    assert got == {"ts": ("b-share", "time-slice"), "mps": ("b-share", "mps"), "mig": ("a-mig", "mig")}


def test_a_pod_that_asks_mig_waits_for_an_instance_rather_than_take_a_share():
    full = make_workload("full").podset("p", mig="7g.80gb").build()
    wants = with_backend(make_workload("w").podset("p", fraction=0.1).created(1.0).build(), "mig")
    sc = Scenario(cluster(), [full, wants], profile=policy(MIG_FIRST))
    last = sc.run()
    assert sc.bound("w") == 0
    assert "no free GPU share or MIG instance for 1x0.1 GPU (mig)" in last.pending_for("w").message


def test_mig_for_memory_leaves_fraction_asks_to_shares():
    prof = policy({"order": ["mig", "time-slice"], "mig_for": "memory"})
    wl = [
        make_workload("frac").podset("p", fraction=0.1).build(),
        make_workload("mem").podset("p", gpu_memory=8 * 1024).created(1.0).build(),
    ]
    sc = Scenario(cluster(), wl, profile=prof)
    sc.run()
    assert (sc.bind_of("frac/p-0").backend, sc.bind_of("frac/p-0").node) == ("time-slice", "b-share")
    assert sc.bind_of("mem/p-0").mig.profile == "1g.10gb"


def test_a_two_device_fraction_is_never_served_by_mig():
    wl = [make_workload("two").podset("p", fraction=0.25, devices=2).build()]
    sc = Scenario(cluster(mig_gpus=1, share_gpus=2), wl, profile=policy(MIG_FIRST))
    sc.run()
    b = sc.bind_of("two/p-0")
    assert (b.node, b.backend, len(b.gpus)) == ("b-share", "mps", 2)
    with pytest.raises(SpecError, match="a MIG instance is one device"):
        GpuRequest(GpuRequest.fraction(0.25).kind, devices=2, milli=250, backends=("mig",))


def test_a_gang_of_fractions_waits_for_room_only_mig_has():
    """Upper bounds (room_for, node_capacity) count MIG instances: a gang that only MIG can hold is tried."""
    gang = make_workload("g").podset("p", count=7, fraction=0.1).build()
    sc = Scenario(cluster(share_gpus=0), [gang], profile=policy(MIG_FIRST))
    sc.run()
    assert sc.bound("g") == 7
    assert sorted(sc.bind_of(f"g/p-{k}").mig.start for k in range(7)) == list(range(7))


@pytest.mark.parametrize(
    ("fb", "message"),
    [
        ({"order": ["mig", "gpu"]}, r"phalanx.yaml: fraction_backend.order.1: Input should be 'mig', 'mps'"),
        ({"order": []}, r"phalanx.yaml: fraction_backend.order: List should have at least 1 item"),
        ({"order": ["mps", "mps"]}, r"phalanx.yaml: fraction_backend.order: a backend listed twice"),
        ({"order": ["mig"], "migFor": "memory"}, r"phalanx.yaml: fraction_backend.migFor: Extra inputs"),
        ({"order": ["mig"], "mig_for": "all"}, r"phalanx.yaml: fraction_backend.mig_for: Input should be"),
    ],
)
def test_a_bad_policy_is_one_line_naming_file_and_field(fb, message):
    with pytest.raises(SpecError, match=message) as e:
        policy(fb)
    assert "\n" not in str(e.value)


def test_override_values():
    assert parse_override("mig", "pod default/p: phalanx.io/gpu-backend") == ("mig",)
    assert parse_override("auto", "x") == ()
    with pytest.raises(SpecError, match=r"^pod default/p: phalanx.io/gpu-backend: unknown GPU backend 'gpu'"):
        parse_override("gpu", "pod default/p: phalanx.io/gpu-backend")
    with pytest.raises(SpecError, match="only a GPU fraction or a GPU memory request has a backend"):
        GpuRequest(GpuRequest.whole(1).kind, devices=1, milli=1000, backends=("mps",))


def test_default_profiles_say_nothing_of_backends():
    assert all(load_profile(n).fraction_backend.is_default for n in ("phalanx", "fgd", "k8s-default"))


def test_the_twin_replays_the_backend_it_chose():
    """A replay through the simulator: fractions go to MIG instances first, then MPS shares; the
    decision log says which, and each MIG-served fraction holds its instance until it ends."""
    import io
    import json

    from phalanx.sim.jobs import JobSpec
    from phalanx.sim.replay import replay

    jobs = [JobSpec(f"j{k}", submit=float(k), duration=600.0, gpus=1, gpu_milli=500) for k in range(4)]
    jobs.append(JobSpec("late", submit=2000.0, duration=60.0, gpus=1, gpu_milli=500))
    log = io.StringIO()
    result = replay(cluster(mig_gpus=1, share_gpus=1), jobs, policy(MIG_FIRST), log=log, check=True)
    binds = [json.loads(x) for x in log.getvalue().splitlines() if '"bind"' in x]
    by_job = {b["workload"]: (b.get("backend"), (b.get("mig") or {}).get("profile", "")) for b in binds}
    assert by_job == {
        "j0": ("mig", "4g.40gb"),
        "j1": ("mps", ""),
        "j2": ("mps", ""),
        "j3": ("mig", "4g.40gb"),  # the instance j0 held, free again when it ended
        "late": ("mig", "4g.40gb"),
    }
    assert all(r.end is not None for r in result.jobs)
    j3 = next(r for r in result.jobs if r.spec.name == "j3")
    assert j3.start is not None and j3.start >= 600.0  # waited for j0's instance, not a third share
