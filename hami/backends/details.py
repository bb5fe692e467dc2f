"""What a device is, beyond what scheduling counts: product, architecture, versions, PCIe
place. Pure.

Backends fill ``DeviceDetails`` from the hardware (NVIDIA: NVML and sysfs) or from config
(the fake backend); the DRA mode publishes each known field as a device attribute for CEL
selectors and constraints (docs/dra.md "What is published"). A field the hardware cannot
tell stays None and its attribute is left out: a selector on it then matches no device of
this node rather than a wrong one.

Versions are kept as Semantic Versioning 2.0 strings, the form Kubernetes demands of a
``version`` attribute: ``semver("535.104.05")`` is ``535.104.5`` (no leading zeros),
``cuda_version(12040)`` is ``12.4.0``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# NVML's nvmlDeviceArchitecture_t values (nvml.h; stable ABI) and the names NVIDIA uses
ARCHITECTURES: dict[int, str] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}

_NUMBER = re.compile(r"^[0-9]+$")
_BUILD = re.compile(r"^[0-9A-Za-z-]+$")
_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


@dataclass(frozen=True, slots=True)
class DeviceDetails:
    """Descriptive facts about one physical device; None where unknown."""

    product: str | None = None  # the vendor's product name, e.g. "NVIDIA A100-SXM4-40GB"
    architecture: str | None = None  # e.g. "Ampere"
    compute_capability: str | None = None  # semver, e.g. "8.0.0"
    driver_version: str | None = None  # semver, e.g. "550.54.15"
    cuda_driver_version: str | None = None  # semver, e.g. "12.4.0"
    pci_bus_id: str | None = None  # extended BDF as sysfs names it, e.g. "0000:07:00.0"
    pcie_root: str | None = None  # the root complex, e.g. "pci0000:00"


def semver(text: str) -> str | None:
    """A dotted numeric version as SemVer 2.0: leading zeros dropped, missing parts 0, parts
    past the third kept as build metadata (``1.2.3.4`` -> ``1.2.3+4``). None when a part is
    not a number (nothing sensible to compare)."""
    parts = text.strip().split(".")
    if not parts or not all(_NUMBER.match(p) for p in parts[:3]):
        return None
    core = [str(int(p)) for p in parts[:3]] + ["0"] * (3 - min(len(parts), 3))
    extra = parts[3:]
    if extra and not all(_BUILD.match(p) for p in extra):
        return None
    version = ".".join(core)
    return f"{version}+{'.'.join(extra)}" if extra else version


def cuda_version(value: int) -> str | None:
    """The CUDA driver API version as NVML gives it (1000 x major + 10 x minor, e.g. 12040)
    as SemVer (``12.4.0``); None for a value that is not one."""
    if value <= 0:
        return None
    return f"{value // 1000}.{value % 1000 // 10}.0"


def compute_capability(major: int, minor: int) -> str | None:
    """CUDA compute capability (8, 6) as SemVer ``8.6.0``; None for negative parts."""
    if major < 0 or minor < 0:
        return None
    return f"{major}.{minor}.0"


def architecture(value: int) -> str | None:
    """NVML's architecture number as its name; None for unknown (and future) values."""
    return ARCHITECTURES.get(value)


def pcie_root(device_path: str) -> str | None:
    """The root complex (``pci<domain>:<bus>``, the form of Kubernetes' standard attribute
    ``resource.kubernetes.io/pcieRoot``) in a device's resolved sysfs path, e.g.
    ``/sys/devices/pci0000:00/0000:00:01.0/0000:07:00.0`` -> ``pci0000:00``."""
    for part in device_path.split("/"):
        if _PCIE_ROOT.match(part.lower()):
            return part.lower()
    return None
