"""MIG: real profiles and placement rules; slices only where the geometry allows, never overlapping."""

import pytest

from builders import Scenario, make_node, make_workload
from phalanx.core.errors import SpecError
from phalanx.core.mig import GEOMETRIES, resolve_geometry
from phalanx.core.model import GpuRequest


def h100_mig():
    return [make_node("n0").gpus(1, model="H100", memory="80Gi", mig=True).build()]


def slots_of(binds):
    used = 0
    for b in binds:
        geo = GEOMETRIES["H100-80GB"]
        prof = geo.profile(b.mig.profile)
        mask = prof.slot_mask(b.mig.start)
        assert used & mask == 0, "MIG instances overlap"
        assert b.mig.start in prof.starts
        used |= mask
    return used


def test_h100_holds_seven_1g_10gb():
    wl = [make_workload(f"w{k}").podset("p", mig="1g.10gb").build() for k in range(8)]
    sc = Scenario(h100_mig(), wl)
    last = sc.run()
    placed = [w for w in (f"w{k}" for k in range(8)) if sc.bound(w)]
    assert len(placed) == 7
    binds = sc.binds()
    assert sorted(b.mig.start for b in binds) == [0, 1, 2, 3, 4, 5, 6]
    slots_of(binds)
    missing = next(w for w in (f"w{k}" for k in range(8)) if not sc.bound(w))
    assert "no free MIG slot for 1g.10gb" in last.pending_for(missing).message


@pytest.mark.parametrize(
    "layout",
    [
        ["3g.40gb", "3g.40gb"],
        ["4g.40gb", "3g.40gb"],
        ["4g.40gb", "2g.20gb", "1g.10gb"],
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
        ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"],
        ["1g.20gb", "1g.20gb", "1g.20gb", "1g.10gb"],
        ["7g.80gb"],
    ],
)
def test_mixed_valid_layouts_fit(layout):
    wl = [make_workload(f"w{k}").podset("p", mig=p).created(float(k)).build() for k, p in enumerate(layout)]
    sc = Scenario(h100_mig(), wl, profile="binpack")
    sc.run()
    assert all(sc.bound(f"w{k}") == 1 for k in range(len(layout))), layout
    slots_of(sc.binds())


@pytest.mark.parametrize(
    "layout",
    [
        ["4g.40gb", "4g.40gb"],
        ["7g.80gb", "1g.10gb"],
        ["3g.40gb", "3g.40gb", "1g.10gb"],
        ["4g.40gb", "2g.20gb", "2g.20gb"],
    ],
)
def test_invalid_layouts_never_fit(layout):
    wl = [make_workload(f"w{k}").podset("p", mig=p).created(float(k)).build() for k, p in enumerate(layout)]
    sc = Scenario(h100_mig(), wl, profile="binpack")
    sc.run()
    assert sum(sc.bound(f"w{k}") for k in range(len(layout))) == len(layout) - 1
    slots_of(sc.binds())


def test_small_slices_keep_large_placements_open():
    wl = [
        make_workload("small").podset("p", mig="1g.10gb").build(),
        make_workload("big").podset("p", mig="4g.40gb").created(1.0).build(),
    ]
    sc = Scenario(h100_mig(), wl)
    sc.run()
    assert sc.bound("small") == 1 and sc.bound("big") == 1


def test_geometries_of_known_models():
    a40 = resolve_geometry("NVIDIA-A100-SXM4-40GB", 40960)
    assert a40 is not None and set(a40.profiles) >= {
        "1g.5gb",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    }
    assert a40.profiles["1g.10gb"].slots == 2 and a40.profiles["1g.10gb"].starts == (0, 2, 4, 6)
    a80 = resolve_geometry("A100-SXM4-80GB", 81920)
    assert a80 is not None and a80.profiles["1g.10gb"].slots == 1
    h200 = resolve_geometry("NVIDIA-H200", 143771)
    assert h200 is not None and "7g.141gb" in h200.profiles
    assert resolve_geometry("Tesla-T4", 15360) is None


def test_unknown_mig_profile_is_rejected():
    with pytest.raises(SpecError, match=r"unknown MIG profile '9g\.99gb'"):
        GpuRequest.mig("9g.99gb")


def test_profile_of_another_model_pends_with_reason():
    wl = [make_workload("w").podset("p", mig="1g.5gb").build()]  # an A100-40GB profile
    sc = Scenario(h100_mig(), wl)
    last = sc.run()
    assert sc.bound("w") == 0
    assert "no free MIG slot for 1g.5gb" in last.pending_for("w").message
