"""What one backend's devices look like right now, shared by the node role's tasks.

Enumeration gives the device list; health events (``Backend.watch_health``) mark devices
unhealthy (or healthy again). A device is healthy when enumeration *and* the latest health
event both say so. Every change bumps ``version`` and wakes whoever waits in
``wait_changed`` (the ListAndWatch streams) and the registration loop's ``wake`` event, so
an unhealthy device reaches kubelet and the Node annotation at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from hami.backends.base import Backend, Device


class DeviceState:
    def __init__(self, name: str, backend: Backend) -> None:
        self.name = name
        self.backend = backend
        self.version = 0
        self.wake = asyncio.Event()  # set on any change; the registration loop clears it
        self._enumerated: list[Device] = []
        self._events: dict[str, bool] = {}  # uuid -> health from the latest health event
        self._devices: list[Device] = []
        self._changed = asyncio.Event()  # replaced by a fresh one at every change
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def devices(self) -> list[Device]:
        """Devices ordered by index, with effective health."""
        return list(self._devices)

    def replica_ids(self, device: Device) -> list[str]:
        return [f"{device.uuid}-{i}" for i in range(self.backend.settings.split_count)]

    def uuid_of(self, replica_id: str) -> str | None:
        """The device uuid behind a replica id ``{uuid}-{i}``, None when unknown."""
        uuid, sep, number = replica_id.rpartition("-")
        if not sep or not number.isdigit():
            return None
        if any(d.uuid == uuid for d in self._devices):
            return uuid
        return None

    def set_enumerated(self, devices: Sequence[Device]) -> bool:
        """Take a fresh enumeration; True when the effective list changed."""
        self._enumerated = sorted(devices, key=lambda d: d.index)
        return self._recompute()

    def on_health(self, uuid: str, healthy: bool) -> None:
        """Health callback for ``Backend.watch_health``; safe to call from any thread."""
        loop = self._loop
        if loop is not None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                loop.call_soon_threadsafe(self.on_health, uuid, healthy)
                return
        self._events[uuid] = healthy
        self._recompute()

    def bind_loop(self) -> None:
        self._loop = asyncio.get_running_loop()

    def _recompute(self) -> bool:
        devices = []
        for d in self._enumerated:
            healthy = d.healthy and self._events.get(d.uuid, True)
            # the cause is enumeration's (an event says only healthy or not); none when healthy
            reason = d.unhealthy_reason if not healthy else ""
            devices.append(dataclasses.replace(d, healthy=healthy, unhealthy_reason=reason))
        if devices == self._devices:
            return False
        self._devices = devices
        self.version += 1
        self.wake.set()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return True

    async def wait_changed(self, seen: int) -> int:
        """Wait until ``version`` differs from ``seen``; return the new version."""
        while self.version == seen:
            await self._changed.wait()
        return self.version
