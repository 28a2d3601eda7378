"""DRA on a real kube-apiserver with its resourceclaim controller: ResourceSlices as NVIDIA's GPU
driver and DraNet publish them, claims from templates, allocations written, pods bound whole."""

from __future__ import annotations

import pytest

from dra_kube import (
    device_classes,
    dgx_slices,
    gpu_device,
    mig_slices,
    nic_device,
    pairs_template,
    slice_,
    template,
    with_claim,
)
from e2e_kube import Kube, running, wait_for
from kube_objects import node, pod
from phalanx.k8s.client.kinds import (
    DEVICE_CLASSES,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)

pytestmark = pytest.mark.e2e
DRA_KINDS = (RESOURCE_SLICES, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, DEVICE_CLASSES)


@pytest.fixture
def dra(kube: Kube):
    """A clean DRA slate: no slices, classes, templates or claims (the kube fixture cleans the rest)."""

    def clean() -> None:
        for k in DRA_KINDS:
            for o in kube.api.list(k)[0]:
                meta = o["metadata"]
                kube.api.delete(k, meta["name"], meta.get("namespace"))
        wait_for("no claims", lambda: not kube.api.list(RESOURCE_CLAIMS)[0], timeout=30)

    clean()
    for c in device_classes():
        kube.create(c)
    yield kube
    clean()


def _bare(name: str) -> dict:
    """A node whose GPUs only DRA publishes (no nvidia.com/gpu, no GPU Feature Discovery labels)."""
    n = node(name, gpus=0)
    n["metadata"]["labels"] = {"topology.phalanx.io/rack": "r1"}
    return n


def _claims_of(kube: Kube, pod_name: str) -> list[dict]:
    return [
        c
        for c in kube.api.list(RESOURCE_CLAIMS)[0]
        if any(r.get("name") == pod_name for r in (c.get("status") or {}).get("reservedFor") or [])
    ]


def test_a_gang_of_two_pods_with_gpu_nic_pairs_is_allocated_and_bound_whole(dra: Kube) -> None:
    kube = dra
    for n in ("a", "b"):
        kube.api.create("nodes", _bare(n))
        for s in dgx_slices(n):
            kube.create(s)
    kube.create(pairs_template("gpu-nic-pairs"))
    for k in range(2):
        kube.create(
            with_claim(pod(f"train-{k}", annotations={"phalanx.io/pod-group": "train"}), "gpu-nic-pairs")
        )
    with running(kube):
        wait_for("both bound", lambda: all(kube.node_of(f"train-{k}") for k in range(2)), timeout=40)
    assert {kube.node_of(f"train-{k}") for k in range(2)} == {"a", "b"}
    for k in range(2):
        (claim,) = _claims_of(kube, f"train-{k}")
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len(results) == 12
        slices = {s["metadata"]["name"]: s for s in kube.api.list(RESOURCE_SLICES)[0]}
        root = {}
        for r in results:
            sl = slices[f"{r['pool']}-{'gpu' if r['driver'] == 'gpu.nvidia.com' else 'nic'}"]
            dev = next(d for d in sl["spec"]["devices"] if d["name"] == r["device"])
            root.setdefault(r["request"].split("-")[1], set()).add(
                dev["attributes"]["resource.kubernetes.io/pcieRoot"]["string"]
            )
        assert all(len(v) == 1 for v in root.values())  # each pair's GPUs and NIC on one PCIe root
        sel = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
        assert sel["values"] == [kube.node_of(f"train-{k}")]
        notes = kube.pods()[f"train-{k}"]["metadata"]["annotations"]
        assert (
            notes["phalanx.io/gpu-devices"] == "0,1,2,3,4,5,6,7"
            and notes["phalanx.io/rdma-nics"] == "0,1,2,3"
        )
    # the pods go: the resourceclaim controller deletes the claims made from the template
    for k in range(2):
        kube.force_delete_pod(f"train-{k}")
    wait_for("claims released", lambda: not kube.api.list(RESOURCE_CLAIMS)[0], timeout=40)


def test_a_gang_that_does_not_fit_allocates_no_claim(dra: Kube) -> None:
    kube = dra
    kube.api.create("nodes", _bare("a"))
    for s in dgx_slices("a"):
        kube.create(s)
    kube.create(pairs_template("gpu-nic-pairs"))
    for k in range(2):  # two pods of 8 GPUs, one node of 8
        kube.create(
            with_claim(pod(f"train-{k}", annotations={"phalanx.io/pod-group": "train"}), "gpu-nic-pairs")
        )
    with running(kube) as s:
        wait_for("claims made", lambda: len(kube.api.list(RESOURCE_CLAIMS)[0]) == 2, timeout=30)
        wait_for("the claims watched", lambda: len(s.store.items(RESOURCE_CLAIMS.key)) == 2, timeout=20)
        seen, gen = s.cycles, s.store.generation
        # the change brings a cycle (perhaps already run): one that read the store with the claims
        wait_for("a cycle with them", lambda: s.cycles > seen or (s.quiet_at or -1) >= gen, timeout=20)
        s.explainer.flush()
        # a cycle before the slices were watched said "gpu:" (a bare node); the reason moves to DRA's
        said: list[str] = []

        def dra_reason() -> str | None:
            said[:] = [m for r, m in kube.events("train-0") if r == "FailedScheduling"]
            return next((m for m in said if "dra:" in m), None)

        try:
            wait_for("the DRA reason", dra_reason, timeout=20)
        except AssertionError as e:
            raise AssertionError(f"{e}; said: {said}") from None
    assert not any(kube.node_of(f"train-{k}") for k in range(2))
    assert all(not (c.get("status") or {}).get("allocation") for c in kube.api.list(RESOURCE_CLAIMS)[0])


def test_shares_by_consumable_capacity_and_a_mig_claim(dra: Kube) -> None:
    kube = dra
    kube.api.create("nodes", _bare("share"))
    kube.create(slice_("share-gpu", "gpu.nvidia.com", "share", [gpu_device(0, 0, "share", shares=True)]))
    kube.api.create("nodes", _bare("mig"))
    for s in mig_slices("mig"):
        kube.create(s)
    shared = [{"cel": {"expression": "device.allowMultipleAllocations"}}]  # a share of a shared GPU
    share = {
        "deviceClassName": "gpu.nvidia.com",
        "selectors": shared,
        "capacity": {"requests": {"memory": "20Gi"}},
    }
    kube.create(template("mem-20g", {"name": "gpu", "exactly": share}))
    mig_select = [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}]
    kube.create(
        template(
            "mig-3g",
            {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": mig_select}},
        )
    )
    for k in range(2):
        kube.create(with_claim(pod(f"infer-{k}"), "mem-20g"))
    kube.create(with_claim(pod("notebook"), "mig-3g"))
    with running(kube):
        wait_for(
            "all bound", lambda: all(kube.node_of(n) for n in ("infer-0", "infer-1", "notebook")), timeout=40
        )
    results = [
        _claims_of(kube, f"infer-{k}")[0]["status"]["allocation"]["devices"]["results"][0] for k in range(2)
    ]
    assert results[0]["device"] == results[1]["device"] == "gpu-0"  # two 20Gi shares of the one GPU...
    assert results[0]["shareID"] != results[1]["shareID"]  # ...each with its own share
    assert results[0]["consumedCapacity"] == {"memory": "20Gi"} or results[0]["consumedCapacity"][
        "memory"
    ] in (
        "21474836480",
        "20Gi",
    )
    (mig,) = _claims_of(kube, "notebook")
    assert mig["status"]["allocation"]["devices"]["results"][0]["device"].startswith("gpu-0-mig-3g40gb-9-")
    notes = kube.pods()["notebook"]["metadata"]["annotations"]
    assert notes["phalanx.io/mig-slice"].startswith("3g.40gb@")


class Crash(BaseException):  # nothing in the scheduler catches it: the process would be gone
    pass


def test_a_restart_after_the_claims_are_written_binds_the_rest_and_allocates_nothing_twice(dra: Kube) -> None:
    from phalanx.k8s.client.api import Api
    from phalanx.k8s.config import AdapterConfig
    from phalanx.k8s.loop.scheduler import Scheduler
    from phalanx.profiles import load_profile

    kube = dra
    for n in ("a", "b"):
        kube.api.create("nodes", _bare(n))
        for s in dgx_slices(n):
            kube.create(s)
    kube.create(pairs_template("gpu-nic-pairs"))
    for k in range(2):
        member = pod(f"train-{k}", annotations={"phalanx.io/pod-group": "train"})
        kube.create(with_claim(member, "gpu-nic-pairs"))
    wait_for("claims made", lambda: len(kube.api.list(RESOURCE_CLAIMS)[0]) == 2, timeout=30)
    wait_for(
        "pods know their claims",
        lambda: all((p.get("status") or {}).get("resourceClaimStatuses") for p in kube.pods().values()),
    )
    api = Api.connect(kubeconfig=str(kube.cp.kubeconfig))
    a = Scheduler(api, AdapterConfig(profile="phalanx", leader_elect=False), load_profile("phalanx"))
    a.start()
    assert a.wait_synced(10)
    wait_for("claims in the cache", lambda: len(a.store.items(RESOURCE_CLAIMS.key)) == 2)
    wait_for("nodes in the cache", lambda: len(a.store.items("nodes")) == 2)
    wait_for("slices", lambda: len(a.store.items(RESOURCE_SLICES.key)) == 4)
    real, calls = api.bind, []

    def crash_on_second(ns, name, uid, node_name, notes=None):
        calls.append(name)
        if len(calls) == 2:
            raise Crash("killed between the binds")
        return real(ns, name, uid, node_name, notes)

    api.bind = crash_on_second  # type: ignore[method-assign]
    with pytest.raises(Crash):
        a.step()
    a.stop()
    claims = {c["metadata"]["name"]: c for c in kube.api.list(RESOURCE_CLAIMS)[0]}
    assert all(c["status"]["allocation"] for c in claims.values())  # both written before any bind...
    assert sum(bool(kube.node_of(f"train-{k}")) for k in range(2)) == 1  # ...one pod bound
    before = {n: c["status"]["allocation"]["devices"]["results"] for n, c in claims.items()}
    with running(kube):
        wait_for("the gang finished", lambda: all(kube.node_of(f"train-{k}") for k in range(2)), timeout=30)
    after = {c["metadata"]["name"]: c for c in kube.api.list(RESOURCE_CLAIMS)[0]}
    assert {n: c["status"]["allocation"]["devices"]["results"] for n, c in after.items()} == before
    for c in after.values():  # each claim reserved for its one pod, on the node its devices are on
        (user,) = c["status"]["reservedFor"]
        term = c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
        assert kube.node_of(user["name"]) == term["matchFields"][0]["values"][0]


def test_a_pod_mixing_device_plugin_gpus_and_a_dra_nic(dra: Kube) -> None:
    """GPUs from the NVIDIA device plugin (nvidia.com/gpu), an RDMA NIC from a DRA driver: both honoured."""
    kube = dra
    kube.api.create("nodes", node("mixed", gpus=8))  # classic GPUs, GFD labels
    kube.create(slice_("mixed-nic", "dra.net", "mixed", [nic_device(k, k) for k in range(4)]))
    kube.create(template("one-nic", {"name": "nic", "exactly": {"deviceClassName": "dranet"}}))
    kube.create(with_claim(pod("mix", gpus=2), "one-nic"))
    with running(kube):
        wait_for("bound", lambda: kube.node_of("mix") == "mixed", timeout=30)
    notes = kube.pods()["mix"]["metadata"]["annotations"]
    assert len(notes["phalanx.io/gpu-devices"].split(",")) == 2
    (claim,) = _claims_of(kube, "mix")
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    assert res["driver"] == "dra.net" and res["device"].startswith("nic-")
    assert notes["phalanx.io/rdma-nics"] == res["device"].split("-")[1]
