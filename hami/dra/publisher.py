"""Keeps this node's ResourceSlice for one backend current on the API server.

At start it makes sure the backend's DeviceClass exists, then writes the slice whenever the
devices change (health events; re-enumeration, every period) and at least every period
(repairing a slice someone else edited or deleted). The slice is written only when its
content differs from what the API server has, and each write bumps the pool generation.
When the agent stops serving the node (its stop, as SIGTERM gives it) the slice is
deleted, so kube-scheduler places no new claim on a node nobody prepares them for.

Unhealthy devices (each partition of a MIG GPU too) are published tainted
(``hami.dra.taints``). When the API server's answer to a write shows it dropped the taints
(its DRADeviceTaints gate is off), the publisher says so once and from then on leaves
unhealthy devices out of the slice, as before taints.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from hami import log
from hami.backends.base import Backend, Device
from hami.dra import migslices, names, poolsync, slices, taints
from hami.dra.metrics import DRAMetrics

_log = log.get(__name__)
JSON = dict[str, Any]
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
CLASSES_PATH = "/apis/resource.k8s.io/v1/deviceclasses"


class SliceKube(Protocol):
    """What the publisher needs of ``hami.kube.client.Kube``."""

    async def request(self, method: str, path: str, *, body: Any = None) -> JSON: ...


class Devices(Protocol):
    """``hami.node.state.DeviceState``: the devices now, and a wait for a change."""

    version: int

    @property
    def devices(self) -> list[Device]: ...

    async def wait_changed(self, seen: int) -> int: ...


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


class SlicePublisher:
    def __init__(
        self,
        kube: SliceKube,
        node: str,
        backend: Backend,
        state: Devices,
        *,
        period: float = 30.0,
        min_backoff: float = 1.0,
        extended_resource_name: str | None = None,
        metrics: DRAMetrics | None = None,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.kube = kube
        self.node = node
        self.backend = backend
        self.state = state
        self.period = period
        self.min_backoff = min(min_backoff, period)
        self.extended_resource_name = extended_resource_name
        self.metrics = metrics or DRAMetrics()
        self.refresh = refresh  # re-enumerates the backend into ``state`` (the agent's)
        self.driver = names.driver_name(backend.type_word)
        self.name = names.slice_name(node, backend.type_word)
        self.path = f"{SLICES_PATH}/{self.name}"
        self.syncs = 0  # comparisons with the API server's slice
        self.writes = 0  # slices created or replaced (tests read it: no flapping)
        self.published = asyncio.Event()  # set once the slice matches the devices
        # False once the API server dropped device taints: unhealthy devices then leave
        self.taints_served = True
        self.pool_names: set[str] = set()  # MIG: the pool's slices (hami.dra.migslices)
        self.log = _log.bind(role="node", node=node, driver=names.driver_name(backend.type_word))

    async def ensure_device_class(self) -> None:
        body = slices.device_class(self.backend, self.extended_resource_name)
        try:
            await self.kube.request("POST", CLASSES_PATH, body=body)
            self.log.info("dra_device_class_created", name=body["metadata"]["name"])
        except Exception as exc:
            if _status(exc) == 409:
                return  # exists (another node's agent, or the chart, made it)
            # RBAC may give the agents no cluster-scoped writes: the chart then installs it
            self.log.warning("dra_device_class_not_created", error=str(exc))

    async def sync_once(self, devices: list[Device]) -> bool:
        """Make the API server's slice say what ``devices`` say; True when it wrote."""
        if self.pool_names or migslices.partitioned(devices):
            return await self._sync_pool(devices)
        try:
            existing: JSON | None = await self.kube.request("GET", self.path)
        except Exception as exc:
            if _status(exc) != 404:
                raise
            existing = None
        self.syncs += 1
        body = slices.next_slice(
            self.node, self.backend, devices, existing, with_taints=self.taints_served
        )
        if body is None:
            return False
        if existing is None:
            stored = await self.kube.request("POST", SLICES_PATH, body=body)
        else:
            stored = await self.kube.request("PUT", self.path, body=body)
        self.writes += 1
        self.metrics.slice_writes.labels(self.driver).inc()
        self.log.info(
            "dra_slice_written",
            slice=self.name,
            generation=body["spec"]["pool"]["generation"],
            devices=len(body["spec"]["devices"]),
        )
        if self.taints_served and taints.dropped(body["spec"], stored):
            self._taints_not_served(self.name)
            await self.sync_once(devices)  # take the tainted devices out at once
        return True

    async def _sync_pool(self, devices: list[Device]) -> bool:
        """MIG GPUs: partitions and counter sets over several slices (``poolsync``)."""
        plan, names_now, dropped = await poolsync.sync_pool(
            self.kube,
            self.node,
            self.backend,
            devices,
            self.pool_names,
            with_taints=self.taints_served,
        )
        self.syncs += 1
        self.pool_names = names_now if migslices.partitioned(devices) else set()
        if plan.empty:
            return False
        self.writes += 1
        self.metrics.slice_writes.labels(self.driver).inc()
        self.log.info(
            "dra_slices_written",
            slices=sorted(b["metadata"]["name"] for b in plan.create + plan.replace),
            deleted=plan.delete,
            generation=plan.generation,
        )
        if self.taints_served and dropped:
            self._taints_not_served(self.name)
            await self.sync_once(devices)  # take the tainted GPUs out at once
        return True

    def _taints_not_served(self, slice_name: str) -> None:
        self.taints_served = False
        self.log.warning(
            "dra_device_taints_not_served",
            slice=slice_name,
            why="kube-apiserver dropped the devices' taints (feature gate DRADeviceTaints "
            "off); unhealthy devices leave the slice instead until the agent restarts",
        )

    async def run(self) -> None:
        await self.ensure_device_class()
        backoff = self.min_backoff
        try:
            while True:
                if self.refresh is not None:
                    await self.refresh()
                seen = self.state.version
                try:
                    await self.sync_once(self.state.devices)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # a 409 (someone wrote between our read and write) retries at once
                    self.metrics.slice_write_failures.labels(self.driver).inc()
                    delay = 0.0 if _status(exc) == 409 else backoff
                    backoff = min(backoff * 2, self.period)
                    self.log.warning("dra_slice_write_failed", error=str(exc), retry_in=delay)
                    await asyncio.sleep(delay)
                    continue
                backoff = self.min_backoff
                self.published.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.period):
                        await self.state.wait_changed(seen)
        finally:
            self.published.clear()
            await self._withdraw()

    async def _withdraw(self) -> None:
        """Delete the slice (bounded: the agent is shutting down)."""
        try:
            async with asyncio.timeout(5):
                for name in sorted(self.pool_names - {self.name}):
                    await poolsync.delete_slice(self.kube, name)
                await self.kube.request("DELETE", self.path)
            self.log.info("dra_slice_deleted", slice=self.name)
        except Exception as exc:
            if _status(exc) != 404:
                self.log.warning("dra_slice_delete_failed", slice=self.name, error=str(exc))
