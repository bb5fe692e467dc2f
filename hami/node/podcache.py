"""The node agent's picture of its own Node and of the pods bound to it, from two watches.

``Allocate`` reads it instead of the API server (``hami.node.allocate``): the Node's lock
names the pod kubelet is starting (protocol.md section 5) and the pod's annotations hold
its decision. The picture may lag the API server by a few events; the allocator only
trusts it where a lag cannot hand out a changed decision (its pod write is guarded by the
resourceVersion it read here) and reads the API server otherwise.

Two ``hami.kube.reflector.Reflector``: pods with ``spec.nodeName=<node>`` (kubelet calls
``Allocate`` only for a pod bound here) and the Node itself (``metadata.name=<node>``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from hami import log
from hami.kube.client import Kube, node_path
from hami.kube.objects import metadata_of
from hami.kube.raw import JSON, KubeError
from hami.kube.reflector import Reflector, object_key
from hami.protocol import keys

_log = log.get(__name__)
JSON_PATCH = "application/json-patch+json"
# A JSON pointer to the lock annotation ("/" in a key is written "~1").
_LOCK_POINTER = "/metadata/annotations/" + keys.NODE_LOCK.replace("~", "~0").replace("/", "~1")


def newer_or_same(new: JSON, old: JSON | None) -> bool:
    """Whether ``new`` is not older than ``old`` by resourceVersion. The versions are etcd
    revisions (integers) on every API server this project supports; a version that is not
    an integer cannot be ordered, and the later arrival wins."""
    if old is None:
        return True
    new_rv, old_rv = _revision(new), _revision(old)
    return new_rv is None or old_rv is None or new_rv >= old_rv


def _revision(obj: JSON) -> int | None:
    value = metadata_of(obj).get("resourceVersion")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


class NodeCache:
    """The Node named ``node`` and the pods bound to it, kept current by two watches."""

    def __init__(
        self,
        kube: Kube,
        node: str,
        *,
        writer: Kube | None = None,
        max_backoff: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        # the watches' client, and the one the lock release goes through (the allocator's)
        self.kube = kube
        self.writer = writer or kube
        self._pods: dict[str, JSON] = {}
        self._node: JSON | None = None
        self.pod_reflector = Reflector(
            kube,
            "/api/v1/pods",
            self._on_pod,
            name="node-pods",
            field_selector=f"spec.nodeName={node}",
            max_backoff=max_backoff,
            clock=clock,
        )
        self.node_reflector = Reflector(
            kube,
            "/api/v1/nodes",
            self._on_node,
            name="node-self",
            field_selector=f"metadata.name={node}",
            max_backoff=max_backoff,
            clock=clock,
        )
        self.log = _log.bind(role="node", node=node)

    @property
    def reflectors(self) -> tuple[Reflector, Reflector]:
        return (self.pod_reflector, self.node_reflector)

    async def run(self) -> None:
        """Both watches, until cancelled (each reconnects by itself)."""
        async with asyncio.TaskGroup() as tg:
            for reflector in self.reflectors:
                tg.create_task(reflector.run(), name=f"reflector[{reflector.name}]")

    # ------------------------------------------------------------------ reading

    def not_current(self) -> str | None:
        """Why the picture must not be trusted now (None: both watches listed and open)."""
        for reflector in self.reflectors:
            if not reflector.synced.is_set():
                return f"the {reflector.name} watch has not listed yet"
            if not reflector.streaming:
                return (
                    f"the {reflector.name} watch has been broken for "
                    f"{reflector.down_for():.0f}s and is reconnecting"
                )
        return None

    def down_for(self) -> float:
        """Seconds the longer-broken watch has been down (0 while both stream)."""
        return max(reflector.down_for() for reflector in self.reflectors)

    def status(self) -> dict[str, Any]:
        why = self.not_current()
        return {
            "current": why is None,
            "reason": why or "",
            "down_for_seconds": round(self.down_for(), 1),
            "pods": len(self._pods),
        }

    @property
    def node_object(self) -> JSON | None:
        return self._node

    def pod(self, namespace: str, name: str) -> JSON | None:
        return self._pods.get(f"{namespace}/{name}")

    def pods(self) -> Iterable[JSON]:
        return self._pods.values()

    # ------------------------------------------------------------------ writing

    def remember(self, pod: JSON) -> None:
        """A pod as the API server answered one of our writes: newer than what the watch
        may have delivered so far, so the next ``Allocate`` does not plan from the old one.
        Only a pod the watch has shown (and not deleted since): one deleted meanwhile must
        not come back, as no event would remove it again."""
        if object_key(pod) in self._pods:
            self._store(pod)

    async def release_lock(self, value: str) -> bool:
        """Remove the Node's lock if its value is still exactly ``value``: one JSON patch
        whose ``test`` makes the API server refuse it otherwise, so no prior read is needed.
        True when removed; False when the value differs (or the write failed): the caller
        then reads the Node and decides as before."""
        body = [
            {"op": "test", "path": _LOCK_POINTER, "value": value},
            {"op": "remove", "path": _LOCK_POINTER},
        ]
        try:
            answer = await self.writer.request(
                "PATCH", node_path(self.node), body=body, content_type=JSON_PATCH
            )
        except KubeError as exc:
            self.log.debug("node_lock_conditional_release_refused", error=str(exc))
            return False
        if newer_or_same(answer, self._node):
            self._node = answer
        return True

    # ------------------------------------------------------------------ handlers

    def _on_pod(self, kind: str, obj: JSON) -> None:
        if kind == "DELETED":
            self._pods.pop(object_key(obj), None)
        else:
            self._store(obj)

    def _store(self, pod: JSON) -> None:
        key = object_key(pod)
        if newer_or_same(pod, self._pods.get(key)):
            self._pods[key] = pod

    def _on_node(self, kind: str, obj: JSON) -> None:
        if kind == "DELETED":
            self._node = None
        elif newer_or_same(obj, self._node):
            self._node = obj
