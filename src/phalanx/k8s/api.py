"""The only module that talks to the API server (through lightkube); everything else sees dicts.

lightkube: typed, small, sync and async, httpx underneath, generic resources for CRDs, and
watches that expose the resourceVersion we need for resuming. Kinds are named by plural:
`pods`, `nodes`, and `group/version/plural` for custom resources.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import httpx2
from lightkube import ApiError, Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType, on_error_raise

from phalanx.k8s import keys

_NAMESPACED_CRDS = {g + "/" + v + "/" + p: (g, v, p) for g, v, p in keys.POD_GROUP_KINDS}
_GLOBAL_CRDS = {g + "/" + v + "/" + p: (g, v, p) for g, v, p in keys.QUEUE_KINDS}


class Gone(Exception):
    """410: the watch's resourceVersion is too old; list again."""


class NotFound(Exception):
    pass


class Conflict(Exception):
    """409: already bound, already exists, or a stale resourceVersion."""


@dataclass(frozen=True)
class Kind:
    name: str
    res: Any
    namespaced: bool


def _resource(kind: str) -> Kind:
    if kind == "pods":
        return Kind(kind, Pod, True)
    if kind == "nodes":
        return Kind(kind, Node, False)
    if kind in _NAMESPACED_CRDS:
        g, v, p = _NAMESPACED_CRDS[kind]
        return Kind(kind, create_namespaced_resource(g, v, "PodGroup", p), True)
    if kind in _GLOBAL_CRDS:
        g, v, p = _GLOBAL_CRDS[kind]
        return Kind(kind, create_global_resource(g, v, "Queue", p), False)
    raise ValueError(f"unknown kind {kind!r}")


WATCHED = ("nodes", "pods", *_NAMESPACED_CRDS, *_GLOBAL_CRDS)


def _dict(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


class Api:
    def __init__(self, client: Client, field_manager: str = "phalanx") -> None:
        self.client = client
        self.field_manager = field_manager

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None = None,
        in_cluster: bool = False,
        url: str | None = None,
        timeout_s: float = 10.0,
    ) -> Api:
        if url:  # a plain URL, no credentials (tests, `kubectl proxy`)
            config = KubeConfig.from_dict(
                {
                    "clusters": [{"name": "c", "cluster": {"server": url}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "c",
                }
            )
        elif in_cluster:
            config = KubeConfig.from_service_account()
        elif kubeconfig:
            config = KubeConfig.from_file(kubeconfig)
        else:
            config = KubeConfig.from_env()
        timeout = httpx2.Timeout(timeout_s, read=max(timeout_s, 60.0))
        return cls(Client(config=config, timeout=timeout, field_manager="phalanx"))

    # ------------------------------------------------------------------ reads
    def list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        """All objects of a kind and the list's resourceVersion; a CRD that is not installed lists empty."""
        k = _resource(kind)
        try:
            it = self.client.list(k.res, namespace="*" if k.namespaced else None)
            items = [_dict(o) for o in it]
            return items, str(it.resourceVersion)
        except ApiError as e:
            if e.status.code == 404:
                return [], ""
            raise

    def watch(
        self, kind: str, resource_version: str, timeout_s: int = 300
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Events after `resource_version` until the server closes the stream (then the caller resumes)."""
        k = _resource(kind)
        try:
            for event, obj in self.client.watch(
                k.res,
                namespace="*" if k.namespaced else None,
                resource_version=resource_version or None,
                server_timeout=timeout_s,
                on_error=on_error_raise,
            ):
                yield event, _dict(obj)
        except ApiError as e:
            if e.status.code == 410:
                raise Gone(str(e)) from None
            raise

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _dict(self.client.get(Pod, name, namespace=namespace))
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise

    # ------------------------------------------------------------------ writes
    def patch_pod_annotations(self, namespace: str, name: str, notes: dict[str, str | None]) -> None:
        self._call(
            lambda: self.client.patch(
                Pod,
                name,
                {"metadata": {"annotations": notes}},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        )

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST pods/{name}/binding.

        The server answers a Status, not a Binding, so decoding the reply can fail after the
        bind succeeded: only an API error (a non-2xx answer) counts as a failed bind.
        """
        body = Pod.Binding(
            metadata=ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=ObjectReference(apiVersion="v1", kind="Node", name=node),
        )
        try:
            self.client.create(body, name=name, namespace=namespace)
        except ApiError as e:
            self._raise(e)
        except (TypeError, KeyError, ValueError, AttributeError):
            pass  # a 2xx whose body is not a Binding: bound

    def evict(self, namespace: str, name: str, reason: str) -> None:
        ev = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        self._call(lambda: self.client.create(ev, name=name, namespace=namespace))

    def event(self, obj: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        meta = obj.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ev = cast(
            Event,
            Event.from_dict(
                {
                    "metadata": {"generateName": f"{meta.get('name', 'phalanx')}.", "namespace": ns},
                    "involvedObject": {
                        "apiVersion": obj.get("apiVersion", "v1"),
                        "kind": obj.get("kind", "Pod"),
                        "name": meta.get("name"),
                        "namespace": meta.get("namespace"),
                        "uid": meta.get("uid"),
                    },
                    "reason": reason,
                    "message": message[:1024],
                    "type": "Warning" if warning else "Normal",
                    "source": {"component": self.field_manager},
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "count": 1,
                }
            ),
        )
        self._call(lambda: self.client.create(ev, namespace=ns))

    def patch_status(self, kind: str, name: str, namespace: str | None, status: dict[str, Any]) -> None:
        k = _resource(kind)
        self._call(
            lambda: self.client.patch(
                k.res.Status if hasattr(k.res, "Status") else k.res,
                name,
                {"status": status},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        )

    # ------------------------------------------------------------------ leases
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _dict(self.client.get(Lease, name, namespace=namespace))
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise

    def write_lease(self, lease: dict[str, Any], create: bool) -> dict[str, Any]:
        obj = cast(Lease, Lease.from_dict(lease))
        ns = lease["metadata"]["namespace"]
        if create:
            return self._call(lambda: _dict(self.client.create(obj, namespace=ns)))  # type: ignore[no-any-return]
        return self._call(  # type: ignore[no-any-return]
            lambda: _dict(self.client.replace(obj))
        )

    # ------------------------------------------------------------------ errors
    @classmethod
    def _call(cls, fn: Any) -> Any:
        try:
            return fn()
        except ApiError as e:
            cls._raise(e)

    @staticmethod
    def _raise(e: ApiError) -> None:
        code = e.status.code
        if code == 404:
            raise NotFound(str(e.status.message)) from None
        if code == 409:
            raise Conflict(str(e.status.message)) from None
        raise e
