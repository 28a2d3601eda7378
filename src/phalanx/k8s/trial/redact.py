"""`phalanx capture --redact`: names, namespaces and label values replaced by stable hashes.

A name is replaced wherever it appears, as a whole value or as a token of a longer string
(`team-a/train-0` in a gang plan, a node name in `spec.nodeName` or a pool name), by the same
hash: references still meet, so the redacted capture replays to the same decisions. The
hash is stable (the same name gives the same hash in every capture), unsalted unless a salt
is given: a short common name can be guessed by hashing candidates.

Container images, service accounts, host names and the user named in a refusal are hashed whole.
Kept as they are, because they describe hardware or software rather than a user: label values
of GPU, feature-discovery, OS, architecture and instance-type keys, DeviceClass names and DRA
driver names (vendor-defined), the namespaces and queue `default` and `kube-system`, and
values that are numbers or booleans.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from phalanx.k8s import keys
from phalanx.k8s.trial.capture import Capture

KEEP_LABEL_PREFIXES = (
    "nvidia.com/",
    "feature.node.kubernetes.io/",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/",
    "node.kubernetes.io/instance-type",
)
# fields no cycle reads that say who runs what: hashed whole wherever they are
_ALWAYS = frozenset({"image", "serviceAccountName", "serviceAccount", "hostname", "subdomain"})
_USER = re.compile(r'(User|user|group) "[^"]*"')
_NAMING_NOTES = frozenset({*keys.GROUP_KEYS, *keys.QUEUE_KEYS, keys.DATASET})
KEEP_NAMES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
_TOKEN = re.compile(r"[A-Za-z0-9._-]+")
_PARTS = re.compile(r"([-._])")


def _hash(text: str, salt: str) -> str:
    return "r" + hashlib.sha256((salt + text).encode()).hexdigest()[:12]


def _plain(text: str) -> bool:
    """A number or a boolean: says nothing about who runs what."""
    if text.lower() in ("true", "false"):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def _kept_label(key: str) -> bool:
    return any(key.startswith(p) for p in KEEP_LABEL_PREFIXES)


def _names(cap: Capture) -> set[str]:
    """Every name, namespace and label value to hide."""
    out: set[str] = set()
    for key, objs in cap.objects.items():
        vendor = key.endswith("/deviceclasses")
        for o in objs:
            meta = o.get("metadata") or {}
            for k in ("name", "namespace", "generateName"):
                v = meta.get(k)
                if isinstance(v, str) and v and not (vendor and k == "name"):
                    out.add(v.rstrip("-") if k == "generateName" else v)
            for lk, lv in (meta.get("labels") or {}).items():
                if isinstance(lv, str) and not _kept_label(str(lk)):
                    out.add(lv)
            for ak, av in (meta.get("annotations") or {}).items():
                if ak in _NAMING_NOTES and isinstance(av, str):
                    out.add(av)  # a group, queue or dataset that may have no object of its own
            for ref in meta.get("ownerReferences") or []:
                if isinstance(ref, dict) and isinstance(ref.get("name"), str):
                    out.add(ref["name"])
            spec = o.get("spec") or {}
            if key == "pods" and isinstance(spec.get("nodeName"), str):
                out.add(spec["nodeName"])
            if key.endswith("/podgroups") and isinstance(spec.get("queue"), str):
                out.add(spec["queue"])  # a queue named before it exists
    drivers = {
        str((s.get("spec") or {}).get("driver"))
        for k, objs in cap.objects.items()
        if k.endswith("/resourceslices")
        for s in objs
    }
    return {n for n in out if n and n not in KEEP_NAMES and n not in drivers and not _plain(n)}


class _Redactor:
    def __init__(self, names: set[str], salt: str) -> None:
        self.names = names
        self.salt = salt

    def text(self, s: str) -> str:
        if s in self.names:
            return _hash(s, self.salt)
        return _TOKEN.sub(lambda m: self._token(m[0]), s)

    def _token(self, tok: str) -> str:
        """A token, with each longest run of its parts (split at - . _) that is a name hashed:
        `GPU-node-7-0003` hides `node-7`."""
        if tok in self.names:
            return _hash(tok, self.salt)
        parts = _PARTS.split(tok)  # words at even places, separators at odd ones
        out: list[str] = []
        i = 0
        while i < len(parts):
            for j in range(len(parts), i, -1):
                run = "".join(parts[i:j])
                if i % 2 == 0 and (j - i) % 2 == 1 and run in self.names:
                    out.append(_hash(run, self.salt))
                    i = j
                    break
            else:
                out.append(parts[i])
                i += 1
        return "".join(out)

    def value(self, v: Any, key: str = "") -> Any:
        if isinstance(v, str):
            if key in _ALWAYS:
                return _hash(v, self.salt)
            return v if _kept_label(key) else self.text(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {k: self.value(x, k) for k, x in v.items()}
        return v


def redact(cap: Capture, salt: str = "") -> Capture:
    """A copy of the capture with names, namespaces and label values hashed (messages too)."""
    r = _Redactor(_names(cap), salt)
    objects = {k: [r.value(o) for o in objs] for k, objs in cap.objects.items()}
    return Capture(
        objects,
        cap.time,
        list(cap.served),
        {
            k: r.text(_USER.sub(lambda m: f'{m[1]} "{_hash(m[0], salt)}"', w))
            for k, w in cap.unreadable.items()
        },
        {r.text(k): r.text(w) for k, w in cap.problems.items()},
        cap.server,
        True,
        cap.source,
    )
