"""Deterministic ``DeviceDetails`` for the fake backend's declared devices. Pure.

The architecture and compute capability follow the model name (the first known GPU name
it contains, e.g. ``A100`` -> Ampere 8.0, ``T4`` -> Turing 7.5); an unknown model gets
neither, as NVML says nothing for a GPU it does not support. NVIDIA look-alikes (type
``nvidia``) get a fixed driver (550.54.15) and CUDA driver version (12.4.0). The PCI address
follows the index and the NUMA node (PCI domain = NUMA node, bus = index + 1:
``0001:03:00.0``) and the PCIe root complex the NUMA node (``pci0001:00``), so GPUs on one
NUMA node share a root.
"""

from __future__ import annotations

import re

from hami.backends.details import DeviceDetails

FAKE_DRIVER_VERSION = "550.54.15"
FAKE_CUDA_DRIVER_VERSION = "12.4.0"

# GPU name -> (architecture, compute capability); longer names first where one contains
# another (A100 before A10, L40 before L4)
MODELS: tuple[tuple[str, str, str], ...] = (
    ("B200", "Blackwell", "10.0.0"),
    ("H200", "Hopper", "9.0.0"),
    ("H100", "Hopper", "9.0.0"),
    ("L40", "Ada", "8.9.0"),
    ("L4", "Ada", "8.9.0"),
    ("A100", "Ampere", "8.0.0"),
    ("A30", "Ampere", "8.0.0"),
    ("A10", "Ampere", "8.6.0"),
    ("A40", "Ampere", "8.6.0"),
    ("T4", "Turing", "7.5.0"),
    ("V100", "Volta", "7.0.0"),
    ("P100", "Pascal", "6.0.0"),
    ("P4", "Pascal", "6.1.0"),
)


def _known(model: str) -> tuple[str, str] | None:
    words = re.split(r"[^0-9A-Za-z]+", model.upper())
    for name, arch, capability in MODELS:
        if any(w == name or (w.startswith(name) and not w[len(name)].isdigit()) for w in words):
            return arch, capability
    return None


def fake_details(model: str, index: int, numa: int, *, nvidia: bool) -> DeviceDetails:
    known = _known(model)
    return DeviceDetails(
        product=model,
        architecture=known[0] if known else None,
        compute_capability=known[1] if known else None,
        driver_version=FAKE_DRIVER_VERSION if nvidia else None,
        cuda_driver_version=FAKE_CUDA_DRIVER_VERSION if nvidia else None,
        pci_bus_id=f"{numa:04x}:{(index + 1) % 0x100:02x}:00.0",
        pcie_root=f"pci{numa:04x}:00",
    )
