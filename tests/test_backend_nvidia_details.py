"""The NVIDIA backend's device details (DRA attributes) from a fake NVML and a fake sysfs:
every read tolerates NVML's "not supported" (and other errors) by leaving the detail out."""

from __future__ import annotations

import os
from pathlib import Path

import pynvml
from _nvml_helpers import FakeGpu, FakeNvml
from structlog.testing import capture_logs

from hami.backends import BackendSettings
from hami.backends.details import DeviceDetails
from hami.backends.nvidia import NvidiaBackend
from hami.dra.attributes import detail_attributes


def gpus() -> list[FakeGpu]:
    return [
        FakeGpu(0, "GPU-h100-0", "NVIDIA H100 80GB HBM3", 80 * 2**30, "00000000:19:00.0",
                architecture=pynvml.NVML_DEVICE_ARCH_HOPPER, compute_capability=(9, 0)),
        FakeGpu(1, "GPU-t4-1", "Tesla T4", 15 * 2**30, "00000000:AF:00.0",
                architecture=pynvml.NVML_DEVICE_ARCH_TURING, compute_capability=(7, 5)),
    ]  # fmt: skip


def fake_sysfs(root: Path) -> None:
    """bus/pci/devices/<bdf> links to devices/pci<root>/<bridge>/<bdf>, as Linux has it."""
    for bdf, top in (("0000:19:00.0", "pci0000:15"), ("0000:af:00.0", "pci0000:ae")):
        real = root / "devices" / top / f"{top[3:]}:01.0" / bdf
        real.mkdir(parents=True)
        (real / "numa_node").write_text("0\n")
        links = root / "bus/pci/devices"
        links.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(real, links), links / bdf)


def backend(nvml: FakeNvml, sysfs: Path) -> NvidiaBackend:
    options = {"sysfs_root": str(sysfs), "topology_score": False}
    return NvidiaBackend(BackendSettings(options=options), nvml=nvml)


async def test_details_from_nvml_and_sysfs(tmp_path: Path) -> None:
    fake_sysfs(tmp_path)
    nvml = FakeNvml(gpus())
    nvml.driver_version = "535.104.05"
    nvml.cuda_driver_version = 12020
    h100, t4 = await backend(nvml, tmp_path).enumerate()
    assert h100.details == DeviceDetails(
        product="NVIDIA H100 80GB HBM3",
        architecture="Hopper",
        compute_capability="9.0.0",
        driver_version="535.104.5",  # SemVer: no leading zero
        cuda_driver_version="12.2.0",
        pci_bus_id="0000:19:00.0",
        pcie_root="pci0000:15",
    )
    assert t4.details.product == "Tesla T4"  # NVML's name, not HAMi's model word
    assert t4.model == "NVIDIA-Tesla T4"
    assert (t4.details.architecture, t4.details.compute_capability) == ("Turing", "7.5.0")
    assert (t4.details.pci_bus_id, t4.details.pcie_root) == ("0000:af:00.0", "pci0000:ae")


async def test_not_supported_leaves_each_detail_out(tmp_path: Path) -> None:
    plain = [  # no architecture nor capability: the fake says NotSupported
        FakeGpu(0, "GPU-old-0", "Tesla K80", 12 * 2**30, "00000000:04:00.0", numa_node=0)
    ]
    nvml = FakeNvml(plain)
    nvml.driver_version = None
    nvml.cuda_driver_version = None
    with capture_logs() as logs:
        (device,) = await backend(nvml, tmp_path).enumerate()
    assert device.healthy
    assert device.details == DeviceDetails(product="Tesla K80", pci_bus_id="0000:04:00.0")
    assert not [e for e in logs if e["event"] == "nvidia.detail_unreadable"]  # quietly
    assert detail_attributes(device.details) == {
        "productName": {"string": "Tesla K80"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:04:00.0"},
    }


async def test_other_nvml_errors_leave_the_detail_out_with_a_warning(tmp_path: Path) -> None:
    nvml = FakeNvml(gpus())
    nvml.detail_errors = {
        "architecture": pynvml.NVML_ERROR_UNKNOWN,
        "cuda": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,  # an old driver: quiet
    }
    with capture_logs() as logs:
        h100, _ = await backend(nvml, tmp_path).enumerate()
    assert h100.healthy  # a detail never makes a device unhealthy
    assert h100.details.architecture is None
    assert h100.details.cuda_driver_version is None
    assert h100.details.compute_capability == "9.0.0"
    assert h100.details.driver_version == "550.54.15"
    assert h100.details.pcie_root is None  # no sysfs entry for it
    warned = [e for e in logs if e["event"] == "nvidia.detail_unreadable"]
    assert {e["call"] for e in warned} == {"nvmlDeviceGetArchitecture"}


async def test_a_binding_without_the_functions_gives_no_details(tmp_path: Path) -> None:
    class OldNvml(FakeNvml):
        def __getattribute__(self, name: str) -> object:
            if name in {"nvmlDeviceGetArchitecture", "nvmlSystemGetCudaDriverVersion"}:
                raise AttributeError(name)
            return super().__getattribute__(name)

    h100, _ = await backend(OldNvml(gpus()), tmp_path).enumerate()
    assert h100.details.architecture is None
    assert h100.details.cuda_driver_version is None
    assert h100.details.compute_capability == "9.0.0"
