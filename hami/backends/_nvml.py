"""Small NVML helpers for the NVIDIA backend: words, paths and error messages.

Pure functions, so the rules HAMi's Go plug-in follows (model prefix, PCI address form,
NUMA fallback) are testable without NVML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Application errors that say nothing about the GPU itself (the NVIDIA device plugin skips
# the same): 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
# processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout.
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})


def text(value: Any) -> str:
    """NVML strings come back as str from nvidia-ml-py, as bytes from older bindings."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def model_name(name: str) -> str:
    """HAMi's model word: ``NVIDIA-`` in front unless the name already starts with it."""
    name = name.strip()
    return name if name.upper().startswith("NVIDIA") else f"NVIDIA-{name}"


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` as sysfs names it: ``0000:07:00.0``, lower case."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if not sep:
        return bus_id
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return bus_id


def numa_node(sysfs_root: str, bus_id: str) -> int:
    """The device's NUMA node; 0 when sysfs has none (-1 on single-node machines)."""
    path = Path(sysfs_root, "bus", "pci", "devices", sysfs_bus_id(bus_id), "numa_node")
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return 0
    return max(value, 0)


def init_error_message(nvml: Any, exc: BaseException) -> str:
    """What to fix when NVML does not start, in the operator's words."""
    if isinstance(exc, _error_class(nvml, "LibraryNotFound")):
        return (
            "NVML library libnvidia-ml.so.1 not found: this node needs the NVIDIA driver "
            "installed, and the container runtime (nvidia-container-toolkit, runtime class "
            "nvidia) mounting libnvidia-ml.so.1 into the hami node agent container"
        )
    if isinstance(exc, _error_class(nvml, "DriverNotLoaded")):
        return "NVML: the NVIDIA kernel driver is not loaded on this node (check nvidia-smi)"
    if isinstance(exc, _error_class(nvml, "NoPermission")):
        return "NVML: no permission to open the GPUs (run the node agent privileged)"
    return f"NVML failed to start: {exc}"


def _error_class(nvml: Any, name: str) -> type[BaseException] | tuple[()]:
    """``nvml.NVMLError_{name}``, or nothing to match when a binding lacks it."""
    found = getattr(nvml, f"NVMLError_{name}", None)
    return found if isinstance(found, type) and issubclass(found, BaseException) else ()
