"""Device attributes from a device's details, for CEL selectors and constraints. Pure.

Names follow Kubernetes' DRA conventions: a name without a domain is the driver's own
(``computeCapability`` in the slice is ``nvidia.hami.io/computeCapability`` in a
constraint, ``device.attributes["nvidia.hami.io"].computeCapability`` in CEL); facts other
drivers publish too, so that a claim can match them across drivers (a GPU and a NIC under
one PCIe root complex), use Kubernetes' standard names under ``resource.kubernetes.io``.
Versions are typed ``version`` (SemVer, compared with CEL's ``semver(...)``); a detail the
backend does not know is left out (docs/dra.md "What is published").
"""

from __future__ import annotations

from typing import Any

from hami.backends.details import DeviceDetails

STANDARD_DOMAIN = "resource.kubernetes.io"

PRODUCT = "productName"
ARCHITECTURE = "architecture"
COMPUTE_CAPABILITY = "computeCapability"
DRIVER_VERSION = "driverVersion"
CUDA_DRIVER_VERSION = "cudaDriverVersion"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"  # extended BDF, e.g. 0000:07:00.0
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"  # pci<domain>:<bus>, e.g. pci0000:00


def detail_attributes(details: DeviceDetails) -> dict[str, dict[str, Any]]:
    """The attributes ``details`` gives, each in its typed form."""
    typed: list[tuple[str, str, str | None]] = [
        (PRODUCT, "string", details.product),
        (ARCHITECTURE, "string", details.architecture),
        (COMPUTE_CAPABILITY, "version", details.compute_capability),
        (DRIVER_VERSION, "version", details.driver_version),
        (CUDA_DRIVER_VERSION, "version", details.cuda_driver_version),
        (PCI_BUS_ID, "string", details.pci_bus_id),
        (PCIE_ROOT, "string", details.pcie_root),
    ]
    return {name: {kind: value} for name, kind, value in typed if value}
