"""Translation of resource.k8s.io objects: pools, roles, claims, and the allocation status written."""

from __future__ import annotations

import pytest

from dra_kube import device_classes, dgx_slices, mig_slices, pairs_template
from phalanx.core.dra import ClaimAllocation, DeviceResult
from phalanx.core.errors import SpecError
from phalanx.k8s.read.dra import allocation_of, parse_claim, pod_claim_names, status_of
from phalanx.spec.dra import NIC_DRIVERS, node_devices, parse_slices


def _classes() -> dict:
    return {c["metadata"]["name"]: c for c in device_classes()}


def test_complete_pools_become_gpus_and_nics_of_their_node():
    devs = parse_slices([*dgx_slices("a"), *mig_slices("m")], NIC_DRIVERS)
    assert not devs.problems
    gpus, nics = node_devices(devs.by_node["a"])
    assert [g.index for g in gpus] == list(range(8)) and {g.model for g in gpus} == {"H100"}
    assert [g.pcie_switch for g in gpus] == [0, 0, 1, 1, 2, 2, 3, 3]  # by PCIe root
    assert [(n.index, n.pcie_switch) for n in nics] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert gpus[0].memory_mib == 81920
    (mig_gpu,), _ = node_devices(devs.by_node["m"])
    assert mig_gpu.mig_enabled  # partitions published beside it: a MIG GPU to the core
    migs = [d for d in devs.by_node["m"] if d.role == "mig"]
    assert sorted(d.mig for d in migs) == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert len(devs.counter_sets) == 1 and devs.counter_sets[0].counters["memory-slice-7"] == 1000


def test_incomplete_and_invalid_pools_are_left_out_and_named():
    two = mig_slices("m")  # a pool of two slices
    devs = parse_slices([two[1]], NIC_DRIVERS)
    assert (
        "ResourcePool gpu.nvidia.com/m: incomplete, 1 of 2 slices"
        in devs.problems["ResourcePool gpu.nvidia.com/m"]
    )
    dup = dgx_slices("a")[0]
    dup["spec"]["devices"].append(dict(dup["spec"]["devices"][0]))
    bad = parse_slices([dup], NIC_DRIVERS)
    assert "a device name appears twice" in bad.problems["ResourcePool gpu.nvidia.com/a"]


def test_claims_get_their_class_selectors_and_bad_ones_are_named():
    tmpl = pairs_template("t", pairs=1)
    obj = {"metadata": {"name": "c", "namespace": "ns"}, "spec": tmpl["spec"]["spec"]}
    claim = parse_claim(obj, _classes(), shared=False)
    gpus = claim.requests[0].exact
    assert gpus is not None and gpus.count == 2 and "type == 'gpu'" in gpus.selectors[0]
    assert claim.constraints[0].match_attribute == "resource.kubernetes.io/pcieRoot"
    obj["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nope"
    with pytest.raises(
        SpecError, match=r"ResourceClaim ns/c: request gpus-0: deviceClassName.*'nope' does not exist"
    ):
        parse_claim(obj, _classes(), shared=False)
    obj["spec"]["devices"]["requests"][0]["exactly"] |= {
        "deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": "device.("}}],
    }
    with pytest.raises(SpecError, match="ResourceClaim ns/c: request gpus-0: CEL selector does not compile"):
        parse_claim(obj, _classes(), shared=False)


def test_pod_claim_names_and_the_status_written_round_trip():
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "d", "resourceClaimTemplateName": "t"},
                {"name": "s", "resourceClaimName": "shared"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "d", "resourceClaimName": "pod-d-abcde"}]},
    }
    assert pod_claim_names(pod) == [("d", "pod-d-abcde", False), ("s", "shared", True)]
    del pod["status"]
    assert pod_claim_names(pod)[0] == ("d", "", False)  # not made yet: the pod waits
    alloc = ClaimAllocation(
        "ns/c",
        "a",
        (
            DeviceResult(
                "gpu", "gpu.nvidia.com", "a", "gpu-0", {"gpu.nvidia.com/memory": 20 * 2**30 * 1000}, "id-1"
            ),
        ),
    )
    claim = {
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": 1}}}],
            }
        }
    }
    classes = _classes()
    classes["gpu.nvidia.com"]["spec"]["config"] = [
        {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"y": 2}}}
    ]
    status = status_of(alloc, {}, "a", claim, classes)
    (res,) = status["devices"]["results"]
    assert res == {
        "request": "gpu",
        "driver": "gpu.nvidia.com",
        "pool": "a",
        "device": "gpu-0",
        "consumedCapacity": {"memory": str(20 * 2**30)},
        "shareID": "id-1",
    }
    assert [c["source"] for c in status["devices"]["config"]] == ["FromClass", "FromClaim"]
    assert status["devices"]["config"][0]["requests"] == ["gpu"]
    status["nodeSelector"] = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "values": ["a"]}]}]
    }
    back = allocation_of({"metadata": {"name": "c", "namespace": "ns"}, "status": {"allocation": status}})
    assert back == alloc
