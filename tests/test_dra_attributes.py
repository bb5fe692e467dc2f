"""Device details as DRA attributes (hami.backends.details, hami.dra.attributes) and the
fake backend's deterministic details: pure."""

from __future__ import annotations

import asyncio

import pytest

from hami.backends.base import BackendSettings, Device
from hami.backends.details import (
    DeviceDetails,
    architecture,
    compute_capability,
    cuda_version,
    pcie_root,
    semver,
)
from hami.backends.fake import FakeBackend
from hami.backends.fake_details import fake_details
from hami.dra import attributes, slices


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("550.54.15", "550.54.15"),
        ("535.104.05", "535.104.5"),  # SemVer forbids leading zeros
        ("470.82.01", "470.82.1"),
        ("550.54", "550.54.0"),
        ("560", "560.0.0"),
        (" 31.0.15.3623 ", "31.0.15+3623"),
        ("r550.54", None),
        ("550..1", None),
        ("", None),
    ],
)
def test_driver_versions_become_semver(text: str, expected: str | None) -> None:
    assert semver(text) == expected


def test_cuda_capability_and_architecture_numbers() -> None:
    assert cuda_version(12040) == "12.4.0"
    assert cuda_version(11080) == "11.8.0"
    assert cuda_version(12090) == "12.9.0"
    assert cuda_version(0) is None
    assert compute_capability(8, 6) == "8.6.0"
    assert compute_capability(10, 0) == "10.0.0"
    assert compute_capability(-1, 0) is None
    assert architecture(7) == "Ampere"
    assert architecture(9) == "Hopper"
    assert architecture(0xFFFFFFFF) is None  # NVML_DEVICE_ARCH_UNKNOWN


def test_pcie_root_from_a_resolved_sysfs_path() -> None:
    path = "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    assert pcie_root(path) == "pci0000:3a"
    assert pcie_root("/sys/devices/PCI0001:00/0001:01:00.0") == "pci0001:00"
    assert pcie_root("/tmp/bus/pci/devices/0000:3b:00.0") is None


def test_attributes_are_typed_and_unknown_details_left_out() -> None:
    full = DeviceDetails(
        product="NVIDIA H100 80GB HBM3",
        architecture="Hopper",
        compute_capability="9.0.0",
        driver_version="550.54.15",
        cuda_driver_version="12.4.0",
        pci_bus_id="0000:19:00.0",
        pcie_root="pci0000:15",
    )
    assert attributes.detail_attributes(full) == {
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "architecture": {"string": "Hopper"},
        "computeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:19:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
    }
    partial = DeviceDetails(product="Tesla T4", pci_bus_id="0000:07:00.0")
    assert attributes.detail_attributes(partial) == {
        "productName": {"string": "Tesla T4"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"},
    }
    assert attributes.detail_attributes(DeviceDetails()) == {}


def test_slice_device_carries_the_details_beside_the_old_attributes() -> None:
    backend = FakeBackend(BackendSettings())
    device = Device(
        "GPU-x", 0, "NVIDIA A100", 40960, details=DeviceDetails(compute_capability="8.0.0")
    )
    attrs = slices.device_entry(backend, device)["attributes"]
    assert attrs["computeCapability"] == {"version": "8.0.0"}
    assert attrs["uuid"] == {"string": "GPU-x"}
    assert "architecture" not in attrs
    # a device without details publishes what it did before
    plain = slices.device_entry(backend, Device("GPU-y", 1, "NVIDIA A100", 40960))["attributes"]
    assert set(plain) == {"uuid", "model", "type", "vendor", "numa", "index", "healthy"}


@pytest.mark.parametrize(
    ("model", "arch", "capability"),
    [
        ("NVIDIA-A100-SXM4-40GB", "Ampere", "8.0.0"),
        ("NVIDIA-A10G", "Ampere", "8.6.0"),
        ("NVIDIA-Tesla T4", "Turing", "7.5.0"),
        ("NVIDIA-Tesla V100-PCIE-32GB", "Volta", "7.0.0"),
        ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0"),
        ("NVIDIA L40S", "Ada", "8.9.0"),
        ("NVIDIA-L4", "Ada", "8.9.0"),
        ("Model-X", None, None),
    ],
)
def test_fake_details_follow_the_model(
    model: str, arch: str | None, capability: str | None
) -> None:
    details = fake_details(model, 2, 1, nvidia=True)
    assert (details.architecture, details.compute_capability) == (arch, capability)
    assert details.product == model
    assert details.pci_bus_id == "0001:03:00.0"
    assert details.pcie_root == "pci0001:00"
    assert (details.driver_version, details.cuda_driver_version) == ("550.54.15", "12.4.0")
    assert fake_details(model, 2, 1, nvidia=False).driver_version is None


def test_fake_backend_devices_have_details_that_survive_health_changes() -> None:
    options = {
        "uuid_prefix": "GPU-n",
        "devices": [
            {"count": 2, "model": "NVIDIA-Tesla T4", "memory": 15360, "numa": 0},
            {"count": 1, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "numa": 1},
        ],
    }
    backend = FakeBackend(BackendSettings(options=options))
    backend.set_health("GPU-n-2", False)
    devices = asyncio.run(backend.enumerate())
    assert [d.details.architecture for d in devices] == ["Turing", "Turing", "Ampere"]
    assert [d.details.pcie_root for d in devices] == ["pci0000:00", "pci0000:00", "pci0001:00"]
    assert not devices[2].healthy
    assert devices[2].details.compute_capability == "8.0.0"
    mlu = FakeBackend(BackendSettings(options={**options, "type": "mlu", "vendor": "MLU"}))
    (first, *_) = asyncio.run(mlu.enumerate())
    assert first.details.driver_version is None  # NVIDIA versions only on the look-alike
