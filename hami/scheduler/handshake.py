"""The leader's periodic pass: the handshake of protocol.md section 2, expiry of
decisions and reservations nobody bound, and the sweep of stale node locks.

Runs every ``scheduler.handshake_period`` on the leading replica only; a standby keeps its
picture warm and writes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from hami import log
from hami.config import SchedulerConfig
from hami.core.cluster import AvailabilityChange, Cluster
from hami.kube.client import Kube
from hami.kube.raw import Conflict, KubeError
from hami.scheduler.clock import Clock
from hami.scheduler.locks import NodeLocks
from hami.scheduler.metrics import SchedulerMetrics

_log = log.get(__name__)


def log_changes(metrics: SchedulerMetrics, changes: Sequence[AvailabilityChange]) -> None:
    """Count and log each device type that became (un)available on a node."""
    for change in changes:
        metrics.availability_changes.labels(
            change.type_word, "true" if change.available else "false"
        ).inc()
        if change.available:
            _log.info("device type available", node=change.node, type=change.type_word)
        else:
            _log.warning(
                "device type unavailable",
                node=change.node,
                type=change.type_word,
                reason=change.reason,
            )


class Handshake:
    def __init__(
        self,
        *,
        settings: SchedulerConfig,
        cluster: Cluster,
        kube: Callable[[], Kube],
        clock: Clock,
        locks: NodeLocks,
        metrics: SchedulerMetrics,
        leading: Callable[[], bool],
        expire_reservations: Callable[[], Any],
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self._kube = kube
        self.clock = clock
        self.locks = locks
        self.metrics = metrics
        self.leading = leading
        self._expire_reservations = expire_reservations
        self._announced = False

    async def run_pass(self) -> None:
        """One pass of protocol.md section 2 over every known node."""
        if not self.leading():
            return
        self._expire_reservations()
        now = self.clock.now()
        for key in self.cluster.expire_decisions(now):
            _log.info(
                "decision lapsed: not bound in time, its devices are free again",
                pod=key,
                timeout=self.settings.decision_timeout.seconds,
            )
        writes, changes = self.cluster.refresh(now)
        log_changes(self.metrics, changes)
        if not self._announced:
            _log.info(
                "handshake running",
                period=self.settings.handshake_period.seconds,
                timeout=self.settings.handshake_timeout.seconds,
                nodes=len(self.cluster.nodes),
            )
            self._announced = True
        if not writes:
            return
        limit = asyncio.Semaphore(16)

        async def write(node: str, annotations: Mapping[str, str], version: str) -> None:
            async with limit:
                try:
                    await self._kube().patch_node_annotations(
                        node, annotations, resource_version=version or None
                    )
                except Conflict:
                    # The node changed since we read it: decide again on the next pass.
                    self.metrics.handshake_patches.labels("conflict").inc()
                except KubeError as exc:
                    self.metrics.handshake_patches.labels("error").inc()
                    _log.warning("handshake patch failed", node=node, error=str(exc))
                else:
                    self.metrics.handshake_patches.labels("ok").inc()

        await asyncio.gather(*(write(w.node, w.annotations, w.resource_version) for w in writes))

    async def release_stale_locks(self) -> None:
        """Remove node locks nobody else will: their pod is gone, finished, went elsewhere or
        lost its Allocate (``hami.kube.nodelock``). Binds take such locks over anyway; this
        frees a node no bind is waiting for, so no lock outlives its pod. Only locks held
        longer than a healthy allocation takes are looked at."""
        if not self.leading():
            return
        for node in self.locks.suspect():
            await self.locks.release_if_stale(node)

    async def loop(
        self, ready: asyncio.Event, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    ) -> None:
        await ready.wait()
        while True:
            try:
                await self.run_pass()
            except Exception:  # never let one bad pass stop the heartbeat
                _log.exception("handshake pass failed")
            try:
                await self.release_stale_locks()
            except Exception:
                _log.exception("node lock sweep failed")
            await sleep(self.settings.handshake_period.seconds)
