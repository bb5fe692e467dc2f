"""A GPU's descriptive details from NVML and sysfs (``DeviceDetails``), for the DRA attributes.

Each read stands alone: a field NVML does not support on this GPU or driver
(``NVMLError_NotSupported``, ``NVMLError_FunctionNotFound``, or a binding without the
function) is left out quietly; any other NVML error leaves it out with a warning. Details
never make a device unhealthy: enumeration's own reads decide that.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import structlog

from hami.backends import _nvml
from hami.backends.details import (
    DeviceDetails,
    architecture,
    compute_capability,
    cuda_version,
    pcie_root,
    semver,
)

log = structlog.get_logger(__name__)

_QUIET = ("NotSupported", "FunctionNotFound")


def _read(nvml: Any, function: str, *args: Any) -> Any:
    """``nvml.{function}(*args)``, or None when it is unsupported or fails."""
    call: Callable[..., Any] | None = getattr(nvml, function, None)
    if call is None:
        return None
    quiet = tuple(c for c in (_nvml.error_class(nvml, n) for n in _QUIET) if isinstance(c, type))
    try:
        return call(*args)
    except quiet:
        return None
    except nvml.NVMLError as exc:
        log.warning("nvidia.detail_unreadable", call=function, error=str(exc))
        return None


def _convert(value: Any, convert: Callable[..., str | None]) -> str | None:
    try:
        return convert(value)
    except (TypeError, ValueError):
        return None


def read_system(nvml: Any) -> tuple[str | None, str | None]:
    """(driver version, CUDA driver version) of the machine, as SemVer."""
    driver = _read(nvml, "nvmlSystemGetDriverVersion")
    cuda = _read(nvml, "nvmlSystemGetCudaDriverVersion")
    return (
        None if driver is None else _convert(_nvml.text(driver), semver),
        None if cuda is None else _convert(cuda, lambda v: cuda_version(int(v))),
    )


def _capability(value: Any) -> str | None:
    major, minor = value
    return compute_capability(int(major), int(minor))


def pcie_root_of(sysfs_root: str, bus_id: str) -> str | None:
    """The root complex above the device, from where its sysfs entry resolves to."""
    entry = os.path.join(sysfs_root, "bus", "pci", "devices", _nvml.sysfs_bus_id(bus_id))
    if not os.path.lexists(entry):
        return None
    return pcie_root(os.path.realpath(entry))


def read_details(
    nvml: Any,
    handle: Any,
    *,
    name: str,
    bus_id: str,
    sysfs_root: str,
    system: tuple[str | None, str | None],
) -> DeviceDetails:
    """One GPU's details; ``name`` and ``bus_id`` are what enumeration already read,
    ``system`` is ``read_system``'s answer."""
    arch = _read(nvml, "nvmlDeviceGetArchitecture", handle)
    capability = _read(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
    return DeviceDetails(
        product=name.strip() or None,
        architecture=None if arch is None else _convert(arch, lambda v: architecture(int(v))),
        compute_capability=None if capability is None else _convert(capability, _capability),
        driver_version=system[0],
        cuda_driver_version=system[1],
        pci_bus_id=_nvml.sysfs_bus_id(bus_id) or None,
        pcie_root=pcie_root_of(sysfs_root, bus_id),
    )
