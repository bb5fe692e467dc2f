"""The scheduler's Events about pods: one recorder (``hami.kube.recorder``: repeats folded,
a rate limit per pod), queued without I/O on the caller's path, and warnings given once
per pod and message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from hami import log
from hami.kube.client import Kube
from hami.kube.objects import metadata_of, pod_key
from hami.kube.recorder import EventRecorder

_log = log.get(__name__)
WARNED_MEMORY = 4096  # (pod, message) pairs remembered; a forgotten pod costs no memory


class PodEvents:
    def __init__(self, kube: Kube | None, registry: CollectorRegistry, *, enabled: bool) -> None:
        self._kube = kube
        self._registry = registry
        self.enabled = enabled and kube is not None
        self._recorder: EventRecorder | None = None
        self._warned: set[tuple[str, str]] = set()  # (pod uid, message) already reported

    def recorder(self) -> EventRecorder | None:
        """The one Event sender; the role runs its task. None when no Events are sent."""
        if not self.enabled or self._kube is None:
            return None
        if self._recorder is None:
            self._recorder = EventRecorder(self._kube, registry=self._registry)
        return self._recorder

    def event(
        self, pod: Mapping[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None:
        """Queue an Event: O(1), no I/O on the caller's path."""
        recorder = self.recorder()
        if recorder is not None:
            recorder.record(pod, reason, message, type_)

    def event_ref(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        reason: str,
        message: str,
        type_: str = "Normal",
    ) -> None:
        """``event`` for a pod known by name only."""
        ref = {"metadata": {"namespace": namespace, "name": name, "uid": uid}}
        self.event(ref, reason, message, type_)

    def warn_once(self, pod: Mapping[str, Any], warnings: Sequence[str]) -> None:
        """A policy or weights annotation that fell back to the default: one warning Event
        per pod and message (kube-scheduler calls filter again on every retry)."""
        if not warnings:
            return
        uid = str(metadata_of(pod).get("uid") or pod_key(pod))
        for message in warnings:
            if (uid, message) in self._warned:
                continue
            if len(self._warned) >= WARNED_MEMORY:
                self._warned.clear()
            self._warned.add((uid, message))
            _log.info("pod annotation not understood", pod=pod_key(pod), warning=message)
            self.event(pod, "PolicyIgnored", message, "Warning")

    async def drain(self) -> None:
        """Write pending Events now, folded counts included (shutdown, tests)."""
        if self._recorder is not None:
            await self._recorder.flush()
