"""The registration loop: one backend's register value and heartbeat on the Node (section 1).

At start-up and then every period (or at once when a device's health changes) the loop
re-enumerates the backend, then writes, in one merge patch,

    hami.io/node-{type}-register: {devices}        (register_format: seed or json)
    hami.io/node-handshake-{type}: Reported_{now}  (NVIDIA: also hami.io/node-handshake)

The heartbeat is written every period even when nothing changed, so no cache of "what was
last written" exists that a failed patch could leave wrong. A failed patch is retried with
exponential back-off (1 s, 2 s, ... up to the period).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from hami import log
from hami.backends.base import BackendError
from hami.node.allocate import NodeKube
from hami.node.metrics import NodeMetrics
from hami.node.state import DeviceState

_log = log.get(__name__)


def registration_annotations(state: DeviceState, now: datetime) -> dict[str, str]:
    backend = state.backend
    annotations = backend.registration(backend.to_node_devices(state.devices), now)
    annotations.update(backend.node_annotations(state.devices))  # e.g. NVIDIA's link scores
    return annotations


class Registrar:
    def __init__(
        self,
        state: DeviceState,
        kube: NodeKube,
        *,
        node: str,
        period: float,
        metrics: NodeMetrics,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        min_backoff: float = 1.0,
    ) -> None:
        self.state = state
        self.kube = kube
        self.node = node
        self.period = period
        self.metrics = metrics
        self.now = now
        self.min_backoff = min(min_backoff, period)
        self.log = _log.bind(role="node", node=node, backend=state.name)
        self.last_success: datetime | None = None
        self.failures = 0  # consecutive
        self.empty = False  # the last enumeration found no devices: nothing is written
        metrics.declare_backend(state.name)

    async def refresh(self) -> None:
        """Re-enumerate; on failure keep the last known devices."""
        try:
            devices = await self.state.backend.enumerate()
        except BackendError as exc:
            self.log.warning("enumerate_failed", error=str(exc))
            return
        self.state.set_enumerated(devices)

    async def write_once(self) -> bool:
        now = self.now()
        self.metrics.set_devices(self.state.name, self.state.backend.type_word, self.state.devices)
        if not self.state.devices:
            # protocol.md section 1: a backend with no devices writes nothing. Encoding an
            # empty list would write register "" (malformed for every reader); without a
            # heartbeat the scheduler times the type out instead.
            if not self.empty:
                self.log.warning("no_devices_left_not_registering")
            self.empty = True
            return True
        self.empty = False
        try:
            annotations = registration_annotations(self.state, now)
            await self.kube.patch_node_annotations(self.node, annotations)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failures += 1
            self.metrics.registration_failures.labels(self.state.name).inc()
            # The first failure is a warning; repeats stay quiet until the patch works again.
            method = self.log.warning if self.failures == 1 else self.log.debug
            hint = _hint(exc)
            extra = {"hint": hint} if hint else {}
            method("registration_failed", error=str(exc), failures=self.failures, **extra)
            return False
        self.metrics.registration_patches.labels(self.state.name).inc()
        if self.failures:
            self.log.info("registration_recovered", after_failures=self.failures)
        elif self.last_success is None:
            self.log.info(
                "registered",
                devices=len(self.state.devices),
                healthy=sum(1 for d in self.state.devices if d.healthy),
            )
        else:
            self.log.debug("heartbeat", value=annotations[self.state.backend.handshake_key])
        self.failures = 0
        self.last_success = now
        return True

    async def run(self) -> None:
        backoff = self.min_backoff
        while True:
            await self.refresh()
            self.state.wake.clear()  # this write covers every change seen so far
            if await self.write_once():
                delay = self.period
                backoff = self.min_backoff
            else:
                delay = backoff
                backoff = min(backoff * 2, self.period)
            try:
                async with asyncio.timeout(delay):
                    await self.state.wake.wait()
            except TimeoutError:
                pass


def _hint(exc: BaseException) -> str | None:
    """What an operator can do about the usual registration failures."""
    status = getattr(exc, "status", None)
    if status == 404:
        return "no Node of that name: NODE_NAME must be the node's Kubernetes name (spec.nodeName)"
    if status == 403:
        return "forbidden: the agent's service account needs get and patch on nodes (RBAC)"
    return None
