"""The Kubernetes adapter against the in-process fake API server, through the real client."""

from __future__ import annotations

import json
import time

import pytest

from fakeapi import FakeApi
from kube_objects import node, pod, pod_group, queue
from phalanx.k8s.act.executor import Executor
from phalanx.k8s.client.api import Api
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.loop.scheduler import Scheduler
from phalanx.k8s.read.pods import timestamp
from phalanx.profiles import load_profile

OURS = "scheduling.phalanx.io/v1alpha1"


@pytest.fixture
def fake():
    f = FakeApi(timeout_s=0.6).start()
    yield f
    f.stop()


def scheduler(fake: FakeApi, profile: str = "phalanx", identity: str = "a", **kw) -> Scheduler:
    api = Api.connect(url=fake.url, timeout_s=0.3)
    s = Scheduler(
        api,
        AdapterConfig(profile=profile),
        load_profile(profile),
        identity=identity,
        executor=Executor(api, backoff=0.01, attempts=4),
        **kw,
    )
    s.start()
    fake.clients.append(s.close)  # closed with the fake at the latest, even after a failed assertion
    assert s.wait_synced()
    return s


def synced(s: Scheduler, fake: FakeApi, timeout: float = 5.0) -> None:
    """Wait until the scheduler's store holds what the fake holds (same resourceVersions)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        want = {
            (o["metadata"].get("namespace"), o["metadata"]["name"], o["metadata"]["resourceVersion"])
            for o in fake.all("v1", "pods")
        }
        have = {
            (o["metadata"].get("namespace"), o["metadata"]["name"], o["metadata"]["resourceVersion"])
            for o in s.store.items("pods")
        }
        want_n = {o["metadata"]["name"] for o in fake.all("v1", "nodes")}
        have_n = {o["metadata"]["name"] for o in s.store.items("nodes")}
        if want == have and want_n == have_n:
            return
        time.sleep(0.02)
    raise AssertionError("the scheduler's cache did not catch up with the API server")


def step(s: Scheduler, fake: FakeApi):
    synced(s, fake)
    report = s.step()
    s.explainer.flush()  # explanations are written in the background
    return report


def pods_of(fake: FakeApi) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in fake.all("v1", "pods")}


def events(fake: FakeApi, name: str) -> list[tuple[str, str]]:
    return [
        (e["reason"], e["message"]) for e in fake.all("v1", "events") if e["involvedObject"]["name"] == name
    ]


def cluster(fake: FakeApi, n: int = 3, gpus: int = 8) -> None:
    for k in range(n):
        fake.put(node(f"n{k}", gpus=gpus))


def gang(fake: FakeApi, name: str, size: int, gpus: int = 8, queue_name: str = "") -> None:
    fake.put(pod_group(name, size, queue=queue_name))
    for k in range(size):
        fake.put(pod(f"{name}-{k}", gpus=gpus, annotations={"scheduling.k8s.io/group-name": name}))


def test_gang_fractions_and_foreign_pods_are_placed_with_device_annotations(fake):
    cluster(fake)
    fake.put(pod("other", gpus=2, scheduler="default-scheduler", node="n0"))
    gang(fake, "train", 2)
    for k in range(2):
        fake.put(pod(f"infer-{k}", annotations={"gpu-fraction": "0.5"}))
    s = scheduler(fake)
    report = step(s, fake)
    assert len(report.outcome.bound) == 4 and not report.outcome.broken
    pods = pods_of(fake)
    gang_nodes = {pods[f"train-{k}"]["spec"]["nodeName"] for k in range(2)}
    assert len(gang_nodes) == 2 and "n0" not in gang_nodes  # n0 has only 6 GPUs left
    for k in range(2):
        notes = pods[f"train-{k}"]["metadata"]["annotations"]
        assert notes["phalanx.io/gpu-devices"] == "0,1,2,3,4,5,6,7"
        assert notes["phalanx.io/node"] == pods[f"train-{k}"]["spec"]["nodeName"]
    a, b = (pods[f"infer-{k}"] for k in range(2))
    assert a["spec"]["nodeName"] == b["spec"]["nodeName"]
    assert (
        a["metadata"]["annotations"]["phalanx.io/gpu-devices"]
        == b["metadata"]["annotations"]["phalanx.io/gpu-devices"]
    )
    assert a["metadata"]["annotations"]["phalanx.io/gpu-fraction"] == "0.5"
    assert (
        "Scheduled",
        f"Bound to {a['spec']['nodeName']} GPUs {a['metadata']['annotations']['phalanx.io/gpu-devices']}",
    ) in events(fake, "infer-0")
    pg = fake.get(OURS, "podgroups", "train", "default")
    assert pg["status"]["conditions"][0]["status"] == "True"
    assert all(v == 1 for v in fake.binds.values())
    s.stop()


def test_binds_survive_500s_and_timeouts_and_never_bind_twice(fake):
    cluster(fake, 2)
    gang(fake, "g", 2)
    fake.fail("POST", r"/pods/g-0/binding", status=500, times=2)
    fake.fail("POST", r"/pods/g-1/binding", status=0, applied=True)  # bound, but the reply is lost
    fake.fail("PATCH", r"/pods/g-1$", status=409)  # a conflicting write on the annotation
    s = scheduler(fake)
    report = step(s, fake)
    assert sorted(report.outcome.bound) == ["default/g-0", "default/g-1"]
    assert fake.binds == {"default/g-0": 1, "default/g-1": 1}
    # the next cycles see them bound and do nothing
    assert not step(s, fake).result.binds
    s.stop()


def test_watch_drops_and_410_are_survived(fake):
    cluster(fake, 1)
    s = scheduler(fake)
    fake.drop_watches()
    fake.put(pod("after-drop", gpus=1))
    report = step(s, fake)
    assert report.outcome.bound == ["default/after-drop"]
    relists = s.store.relists
    informer = s.informers.running["pods"]
    # the informer applies an event to the store before it notes the event's version: rewinding
    # before it noted the last one would be overwritten (seen under load), so wait for it first
    latest = max(int(o["metadata"]["resourceVersion"]) for o in fake.all("v1", "pods"))
    deadline = time.monotonic() + 5.0
    while int(informer.resource_version or 0) < latest:
        assert time.monotonic() < deadline, "the pods informer never noted the latest pod's version"
        time.sleep(0.01)
    informer.resource_version = "1"  # as if the pods' watch had fallen far behind...
    fake.compact()  # ...and the history were gone: resuming from that version answers 410
    fake.put(pod("after-410", gpus=1))
    report = step(s, fake)
    assert report.outcome.bound == ["default/after-410"]
    assert s.store.relists > relists
    s.stop()


class Crash(BaseException):  # like SystemExit: nothing in the scheduler catches it
    pass


def test_restart_between_binds_finishes_the_gang_and_binds_nothing_twice(fake):
    cluster(fake, 2)
    gang(fake, "g", 2)
    a = scheduler(fake, identity="a")
    real_bind = a.api.bind
    calls = []

    def crash_on_second(ns, name, uid, node, notes=None):
        calls.append(name)
        if len(calls) == 2:
            raise Crash("scheduler killed mid-gang")
        return real_bind(ns, name, uid, node, notes)

    a.api.bind = crash_on_second
    synced(a, fake)
    with pytest.raises(Crash):
        a.step()
    a.stop()
    pods = pods_of(fake)
    assert sum(bool(p["spec"].get("nodeName")) for p in pods.values()) == 1  # half a gang on the API...
    plan = json.loads(pods["g-0"]["metadata"]["annotations"]["phalanx.io/gang-plan"])
    chosen = {t.split("/")[1]: e["phalanx.io/node"] for t, e in plan["tasks"].items()}
    assert set(chosen) == {"g-0", "g-1"}
    b = scheduler(fake, identity="b")
    report = step(b, fake)
    assert report.world.unfinished and report.outcome.bound  # ...which the next scheduler completes
    pods = pods_of(fake)
    assert {n: p["spec"]["nodeName"] for n, p in pods.items()} == chosen
    assert all(p["metadata"]["annotations"]["phalanx.io/node"] == chosen[n] for n, p in pods.items())
    assert all(v == 1 for v in fake.binds.values())
    b.stop()


def test_a_gang_that_cannot_complete_is_undone(fake):
    cluster(fake, 2)
    gang(fake, "g", 2)
    fake.fail("POST", r"/pods/g-1/binding", status=404)  # the pod vanished under us
    s = scheduler(fake)
    report = step(s, fake)
    assert "g-1" in report.outcome.broken["default/g"]
    pods = pods_of(fake)
    assert "g-0" not in pods or not pods["g-0"]["spec"].get("nodeName")  # evicted: no half gang left
    assert "phalanx.io/node" not in pods["g-1"]["metadata"]["annotations"]
    s.stop()


def test_bad_objects_get_events_and_conditions_and_the_rest_is_scheduled(fake):
    cluster(fake, 1)
    fake.put(queue("team", 4))
    fake.put(pod("malformed", annotations={"gpu-fraction": "abc"}))
    fake.put(pod("too-big", annotations={"gpu-fraction": "1.5"}))
    fake.put(pod("lost", gpus=1, labels={"kai.scheduler/queue": "nope"}))
    fake.put(pod_group("short", 3, queue="team"))
    fake.put(pod("short-0", gpus=1, annotations={"scheduling.k8s.io/group-name": "short"}))
    fake.put(pod("fine", gpus=1, labels={"phalanx.io/queue": "team"}))
    s = scheduler(fake)
    report = step(s, fake)
    assert report.outcome.bound == ["default/fine"]
    assert any("expected a number" in m for _, m in events(fake, "malformed"))
    assert any("(0, 1]" in m for _, m in events(fake, "too-big"))
    assert any("queue 'nope' does not exist" in m for _, m in events(fake, "lost"))
    cond = fake.get(OURS, "podgroups", "short", "default")["status"]["conditions"][0]
    assert cond["status"] == "False" and "minMember 3 exceeds the 1 pod(s)" in cond["message"]
    assert fake.get(OURS, "queues", "team")["status"]["allocated"]["gpu"] == "1"
    s.stop()


def test_pending_reasons_are_explained_once(fake):
    cluster(fake, 1, gpus=4)
    gang(fake, "big", 2, gpus=4)
    s = scheduler(fake)
    step(s, fake)
    step(s, fake)
    mine = events(fake, "big-0")
    assert len(mine) == 1 and mine[0][0] == "FailedScheduling"
    assert "insufficient free GPU" in mine[0][1] and "node(s)" in mine[0][1]
    s.stop()


def test_only_the_lease_holder_schedules():
    fake = FakeApi(timeout_s=0.6).start()
    now = [1000.0]
    a = scheduler(fake, identity="a", clock=lambda: now[0])
    b = scheduler(fake, identity="b", clock=lambda: now[0])
    assert a.elector.try_lead() and not b.elector.try_lead()
    now[0] += 5
    assert a.elector.try_lead() and not b.elector.try_lead()  # renewed
    now[0] += 30  # a stopped renewing
    assert b.elector.try_lead() and not a.elector.try_lead()
    lease = fake.get("coordination.k8s.io/v1", "leases", "phalanx-scheduler", "phalanx-system")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    a.stop()
    b.stop()
    fake.stop()


def test_restart_rebuilds_devices_from_annotations(fake):
    cluster(fake, 1, gpus=2)
    fake.put(pod("half-a", annotations={"gpu-fraction": "0.5"}))
    s = scheduler(fake)
    step(s, fake)
    s.stop()
    first = pods_of(fake)["half-a"]["metadata"]["annotations"]["phalanx.io/gpu-devices"]
    fake.put(pod("half-b", annotations={"gpu-fraction": "0.5"}))
    fake.put(pod("whole", gpus=1))
    t = scheduler(fake, identity="t")
    report = step(t, fake)
    assert sorted(report.outcome.bound) == ["default/half-b", "default/whole"]
    pods = pods_of(fake)
    assert pods["half-b"]["metadata"]["annotations"]["phalanx.io/gpu-devices"] == first
    assert pods["whole"]["metadata"]["annotations"]["phalanx.io/gpu-devices"] != first
    assert fake.binds["default/half-a"] == 1
    t.stop()


def test_metrics_and_health_endpoints(fake):
    import httpx2

    from phalanx.k8s.view.server import serve

    cluster(fake, 1)
    fake.put(pod("p", gpus=1))
    s = scheduler(fake)
    step(s, fake)
    server = serve(0, s.metrics, s.ready)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    assert httpx2.get(f"{base}/healthz").status_code == 200
    assert httpx2.get(f"{base}/readyz").status_code == 200
    text = httpx2.get(f"{base}/metrics").text
    assert "phalanx_binds_total 1.0" in text and "phalanx_cycle_seconds_count 1.0" in text
    assert 'phalanx_pool_gpu_allocated_ratio{pool="H100"} 0.125' in text
    # the cycle by phase: each observed once, and the phases add up to the cycle
    import re

    sums = dict(re.findall(r'phalanx_cycle_phase_seconds_sum\{phase="(\w+)"\} (\S+)', text))
    assert sorted(sums) == ["act", "decide", "read", "report"]
    assert all(f'phalanx_cycle_phase_seconds_count{{phase="{k}"}} 1.0' in text for k in sums)
    (total,) = re.findall(r"phalanx_cycle_seconds_sum (\S+)", text)
    assert abs(sum(float(v) for v in sums.values()) - float(total)) < 1e-6
    server.shutdown()
    s.stop()


def test_the_run_loop_leads_and_schedules_on_its_own(fake):
    import threading

    cluster(fake, 1)
    s = scheduler(fake)
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    fake.put(pod("late", gpus=1))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (fake.get("v1", "pods", "late", "default") or {}).get(
        "spec", {}
    ).get("nodeName"):
        time.sleep(0.05)
    s.stop()
    t.join(timeout=5)
    assert fake.get("v1", "pods", "late", "default")["spec"]["nodeName"] == "n0"
    assert (
        fake.get("coordination.k8s.io/v1", "leases", "phalanx-scheduler", "phalanx-system")["spec"][
            "holderIdentity"
        ]
        == "a"
    )


def test_status_shows_queues_gpus_and_why_work_waits(fake):
    from phalanx.k8s.view.status import collect

    cluster(fake, 1, gpus=2)
    fake.put(queue("team", 2))
    fake.put(
        pod(
            "half",
            annotations={
                "gpu-fraction": "0.5",
                "phalanx.io/gpu-devices": "1",
                "phalanx.io/gpu-fraction": "0.5",
            },
            node="n0",
            labels={"phalanx.io/queue": "team"},
        )
    )
    gang(fake, "big", 2, gpus=2, queue_name="team")
    api = Api.connect(url=fake.url, timeout_s=0.3)
    st = collect(api, AdapterConfig(profile="phalanx-queues"))
    team = next(q for q in st.queues if q["queue"] == "team")
    assert team["used_gpu"] == 0.5 and team["deserved_gpu"] == 2
    gpu1 = next(g for g in st.gpus if g["gpu"] == 1)
    assert gpu1["held_by"] == "default/half (0.5)" and gpu1["free"] == "0.5"
    assert any(p["workload"] == "default/big" and "quota" in p["why"] for p in st.pending)


def test_status_cli_and_its_bad_input(fake, tmp_path):
    from typer.testing import CliRunner

    from phalanx.cli.main import app

    cluster(fake, 1, gpus=2)
    fake.put(pod("waiting", gpus=4))
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
        f"apiVersion: v1\nkind: Config\nclusters: [{{name: f, cluster: {{server: '{fake.url}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: f, context: {cluster: f, user: u}}]\ncurrent-context: f\n"
    )
    r = CliRunner(env={"COLUMNS": "250"}).invoke(
        app, ["status", "--kubeconfig", str(cfg), "--profile", "phalanx"]
    )
    assert r.exit_code == 0, r.output
    assert "default/waiting" in r.output and "not enough GPUs on 1 node(s)" in r.output
    r = CliRunner().invoke(app, ["status", "--kubeconfig", str(tmp_path / "none")])
    assert r.exit_code == 2 and "cannot read file" in r.output
    r = CliRunner().invoke(app, ["scheduler", "--kubeconfig", str(cfg), "--cycle-seconds", "0"])
    assert r.exit_code == 2 and "--cycle-seconds" in r.output
    r = CliRunner().invoke(app, ["scheduler", "--kubeconfig", str(cfg), "--topology-levels", "rack"])
    assert r.exit_code == 2 and "level=label-key" in r.output


def test_a_refused_eviction_keeps_the_preemptor_off_the_node(fake):
    cluster(fake, 1, gpus=1)
    fake.put(pod("low", gpus=1))
    s = scheduler(fake, profile="phalanx-queues")
    assert step(s, fake).outcome.bound == ["default/low"]
    fake.put(pod("high", gpus=1, priority=100))
    fake.fail("POST", r"/pods/low/eviction", status=429, times=4)  # a PodDisruptionBudget says no
    report = step(s, fake)
    assert report.result.evictions and report.outcome.not_evicted == ["default/low"]
    assert "default/high" in report.outcome.deferred and not pods_of(fake)["high"]["spec"].get("nodeName")
    report = step(s, fake)  # the budget allows it now...
    assert report.outcome.evicted == ["default/low"] and report.outcome.deferred == ["default/high"]
    assert "low" not in pods_of(fake)
    report = step(s, fake)  # ...and once the victim is gone, the preemptor is bound
    assert report.outcome.bound == ["default/high"]
    assert any(r == "Preempted" for r, _ in events(fake, "low"))


def test_a_quiet_cluster_is_not_cycled_again_until_something_changes(fake):
    """Issues 25 and 34: a cycle with nothing new costs nothing; work that only waits for capacity
    waits for a change (or the quiet recheck), not for the next period."""
    cluster(fake, 1)
    fake.put(pod("p", gpus=1))
    s = scheduler(fake)
    step(s, fake)  # binds p: the next cycle must run (the bind is assumed until the watch shows it)
    assert not s.quiet()
    step(s, fake)  # sees p bound, nothing waits
    assert s.quiet()
    fake.put(pod("big", gpus=16))  # never fits: it waits
    deadline = time.monotonic() + 5
    while s.quiet() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not s.quiet()  # the store changed
    report = step(s, fake)
    assert report.result.pending and report.result.wake is None
    assert s.quiet()  # `big` waits for capacity: nothing but a change can place it
    fake.delete("v1", "pods", "big", "default")
    deadline = time.monotonic() + 5
    while any(p["metadata"]["name"] == "big" for p in s.store.items("pods")) and time.monotonic() < deadline:
        time.sleep(0.02)
    step(s, fake)
    assert s.quiet()
    s.last_cycle -= s.cfg.quiet_recheck_s  # and a quiet cluster is still looked at now and then
    assert not s.quiet()
    s.stop()


def test_a_preemptor_held_by_min_runtime_sleeps_the_loop_until_the_guard_ends(fake, tmp_path):
    """Issue 34: the core's wake-up, not a cycle every period, brings the preemption when the guard ends."""
    prof = tmp_path / "held.yaml"
    prof.write_text(
        "name: held\ntie_break: name\nactions:\n  - name: allocate\n"
        "  - name: preempt\n    args: {min_runtime: 600}\norder:\n  - name: priority\n"
    )
    now = [1_795_946_500.0]  # 100 s after the pods' creationTimestamp, where low's run is counted from
    cluster(fake, 1, gpus=1)
    fake.put(pod("low", gpus=1))
    s = scheduler(fake, profile=str(prof), clock=lambda: now[0])
    step(s, fake)
    step(s, fake)  # sees low bound
    fake.put(pod("high", gpus=1, priority=100))
    deadline = time.monotonic() + 5
    while s.quiet() and time.monotonic() < deadline:
        time.sleep(0.02)
    now[0] += 10
    report = step(s, fake)
    assert not report.result.evictions and report.result.wake is not None
    assert "min_runtime" in report.result.wake.why and now[0] < s.wake_at <= now[0] + 600
    assert s.quiet()  # high waits, but nothing but the clock can change that: no cycle before then
    now[0] = s.wake_at
    assert not s.quiet()
    assert step(s, fake).outcome.evicted == ["default/low"]
    s.stop()


def test_a_gang_undone_by_a_refused_bind_says_why_on_its_pods(fake):
    """Placed, then a bind refused (400): the gang is undone; its pods must not wait without a word."""
    cluster(fake, 1, gpus=4)
    gang(fake, "g", 2, gpus=2)
    fake.fail("POST", "/pods/g-1/binding", status=400)
    s = scheduler(fake)
    report = step(s, fake)
    assert "default/g" in report.outcome.broken
    s.explainer.flush()
    told = dict(events(fake, "g-1"))
    assert "could not be bound" in told.get("BindFailed", ""), told
    s.stop()


def test_gangs_are_bound_while_the_cycle_still_decides_and_never_twice(fake, monkeypatch):
    """Issue 34: a burst's first gangs go out as the core places them, not after the whole burst."""
    import phalanx.k8s.loop.scheduler as loop

    cluster(fake, 4)
    for k in range(3):
        gang(fake, f"g{k}", 2, gpus=4)
    fake.put(pod("share", annotations={"gpu-fraction": "0.5"}))  # a share: bound at the cycle's end
    bound_during: list[int] = []
    real = loop.decide

    def deciding(*args, **kw):
        decision = real(*args, **kw)
        kw["stream"].wait()  # what was handed out before the cycle ended, all done by now
        bound_during.append(sum(fake.binds.values()))
        return decision

    monkeypatch.setattr(loop, "decide", deciding)
    s = scheduler(fake)
    report = step(s, fake)
    assert bound_during == [6], "the three gangs were bound before the cycle ended, the share not yet"
    assert sorted(report.outcome.bound) == sorted(b.task for b in report.result.binds)
    assert len(report.outcome.bound) == 7 and set(fake.binds.values()) == {1}
    assert all(p["spec"].get("nodeName") for p in pods_of(fake).values())


def share(name: str) -> dict:
    """Half a GPU, as the admission webhook leaves it (the ConfigMap its env comes from named)."""
    return pod(name, annotations={"gpu-fraction": "0.5", "phalanx.io/gpu-configmap": f"{name}-gpu"})


def test_a_share_waiting_for_its_reservation_pod_is_not_planned_again_while_the_watch_lags(fake):
    """A share planned onto a GPU waits for its reservation pod. The next cycle may read a store that
    does not show the plan yet (a watch behind, as under load): it must still see the share there
    (assumed, as binds are), not plan it anew, and put the next share beside it."""
    fake.put(node("n0", gpus=4))
    fake.put(share("s1"))
    api = Api.connect(url=fake.url, timeout_s=0.3)
    cfg = AdapterConfig(profile="phalanx", gpu_shares="reservation")
    executor = Executor(api, backoff=0.01, attempts=4)
    now = timestamp("2026-11-29T10:00:30Z")  # 30 s after the fake's objects were made: no timeout
    s = Scheduler(api, cfg, load_profile("phalanx"), identity="a", executor=executor, clock=lambda: now)
    s.start()
    fake.clients.append(s.close)
    assert s.wait_synced()
    synced(s, fake)
    before = fake.lag()  # the watches send nothing written from here on
    fake.put(share("s2"))
    first = s.step()  # reads s1 alone
    assert first.outcome.deferred == ["default/s1"] and "default/s1" in first.outcome.planned
    (b1,) = first.result.binds
    fake.catch_up(before + 1)  # s2 arrives; s1's plan and its reservation pod do not
    deadline = time.monotonic() + 5
    while s.store.get("pods", "default/s2") is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert s.store.get("pods", "default/s2") is not None
    assert "phalanx.io/gang-plan" not in (s.store.get("pods", "default/s1") or {})["metadata"].get(
        "annotations", {}
    )
    second = s.step()
    (b2,) = second.result.binds
    assert b2.task == "default/s2" and (b2.node, b2.gpus) == (b1.node, b1.gpus), "beside s1"
    plans = [r for r in fake.requests if r == ("PATCH", "/api/v1/namespaces/default/pods/s1")]
    assert len(plans) == 1, "s1 was planned once"
    made = [r for r in fake.requests if r == ("POST", "/api/v1/namespaces/phalanx-system/pods")]
    assert len(made) == 1, f"one reservation pod for the two shares: {made}"
    fake.catch_up()
