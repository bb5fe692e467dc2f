"""The extended resources a pod names to ask for a device type (protocol.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """The extended resources a pod uses to ask for this backend's devices."""

    count: str  # number of devices, e.g. nvidia.com/gpu; also the device plugin's resource
    memory: str | None = None  # memory per device
    memory_percentage: str | None = None  # percent of each device's memory
    cores: str | None = None  # percent of each device's compute
    memory_unit_mib: int = 1  # MiB per unit of ``memory`` (Cambricon counts 256 MiB units)

    def all(self) -> list[str]:
        names = (self.count, self.memory, self.memory_percentage, self.cores)
        return [name for name in names if name]
