"""What each Phalanx component called on the API server (its audit log), and what the chart grants it.

The real kube-apiserver writes one JSON line per request (--audit-policy-file, --audit-log-path);
`POLICY` records, at Metadata level, only requests of the service accounts in the release
namespace. A `Use` is one (account, API group, resource[/subresource], verb, namespace, name); a
`Grant` is one rule of a Role or ClusterRole bound to an account, as `helm template` renders it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts:{ns}"]
  - level: None
"""
ROLES = ("ClusterRole", "Role")
BINDINGS = ("ClusterRoleBinding", "RoleBinding")


def audit_args(folder: Path, namespace: str) -> tuple[tuple[str, ...], Path]:
    """kube-apiserver arguments that audit the accounts of `namespace`, and the log they write."""
    folder.mkdir(parents=True, exist_ok=True)
    policy, log = folder / "audit-policy.yaml", folder / "audit.log"
    policy.write_text(POLICY.format(ns=namespace))
    return (f"--audit-policy-file={policy}", f"--audit-log-path={log}", "--audit-log-maxsize=0"), log


@dataclass(frozen=True, order=True)
class Use:
    account: str
    group: str
    resource: str  # "pods" or "pods/binding"
    verb: str
    namespace: str  # "" for a cluster-scoped object or a list across namespaces
    name: str
    code: int  # the answer's status code (0: a watch still open)

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        named = f" {self.name!r}" if self.name else ""
        return (
            f"{self.account}: {self.verb} {self.group or 'core'}/{self.resource}{named}{where} -> {self.code}"
        )


def uses(log: Path, namespace: str) -> set[Use]:
    """Every resource request of the service accounts of `namespace` (non-resource URLs left out:
    discovery, granted to every authenticated user by the API server's default roles)."""
    prefix = f"system:serviceaccount:{namespace}:"
    seen: dict[str, Use] = {}
    for line in log.read_text().splitlines():
        ev = json.loads(line)
        user = ev.get("user", {}).get("username", "")
        ref = ev.get("objectRef")
        if not user.startswith(prefix) or not ref:
            continue
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        code = int((ev.get("responseStatus") or {}).get("code") or 0)
        use = Use(
            user[len(prefix) :],
            ref.get("apiGroup", ""),
            resource,
            ev["verb"],
            ref.get("namespace", ""),
            ref.get("name", ""),
            code,
        )
        old = seen.get(ev["auditID"])
        if old is None or (old.code == 0 and code):  # ResponseComplete after ResponseStarted
            seen[ev["auditID"]] = use
    return set(seen.values())


@dataclass(frozen=True)
class Grant:
    account: str
    role: str  # "ClusterRole/phalanx-scheduler"
    index: int  # the rule's place in the role
    groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    names: tuple[str, ...]  # resourceNames; () = any
    namespace: str  # a Role's namespace; "" = cluster-wide

    def allows(self, u: Use) -> bool:
        return (
            u.account == self.account
            and u.group in self.groups
            and u.resource in self.resources
            and u.verb in self.verbs
            and (not self.names or u.name in self.names)
            and (not self.namespace or u.namespace == self.namespace)
        )

    def tuples(self) -> list[tuple[str, str, str]]:
        """(group, resource, verb) for each combination this rule grants."""
        return [(g, r, v) for g in self.groups for r in self.resources for v in self.verbs]

    def __str__(self) -> str:
        names = f" names={list(self.names)}" if self.names else ""
        what = f"{list(self.groups)} {list(self.resources)} {list(self.verbs)}"
        return f"{self.role} rule {self.index}: {what}{names}"


def grants(docs: list[dict[str, Any]], namespace: str) -> list[Grant]:
    """Every rule of every role the chart binds to a service account of `namespace`."""
    roles = {
        (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")): d
        for d in docs
        if d["kind"] in ROLES
    }
    out: list[Grant] = []
    for b in (d for d in docs if d["kind"] in BINDINGS):
        ns = b["metadata"].get("namespace", "")
        ref = b["roleRef"]
        role = roles[(ref["kind"], ref["name"], ns if ref["kind"] == "Role" else "")]
        for s in b.get("subjects") or []:
            if s["kind"] != "ServiceAccount" or s.get("namespace", ns) != namespace:
                continue
            for i, r in enumerate(role.get("rules") or []):
                if "nonResourceURLs" in r:
                    continue
                out.append(
                    Grant(
                        s["name"],
                        f"{ref['kind']}/{ref['name']}",
                        i,
                        tuple(r.get("apiGroups") or ()),
                        tuple(r.get("resources") or ()),
                        tuple(r.get("verbs") or ()),
                        tuple(r.get("resourceNames") or ()),
                        ns if ref["kind"] == "Role" else "",
                    )
                )
    return out


def wildcards(docs: list[dict[str, Any]]) -> list[str]:
    """Rules with '*' anywhere (group, resource, verb, name, URL)."""
    bad = []
    for d in (d for d in docs if d["kind"] in ROLES):
        for i, r in enumerate(d.get("rules") or []):
            if any(
                "*" in v for k in ("apiGroups", "resources", "verbs", "resourceNames") for v in r.get(k) or []
            ):
                bad.append(f"{d['kind']}/{d['metadata']['name']} rule {i}")
    return bad


def unexplained_rules(template: str) -> list[str]:
    """Rules in a chart template with no comment saying why: a rule needs a `#` line above it,
    after the previous rule of other API groups (a rule that goes on in the same groups, e.g. the
    status of what the one before reads, or create beside get/update by name, shares its comment)."""
    bad: list[str] = []
    said = False  # a comment since the last rule
    last = ""
    for k, line in enumerate(template.splitlines()):
        s = line.strip()
        if s == "---":
            said, last = False, ""
        elif s.startswith("#") or s.startswith("{{/*"):
            said = True
        elif s.startswith("- apiGroups:") or s.startswith("- nonResourceURLs:"):
            if not said and s != last:
                bad.append(f"line {k + 1}: {s}")
            said, last = False, s
    return bad
