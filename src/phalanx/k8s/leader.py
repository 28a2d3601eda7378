"""Leader election on a coordination.k8s.io/v1 Lease, so two replicas never both bind.

The holder renews `renewTime` every cycle; another replica takes the lease only after
`leaseDurationSeconds` without a renewal. Writes carry the lease's resourceVersion, so of
two replicas racing for an expired lease only one write succeeds (the other gets 409).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from phalanx.k8s.api import Api, ApiError, Conflict, Forbidden, NotFound

log = logging.getLogger("phalanx.k8s")


class LeaseNamespaceMissing(Exception):
    """The Lease's namespace does not exist and we may not create it: a configuration error."""

    def __init__(self, namespace: str, why: str) -> None:
        self.namespace = namespace
        super().__init__(
            f"the leader-election namespace {namespace!r} does not exist and could not be created ({why}). "
            f"Create it (kubectl create namespace {namespace}), pass --lease-namespace with an existing "
            "namespace, or run a single replica with --no-leader-elect"
        )


def _fmt(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> float:
    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


class LeaderElector:
    def __init__(
        self,
        api: Api,
        namespace: str,
        identity: str,
        name: str = "phalanx-scheduler",
        duration_s: int = 15,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.name = name
        self.duration_s = duration_s
        self.clock = clock
        self.leading = False

    def _spec(self, now: float, acquired: float, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "acquireTime": _fmt(acquired),
            "renewTime": _fmt(now),
            "leaseTransitions": transitions,
        }

    def prepare(self) -> None:
        """Make sure the Lease can be written: create its namespace if it is missing and RBAC allows.

        Raises LeaseNamespaceMissing when it is missing and cannot be created. A service
        account that may not read namespaces skips the check (in a cluster, our own namespace
        exists); API trouble is left to `try_lead`, which retries every cycle.
        """
        try:
            if self.api.get_namespace(self.namespace) is not None:
                return
        except Forbidden:
            return
        except Exception as e:
            log.warning("could not check the lease namespace %r: %s", self.namespace, e)
            return
        try:
            self.api.create_namespace(self.namespace)
            log.info("created the leader-election namespace %r", self.namespace)
        except Conflict:
            pass  # created meanwhile
        except ApiError as e:
            raise LeaseNamespaceMissing(
                self.namespace, f"{e.code} {e.reason or ''}: {e.message}".strip()
            ) from None

    def try_lead(self) -> bool:
        """Acquire or renew the lease; True while we hold it."""
        now = self.clock()
        try:
            lease = self.api.get_lease(self.namespace, self.name)
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(now, now, 0),
                }
                self.api.write_lease(body, create=True)
                return self._set(True)
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity")
            renewed = _parse(spec.get("renewTime"))
            expired = now - renewed > float(spec.get("leaseDurationSeconds") or self.duration_s)
            if holder != self.identity and not expired:
                return self._set(False)
            transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
            acquired = _parse(spec.get("acquireTime")) if holder == self.identity else now
            lease["spec"] = self._spec(now, acquired, transitions)
            self.api.write_lease(lease, create=False)  # carries resourceVersion: a racing write gets 409
            return self._set(True)
        except Conflict:
            return self._set(False)
        except NotFound as e:
            if (e.details or {}).get("kind") == "namespaces":
                self.prepare()  # the namespace went away: create it again, or stop with the fix
            log.warning("lease check failed: %s", e)
            return self._set(False)
        except Exception as e:  # API trouble: stop leading once our lease may have expired
            log.warning("lease check failed: %s", e)
            return self._set(False)

    def _set(self, leading: bool) -> bool:
        if leading != self.leading:
            log.info("%s leadership (%s)", "acquired" if leading else "lost", self.identity)
        self.leading = leading
        return leading
