"""A backend whose devices are declared in config: whole clusters without hardware.

By default it looks like NVIDIA to everything else (type ``nvidia``, vendor ``NVIDIA``,
``nvidia.com/*`` resources, the HAMi-core answer), so demos, tests and benchmarks exercise
the same paths a GPU node does. Options:

    devices:            # groups of identical devices, in index order
      - count: 2
        model: NVIDIA-A100-SXM4-40GB
        memory: 40960   # MiB
        numa: 0
        healthy: true
    uuid_prefix: GPU-fake-node-a   # default: GPU-fake-{NODE_NAME or hostname}
    ignored_xids: [13, 31, 43, 45, 68, 109]  # what ``inject_xid`` leaves healthy (NVIDIA's)
    type: nvidia        # type word, vendor word and resources can be changed to
    vendor: NVIDIA      # simulate another kind of device

Each device also gets deterministic details for the DRA attributes (architecture and
compute capability by model, driver versions, PCI address and root): ``fake_details``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from typing import Any

from hami.backends import health
from hami.backends.base import (
    AllocationRequest,
    Backend,
    BackendError,
    BackendSettings,
    ContainerAllocation,
    Device,
    ResourceNames,
)
from hami.backends.fake_details import fake_details
from hami.backends.hamicore import (
    HamiCorePaths,
    hamicore_admin_allocation,
    hamicore_allocation,
)
from hami.backends.nvidia_names import (
    NVIDIA_ALLOCATED,
    NVIDIA_PRIORITY,
    NVIDIA_RESOURCES,
    NVIDIA_TO_ALLOCATE,
)

_GROUP_KEYS = {"count", "model", "memory", "numa", "healthy"}


class FakeBackend(Backend):
    type_word = "nvidia"
    vendor_word = "NVIDIA"
    default_resources = NVIDIA_RESOURCES
    allocated_key = NVIDIA_ALLOCATED
    to_allocate_key = NVIDIA_TO_ALLOCATE
    priority_resource: str | None = NVIDIA_PRIORITY

    def __init__(self, settings: BackendSettings | None = None) -> None:
        super().__init__(settings)
        options = dict(self.settings.options)
        self.type_word = str(options.get("type", self.type_word))
        self.vendor_word = str(options.get("vendor", self.vendor_word))
        if self.type_word != "nvidia":
            self.allocated_key = f"hami.io/{self.type_word}-devices-allocated"
            self.to_allocate_key = f"hami.io/{self.type_word}-devices-to-allocate"
            self.priority_resource = None  # only the NVIDIA look-alike has HAMi-core's
            if self.settings.resources is None:
                self.resources = ResourceNames(count=f"hami.io/{self.type_word}")
        node = os.environ.get("NODE_NAME") or socket.gethostname()
        self.uuid_prefix = str(options.get("uuid_prefix", f"GPU-fake-{node}"))
        self.paths = HamiCorePaths.from_options(options)
        self._devices = self._declared(options.get("devices", []))
        self.ignored_xids = _xids(options.get("ignored_xids", sorted(health.APPLICATION_XIDS)))
        self._health: dict[str, tuple[bool, str]] = {}  # uuid -> (healthy, cause)

    def _declared(self, groups: Any) -> list[Device]:
        if not isinstance(groups, list):
            raise BackendError("fake backend: option 'devices' must be a list of device groups")
        devices: list[Device] = []
        for number, group in enumerate(groups):
            where = f"fake backend: devices[{number}]"
            if not isinstance(group, Mapping):
                raise BackendError(f"{where} must be a mapping with count, model, memory")
            unknown = set(group) - _GROUP_KEYS
            if unknown:
                raise BackendError(f"{where}: unknown key(s) {sorted(unknown)}")
            count = _int(group.get("count", 1), f"{where}.count", minimum=1)
            memory = _int(group.get("memory"), f"{where}.memory", minimum=1)
            numa = _int(group.get("numa", 0), f"{where}.numa", minimum=0)
            model = group.get("model")
            if not isinstance(model, str) or not model:
                raise BackendError(f"{where}.model must be a non-empty string")
            healthy = group.get("healthy", True)
            if not isinstance(healthy, bool):
                raise BackendError(f"{where}.healthy must be true or false")
            for _ in range(count):
                index = len(devices)
                devices.append(
                    Device(
                        uuid=f"{self.uuid_prefix}-{index}",
                        index=index,
                        model=model,
                        memory_mib=memory,
                        numa=numa,
                        healthy=healthy,
                        details=fake_details(model, index, numa, nvidia=self.type_word == "nvidia"),
                    )
                )
        return devices

    async def enumerate(self) -> list[Device]:
        out = []
        for d in self._devices:
            healthy, cause = self._health.get(d.uuid, (d.healthy, ""))
            out.append(dataclasses.replace(d, healthy=healthy, unhealthy_reason=cause))
        return out

    def set_health(self, uuid: str, healthy: bool, cause: str = "") -> None:
        """Simulate a health change (tests and demos); ``cause`` says why it is unhealthy
        (hami.backends.health: ``xid-79``)."""
        if uuid not in {d.uuid for d in self._devices}:
            raise BackendError(f"fake backend: no device {uuid!r}")
        self._health[uuid] = (healthy, "" if healthy else cause)

    def inject_xid(self, uuid: str, xid: int) -> bool:
        """Simulate a critical Xid event on a device, judged as the NVIDIA backend judges
        one (application Xids leave it healthy); True when it made the device unhealthy."""
        if not health.is_fatal(xid, self.ignored_xids):
            if uuid not in {d.uuid for d in self._devices}:
                raise BackendError(f"fake backend: no device {uuid!r}")
            return False
        self.set_health(uuid, False, health.xid_cause(xid))
        return True

    def allocate(self, request: AllocationRequest) -> ContainerAllocation:
        return hamicore_allocation(request, self.paths, priority_resource=self.priority_resource)

    def admin_allocation(self, request: AllocationRequest) -> ContainerAllocation:
        return hamicore_admin_allocation(request)


def _xids(value: Any) -> frozenset[int]:
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in value
    ):
        raise BackendError(
            f"fake backend: option 'ignored_xids' must be a list of integers, got {value!r}"
        )
    return frozenset(value)


def _int(value: Any, where: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BackendError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value
