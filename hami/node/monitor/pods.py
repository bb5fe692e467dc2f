"""Which pods are on this node, by UID: what the monitor names series by and what tells a
gone pod's directory from a live one.

Two sources: the node agent's pod watch (``hami.node.podcache.NodeCache``) when it runs,
else a periodic list of ``spec.nodeName=<node>`` (an in-memory client in unit tests). Each
answers a ``PodView``; only a *current* view (the watch streaming, or the last list just
succeeded) may be used to remove directories.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from hami import log
from hami.kube.raw import JSON, KubeError

_log = log.get(__name__)


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class PodView:
    pods: dict[str, PodRef]  # by UID
    current: bool  # complete and fresh: safe to judge a directory's pod gone


class PodSource(Protocol):
    async def view(self, wanted: Collection[str]) -> PodView:
        """The pods now; ``wanted``: UIDs the caller has directories for."""
        ...


class PodLister(Protocol):
    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[JSON]: ...


class WatchedPods(Protocol):
    """What the monitor reads of ``NodeCache``."""

    def pods(self) -> Iterable[JSON]: ...

    def not_current(self) -> str | None: ...


def refs(pods: Iterable[JSON]) -> dict[str, PodRef]:
    found: dict[str, PodRef] = {}
    for pod in pods:
        meta: Any = pod.get("metadata") if isinstance(pod, dict) else None
        if not isinstance(meta, dict):
            continue
        uid, ns, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if isinstance(uid, str) and isinstance(ns, str) and isinstance(name, str):
            found[uid] = PodRef(ns, name)
    return found


class CachePods:
    """The node agent's pod watch."""

    def __init__(self, cache: WatchedPods) -> None:
        self.cache = cache

    async def view(self, wanted: Collection[str]) -> PodView:
        return PodView(refs(list(self.cache.pods())), self.cache.not_current() is None)


class ListedPods:
    """A list of the node's pods, repeated every ``resync`` seconds, or sooner (at most every
    ``min_interval``) when a directory names a pod the last list did not have."""

    def __init__(
        self,
        kube: PodLister,
        node: str,
        *,
        resync: float = 60.0,
        min_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.node = node
        self.resync = resync
        self.min_interval = min_interval
        self.clock = clock
        self._pods: dict[str, PodRef] = {}
        self._listed_at: float | None = None
        self._failing = False

    async def view(self, wanted: Collection[str]) -> PodView:
        now = self.clock()
        age = None if self._listed_at is None else now - self._listed_at
        unknown = any(uid not in self._pods for uid in wanted)
        if age is None or age >= self.resync or (unknown and age >= self.min_interval):
            try:
                pods = await self.kube.list_pods(field_selector=f"spec.nodeName={self.node}")
            except KubeError as exc:
                if not self._failing:
                    _log.warning("monitor.pod_list_failed", node=self.node, error=str(exc))
                self._failing = True
                return PodView(dict(self._pods), current=False)
            self._pods, self._listed_at, self._failing = refs(pods), now, False
            return PodView(dict(self._pods), current=True)
        # an older list is complete but may miss a pod bound since: never current for removal
        return PodView(dict(self._pods), current=False)
