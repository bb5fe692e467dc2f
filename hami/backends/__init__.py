"""Device backends: NVIDIA, Cambricon MLU, fake, and third-party plug-ins."""

from hami.backends.base import (
    AllocationRequest,
    Backend,
    BackendError,
    BackendSettings,
    ContainerAllocation,
    Device,
    DeviceNode,
    HealthCallback,
    Mount,
    ResourceNames,
)

__all__ = [
    "AllocationRequest",
    "Backend",
    "BackendError",
    "BackendSettings",
    "ContainerAllocation",
    "Device",
    "DeviceNode",
    "HealthCallback",
    "Mount",
    "ResourceNames",
]
