"""Leader election on a coordination.k8s.io/v1 Lease, so two replicas never both bind.

The holder renews `renewTime` from its own thread (a third of the lease duration apart, so
a long cycle never lets the lease lapse); another replica takes the lease only after
`leaseDurationSeconds` without a renewal. Writes carry the lease's resourceVersion, so of
two replicas racing for an expired lease only one write succeeds (the other gets 409).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from phalanx.k8s.client.api import Api, ApiError, Conflict, Forbidden, NotFound
from phalanx.k8s.read.pods import timestamp

log = logging.getLogger("phalanx.k8s")


class LeaseNamespaceMissing(Exception):
    """The Lease cannot be used at all (namespace missing, or RBAC denies it): a configuration error."""

    def __init__(self, namespace: str, problem: str) -> None:
        self.namespace = namespace
        super().__init__(
            f"{problem}. Create it (kubectl create namespace {namespace}) with the leader-election Role of "
            "the Helm chart (deploy/helm/phalanx in Phalanx's source repository), "
            "pass --lease-namespace with a namespace where this user may manage Leases, or run a single "
            "replica with --no-leader-elect"
        )


def _fmt(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


LEASE = "phalanx-scheduler"  # in the lease namespace; a scheduling shard's adds "-<shard>"


class LeaderElector:
    def __init__(
        self,
        api: Api,
        namespace: str,
        identity: str,
        name: str = LEASE,
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
        self.fatal: LeaseNamespaceMissing | None = None
        self.changed = threading.Event()  # set when leadership is won or lost

    def run(self, stop: threading.Event) -> None:
        """Renew or try to acquire until `stop`; a fatal configuration error stops everything."""
        while not stop.is_set():
            try:
                self.try_lead()
            except LeaseNamespaceMissing as e:
                self.fatal = e
                self._set(False)
                stop.set()
                return
            stop.wait(self.duration_s / 3 if self.leading else 1.0)
        self._set(False)

    def start(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(stop,), name="leader-election", daemon=True)
        t.start()
        return t

    def _spec(self, now: float, acquired: float, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "acquireTime": _fmt(acquired),
            "renewTime": _fmt(now),
            "leaseTransitions": transitions,
        }

    def prepare(self) -> None:
        """Make sure the Lease can be used: create its namespace if missing and RBAC allows.

        Raises LeaseNamespaceMissing when the namespace is missing and cannot be created, or
        when RBAC denies the Lease (then the namespace may be missing too: a user who may not
        read namespaces cannot tell). Other API trouble is left to `try_lead`, which retries.
        """
        ns = self.namespace
        try:
            if self.api.get_namespace(ns) is None:
                try:
                    self.api.create_namespace(ns)
                    log.info("created the leader-election namespace %r", ns)
                except Conflict:
                    pass  # created meanwhile
                except ApiError as e:
                    raise LeaseNamespaceMissing(
                        ns,
                        f"the leader-election namespace {ns!r} does not exist and could not be created ({e})",
                    ) from None
        except Forbidden:
            pass  # may not read namespaces: the Lease probe below tells
        except LeaseNamespaceMissing:
            raise
        except Exception as e:
            log.warning("could not check the lease namespace %r: %s", ns, e)
            return
        try:
            self.api.get_lease(ns, self.name)
        except Forbidden as e:
            raise LeaseNamespaceMissing(
                ns,
                f"this user may not use the Lease {self.name!r} in the leader-election namespace {ns!r} "
                f"({e}); the namespace may not exist, or RBAC does not grant get, create and update on "
                "leases there",
            ) from None
        except Exception as e:
            log.warning("could not read the lease %s/%s: %s", ns, self.name, e)

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
            renewed = timestamp(spec.get("renewTime"))
            expired = now - renewed > float(spec.get("leaseDurationSeconds") or self.duration_s)
            if holder != self.identity and not expired:
                return self._set(False)
            transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
            acquired = timestamp(spec.get("acquireTime")) if holder == self.identity else now
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
            self.changed.set()
        self.leading = leading
        return leading
