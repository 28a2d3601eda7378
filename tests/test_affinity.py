"""Required node affinity: Kubernetes operators, ORed terms, bad terms; the adapter refuses pod affinity."""

import pytest

from builders import Scenario, make_node, make_workload
from kube_objects import node, pod
from phalanx.core.affinity import NodeRequirement, affinity_matches
from phalanx.core.errors import SpecError
from phalanx.k8s.config import AdapterConfig
from phalanx.k8s.read.pods import parse_pod
from phalanx.k8s.read.world import build_world
from phalanx.spec.affinity import node_selector_terms
from phalanx.spec.workloads import parse_workloads

LABELS = {"zone": "a", "gpu-gen": "9", "pool": "train"}


@pytest.mark.parametrize(
    ("key", "op", "values", "expected"),
    [
        ("zone", "In", ("a", "b"), True),
        ("zone", "In", ("b",), False),
        ("zone", "NotIn", ("b",), True),
        ("missing", "NotIn", ("b",), True),  # NotIn matches nodes without the label, as in Kubernetes
        ("pool", "Exists", (), True),
        ("missing", "Exists", (), False),
        ("missing", "DoesNotExist", (), True),
        ("gpu-gen", "Gt", ("8",), True),
        ("gpu-gen", "Lt", ("9",), False),
        ("zone", "Gt", ("1",), False),  # a label that is not an integer never satisfies Gt / Lt
    ],
)
def test_requirement_operators(key, op, values, expected):
    assert NodeRequirement(key, op, values).matches("n1", LABELS) is expected


def test_terms_are_ored_requirements_anded_and_an_empty_term_matches_nothing():
    zone_b = (NodeRequirement("zone", "In", ("b",)),)
    train_a = (NodeRequirement("pool", "In", ("train",)), NodeRequirement("zone", "In", ("a",)))
    by_name = (NodeRequirement("metadata.name", "In", ("n1",), on_field=True),)
    assert affinity_matches("n1", LABELS, (zone_b, train_a))
    assert not affinity_matches("n1", LABELS, (zone_b,))
    assert affinity_matches("n1", {}, (by_name,)) and not affinity_matches("n2", {}, (by_name,))
    assert not affinity_matches("n1", LABELS, ((),))
    assert affinity_matches("n1", LABELS, ())


@pytest.mark.parametrize(
    ("term", "message"),
    [
        ({"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}, "must be one of"),
        ({"matchExpressions": [{"key": "zone", "operator": "In"}]}, "at least one value"),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}, "takes no values"),
        ({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["x"]}]}, "one integer value"),
        ({"matchFields": [{"key": "spec.taints", "operator": "In", "values": ["a"]}]}, "metadata.name"),
        ({"matchLabels": {}}, "unknown field"),
    ],
)
def test_bad_terms_name_the_place(term, message):
    with pytest.raises(SpecError) as e:
        node_selector_terms([term], "w.node_affinity")
    assert "w.node_affinity[0]" in str(e.value) and message in str(e.value)


def test_a_task_lands_only_where_its_affinity_allows_and_says_why_it_waits():
    nodes = [make_node(f"n{i}").gpus(8).label("zone", z).build() for i, z in enumerate("aab")]
    zone_b = ((NodeRequirement("zone", "In", ("b",)),),)
    sc = Scenario(
        nodes,
        [
            make_workload("first").podset("p", 1, gpu=8, affinity=zone_b).build(),
            make_workload("second").podset("p", 1, gpu=1, affinity=zone_b).build(),
        ],
    )
    sc.run()
    assert sc.bind_of("first/p-0").node == "n2"
    pending = sc.pending("second")
    assert pending is not None
    assert "affinity does not match on 2 nodes" in pending.message
    assert "insufficient free GPU" in pending.message


def test_workload_yaml_takes_kubernetes_node_selector_terms():
    terms = [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}]
    data = {"workloads": [{"name": "w", "podsets": [{"name": "p", "gpu": 1, "node_affinity": terms}]}]}
    (w,), _ = parse_workloads(data, "wl.yaml")
    assert w.podsets[0].request.node_affinity == ((NodeRequirement("zone", "NotIn", ("a",)),),)
    bad = [{"matchExpressions": [{"key": "z", "operator": "In"}]}]
    data["workloads"][0]["podsets"][0]["node_affinity"] = bad
    with pytest.raises(SpecError) as e:
        parse_workloads(data, "wl.yaml")
    assert "wl.yaml: workloads[0].podsets[0].node_affinity[0].matchExpressions[0]" in str(e.value)


def _with_affinity(obj, affinity):
    obj["spec"]["affinity"] = affinity
    return obj


def test_adapter_honours_required_node_affinity_and_refuses_required_pod_affinity():
    cfg = AdapterConfig()
    term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["train"]}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    info = parse_pod(_with_affinity(pod("p", gpus=1), {"nodeAffinity": required}), cfg)
    assert info.request.node_affinity == ((NodeRequirement("pool", "In", ("train",)),),)
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "x"}]}}
    soft = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}
    pods = [
        _with_affinity(pod("pinned", gpus=1), {"nodeAffinity": required}),
        _with_affinity(pod("anti", gpus=1), anti),
        _with_affinity(pod("soft", gpus=1), soft),
    ]
    nodes = [node("n1", gpus=8), node("n2", gpus=8, labels={"pool": "train"})]
    w = build_world(nodes, pods, [], [], cfg, now=0.0)
    assert set(w.pods) == {"default/pinned", "default/soft"}  # preferred (soft) terms do not block
    assert "podAntiAffinity" in w.pod_problems["default/anti"]
    assert "not supported" in w.pod_problems["default/anti"]
    mask = w.snapshot.selector_mask(w.pods["default/pinned"].request)
    assert [n.name for n, ok in zip(w.snapshot.nodes, mask, strict=True) if ok] == ["n2"]
