"""Hostile API objects for the adapter's read path: a good object of each kind, and hypothesis
strategies that break one of its fields (huge numbers, wrong types, unicode, deep nesting, missing
keys) or add an annotation or label of ours with such a value.

What the watch cache can hold decides what is broken: metadata is always a mapping with a string
name, namespace, uid and resourceVersion (the API server sees to it); anything else may be
anything for a custom resource, and any string for an annotation, a label or a quantity.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

from dra_kube import gpu_device, slice_
from kube_objects import node, pod, pod_group, queue
from phalanx.k8s import keys

KEPT = {("metadata",), ("metadata", "name"), ("metadata", "namespace"), ("metadata", "uid")}
KEPT |= {("metadata", "resourceVersion")}
OUR_KEYS = [
    *sorted(
        v for k, v in vars(keys).items() if k.isupper() and isinstance(v, str) and "/" in v and " " not in v
    ),
    *("gpu-fraction", "gpu-memory", "kai.scheduler/queue", "scheduling.k8s.io/group-name"),
]


def _nest(depth: int, leaf: Any) -> Any:
    out: Any = leaf
    for k in range(depth):
        out = {"a": out} if k % 2 else [out]
    return out


NUMBERS = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**63, 2**64 + 1, -1, 0, 10**30, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True),
)
STRINGS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            "1e400",
            "-1",
            "NaN",
            "Infinity",
            "9" * 40,
            "\uff11\uff12",
            "0x10",
            "1Ei",
            "999999Ei",
            "\x00",
            "🚀",
            "-0.5",
            "0.0000001",
            "a/b/c",
            "{",
            "[]",
            "null",
            "\uff47\uff50\uff55",
            "1,2,,3",
            "0,0,0",
            "99999999999",
        ]
    ),
    st.integers(1, 300).map(lambda d: json.dumps(_nest(d, 1))),  # deep JSON in an annotation
)
VALUES = st.one_of(
    NUMBERS,
    STRINGS,
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
    st.integers(1, 300).map(lambda d: _nest(d, "x")),
)


def good_objects(k: int) -> dict[str, dict[str, Any]]:
    """One well-formed object of each kind, all named bad-* (the test breaks them), in namespace bad."""
    ns = "bad"
    bad_node = node(f"bad-node-{k}", gpus=8, labels={"topology.phalanx.io/rack": "r9"})
    bad_node["metadata"] |= {"uid": f"uid-bad-node-{k}", "resourceVersion": "1"}
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": f"bad-node-{k}", "device": "gpu-0"}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"bad-claim-{k}",
            "namespace": ns,
            "uid": f"uid-claim-{k}",
            "resourceVersion": "1",
        },
        "spec": {"devices": {"requests": [request]}},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": f"bad-pod-{k}", "uid": f"uid-{ns}-bad-pod-{k}"}],
        },
    }
    bad_pod = pod(
        f"bad-pod-{k}",
        ns=ns,
        gpus=1,
        annotations={"phalanx.io/pod-group": f"bad-pg-{k}"},
        labels={"kai.scheduler/queue": f"bad-q-{k}"},
    )
    bad_pod["metadata"]["resourceVersion"] = "1"
    bad_pod["spec"]["resourceClaims"] = [{"name": "devices", "resourceClaimName": f"bad-claim-{k}"}]
    pg = pod_group(f"bad-pg-{k}", 1, ns=ns, queue=f"bad-q-{k}")
    pg["metadata"] |= {"uid": f"uid-pg-{k}", "resourceVersion": "1"}
    q = queue(f"bad-q-{k}", 4)
    q["metadata"] |= {"uid": f"uid-q-{k}", "resourceVersion": "1"}
    sl = slice_(
        f"bad-slice-{k}",
        "gpu.nvidia.com",
        f"bad-node-{k}",
        [gpu_device(j, j, f"bad-node-{k}") for j in range(2)],
    )
    sl["metadata"] |= {"uid": f"uid-slice-{k}", "resourceVersion": "1"}
    return {
        "Node": bad_node,
        "Pod": bad_pod,
        "PodGroup": pg,
        "Queue": q,
        "ResourceSlice": sl,
        "ResourceClaim": claim,
    }


def _paths(obj: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [here] if here else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*here, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*here, i))
    return [p for p in out if p not in KEPT]


def _set(obj: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    for step in path[:-1]:
        obj = obj[step]
    last = path[-1]
    if delete and isinstance(obj, dict):
        del obj[last]
    else:
        obj[last] = value


@st.composite
def broken(draw: st.DrawFn, obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A copy of `obj` with 1-3 fields broken; and what was done (for the failure report)."""
    out = copy.deepcopy(obj)
    done: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["replace", "delete", "annotate", "label"]))
        if how in ("annotate", "label"):
            where = "annotations" if how == "annotate" else "labels"
            key, value = draw(st.sampled_from(OUR_KEYS)), draw(STRINGS)
            meta = out.setdefault("metadata", {})
            if not isinstance(meta.get(where), dict):
                meta[where] = {}
            meta[where][key] = value
            done.append(f"{where}[{key!r}] = {value!r:.60}")
            continue
        paths = _paths(out)
        if not paths:
            continue
        path = draw(st.sampled_from(paths))
        value = draw(VALUES)
        _set(out, path, value, how == "delete")
        done.append(f"{'/'.join(map(str, path))} {'deleted' if how == 'delete' else f'= {value!r:.60}'}")
    return out, done
