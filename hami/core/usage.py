"""What a pod holds on each device, and per-device state with its usage counters.

Pure. Init containers run one after another before the app containers, so a pod's hold on
a device is, field by field (slots, memory, cores), the larger of its init peak (the
largest single init container there) and the sum of its app containers there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.core import migfit
from hami.core.requests import container_resources, parse_quantity
from hami.protocol import ContainerDevice, NodeDevice
from hami.protocol.mig import MigProfile
from hami.protocol.resources import ResourceNames


@dataclass(slots=True)
class Use:
    """Slots, MiB and core percent held on one device."""

    slots: int = 0
    memory: int = 0
    cores: int = 0

    def add(self, other: Use, sign: int = 1) -> None:
        self.slots += sign * other.slots
        self.memory += sign * other.memory
        self.cores += sign * other.cores

    def raise_to(self, other: Use) -> None:
        """Field by field, at least ``other``: init containers run one at a time."""
        self.slots = max(self.slots, other.slots)
        self.memory = max(self.memory, other.memory)
        self.cores = max(self.cores, other.cores)

    def is_zero(self) -> bool:
        return self.slots == 0 and self.memory == 0 and self.cores == 0


def pod_usage(
    containers: Sequence[Sequence[ContainerDevice]],
    init_count: int,
    positions: Sequence[int] | None = None,
) -> dict[str, Use]:
    """Per device uuid, what a pod holds given its per-entry devices. ``positions`` names
    each entry's container (``entry_containers``); None: entry *i* is container *i*."""
    app: dict[str, Use] = {}
    init: dict[str, Use] = {}
    for entry, devices in enumerate(containers):
        position = positions[entry] if positions is not None and entry < len(positions) else entry
        for device in devices:
            hold(app, init, device.uuid, device.memory, device.cores, is_init=position < init_count)
    return with_init_peaks(app, init)


def requesting(containers: Sequence[Mapping[str, Any]], names: ResourceNames) -> list[bool]:
    """Per container (init first), whether it asks for the type: it names one of the type's
    resources, and not an explicit count of 0 (the rule of ``parse_device_request``). Total:
    an unreadable quantity counts as asking."""
    flags: list[bool] = []
    for container in containers:
        resources = container_resources(container) if isinstance(container, Mapping) else {}
        asks = any(name in resources for name in names.all())
        if asks and names.count in resources:
            try:
                asks = parse_quantity(resources[names.count]) != 0
            except (ValueError, ArithmeticError, TypeError):
                asks = True
        flags.append(asks)
    return flags


def hold(
    app: dict[str, Use],
    init: dict[str, Use],
    uuid: str,
    memory: int,
    cores: int,
    *,
    is_init: bool,
) -> None:
    """Count one container's slice: app containers add up, init containers peak."""
    one = Use(1, memory, cores)
    if is_init:
        init.setdefault(uuid, Use()).raise_to(one)
    else:
        app.setdefault(uuid, Use()).add(one)


def with_init_peaks(app: dict[str, Use], init: Mapping[str, Use]) -> dict[str, Use]:
    """``app`` raised, per device, to the init containers' peak (the pod's whole hold)."""
    for uuid, peak in init.items():
        app.setdefault(uuid, Use()).raise_to(peak)
    return app


@dataclass(slots=True, eq=False)
class DeviceState:
    """A registered device and what pods hold on it (reservations included)."""

    uuid: str
    index: int
    model: str
    numa: int
    healthy: bool
    count: int  # split count
    total_memory: int
    total_cores: int  # 0: no core limiter (cores only mean "exclusive" at 100)
    used: int = 0
    used_memory: int = 0
    used_cores: int = 0
    mode: str = ""  # the register's mode (``hami-core``, ``mig``); ``nvidia.com/vgpu-mode``
    # A MIG GPU's profiles with legal placements, and every pod's reservations on this GPU
    # (the node's hold, shared; None: none) (hami.core.migfit).
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_hold: migfit.MigHold | None = None

    @classmethod
    def from_node_device(cls, device: NodeDevice) -> DeviceState:
        return cls(
            uuid=device.uuid,
            index=device.index,
            model=device.model,
            numa=device.numa,
            healthy=device.healthy,
            count=device.count,
            total_memory=device.memory,
            total_cores=device.cores,
            mode=device.mode,
            mig_profiles=migfit.legal_profiles(device.mig_profiles) if device.mig_profiles else (),
        )

    def set_use(self, use: Use | None, *, whole: bool = False) -> None:
        """What pods hold here; ``whole``: a pod whose decision cannot be read holds the
        device entirely (hami.core.cluster), so nothing is left on it."""
        if use is None:
            self.used = self.used_memory = self.used_cores = 0
        else:
            self.used, self.used_memory, self.used_cores = use.slots, use.memory, use.cores
        if whole:
            self.used = max(self.used, self.count)
            self.used_memory = max(self.used_memory, self.total_memory)
            self.used_cores = max(self.used_cores, self.total_cores or 100)

    @property
    def free_memory(self) -> int:
        """MiB left; a device over-committed by annotations is full, never negative room."""
        return max(0, self.total_memory - self.used_memory)

    @property
    def free_cores(self) -> int:
        """Core percent left (a device without a core limiter: 100 until held whole)."""
        if self.total_cores > 0:
            return max(0, self.total_cores - self.used_cores)
        return 0 if self.used_cores >= 100 else 100

    @property
    def exclusive_held(self) -> bool:
        """Someone holds the whole device's compute."""
        if self.total_cores > 0:
            return self.used_cores >= self.total_cores
        return self.used_cores >= 100

    def utilisation(self, slots: int = 0, memory: int = 0, cores: int = 0) -> float:
        """Used share of the device (0..1 per term), plus an optional extra hold."""
        share = (self.used + slots) / self.count if self.count else 1.0
        share += (self.used_memory + memory) / self.total_memory if self.total_memory else 1.0
        terms = 2
        if self.total_cores:
            share += (self.used_cores + cores) / self.total_cores
            terms = 3
        return share / terms
