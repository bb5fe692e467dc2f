"""The NVIDIA backend against a fake NVML with realistic node data (tests/fixtures/nvml_*.json).

The fake raises pynvml's own error classes, so the backend's error handling is exercised
with the exceptions the real binding throws.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import dataclasses
import threading
from pathlib import Path
from typing import Any

import pynvml
import pytest
from _nvml_helpers import FakeNvml, load_node
from structlog.testing import capture_logs

from hami.backends import AllocationRequest, BackendError, BackendSettings, Device, registry
from hami.backends._nvml import model_name, sysfs_bus_id
from hami.backends.details import DeviceDetails
from hami.backends.nvidia import NvidiaBackend
from hami.protocol import ContainerDevice


def backend_for(nvml: FakeNvml, sysfs: Path, **options: Any) -> NvidiaBackend:
    settings = BackendSettings(
        options={"sysfs_root": str(sysfs), "event_timeout_ms": 20, **options}
    )
    return NvidiaBackend(settings, nvml=nvml)


@pytest.fixture
def a100(tmp_path: Path) -> tuple[FakeNvml, NvidiaBackend]:
    nvml = FakeNvml(load_node("nvml_dgx_a100_80gb.json", tmp_path))
    return nvml, backend_for(nvml, tmp_path)


async def test_dgx_a100_enumeration(a100: tuple[FakeNvml, NvidiaBackend]) -> None:
    nvml, backend = a100
    devices = await backend.enumerate()
    assert [d.index for d in devices] == list(range(8))
    assert [d.uuid for d in devices] == [g.uuid for g in nvml.gpus]
    assert {d.model for d in devices} == {"NVIDIA A100-SXM4-80GB"}  # already prefixed: kept
    assert {d.memory_mib for d in devices} == {81920}
    assert [d.numa for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(d.healthy for d in devices)
    assert threading.get_ident() not in nvml.threads  # no NVML call on the event loop

    node = backend.to_node_devices(devices)
    assert (node[5].count, node[5].memory, node[5].cores, node[5].numa) == (10, 81920, 100, 1)

    await backend.enumerate()
    assert nvml.init_calls == 1  # NVML starts once
    await backend.close()
    assert nvml.shutdown_calls == 1
    await backend.close()
    assert nvml.shutdown_calls == 1


async def test_mixed_node_models_and_numa_fallback(tmp_path: Path) -> None:
    nvml = FakeNvml(load_node("nvml_mixed_v100_t4.json", tmp_path))
    devices = await backend_for(nvml, tmp_path).enumerate()
    assert [(d.model, d.memory_mib, d.numa) for d in devices] == [
        ("NVIDIA-Tesla V100-PCIE-32GB", 32768, 0),  # numa_node -1
        ("NVIDIA-Tesla V100-PCIE-32GB", 32768, 0),  # no numa_node file
        ("NVIDIA-Tesla T4", 15360, 1),  # PCI domain 0001
    ]


def test_words() -> None:
    assert model_name("Tesla V100-PCIE-32GB") == "NVIDIA-Tesla V100-PCIE-32GB"
    assert model_name("NVIDIA A100-SXM4-40GB") == "NVIDIA A100-SXM4-40GB"
    assert sysfs_bus_id("00000000:0F:00.0") == "0000:0f:00.0"
    assert sysfs_bus_id("0000:af:00.0") == "0000:af:00.0"
    backend = NvidiaBackend(nvml=FakeNvml([]))
    assert (backend.type_word, backend.vendor_word) == ("nvidia", "NVIDIA")
    assert backend.resources.count == "nvidia.com/gpu"
    assert backend.register_key == "hami.io/node-nvidia-register"
    assert backend.allocated_key == "hami.io/vgpu-devices-allocated"


def test_registered_entry_point() -> None:
    assert registry.load_class("nvidia") is NvidiaBackend


async def test_library_missing_is_a_clear_error(tmp_path: Path) -> None:
    nvml = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    backend = backend_for(nvml, tmp_path)
    with capture_logs() as logs, pytest.raises(BackendError) as err:
        await backend.enumerate()
    message = str(err.value)
    assert "libnvidia-ml.so.1" in message
    assert "driver" in message
    assert "container runtime" in message
    assert not [e for e in logs if e["log_level"] == "error"]  # raised; the caller says it
    # Once the driver is there, the next call starts NVML: nothing was cached as broken.
    nvml.init_error = None
    assert await backend.enumerate() == []
    await backend.close()


async def test_driver_not_loaded_and_count_failure(tmp_path: Path) -> None:
    nvml = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendError, match="driver is not loaded"):
        await backend_for(nvml, tmp_path).enumerate()
    nvml = FakeNvml([])
    nvml.count_error = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(BackendError, match="could not count"):
        await backend_for(nvml, tmp_path).enumerate()


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver"
)
async def test_real_pynvml_without_driver() -> None:
    with pytest.raises(BackendError, match=r"libnvidia-ml\.so\.1"):
        await NvidiaBackend().enumerate()


async def test_lost_device_does_not_lose_the_others(
    a100: tuple[FakeNvml, NvidiaBackend],
) -> None:
    nvml, backend = a100
    nvml.gpus[2].lost = "handle"  # uuid never read: skipped
    nvml.gpus[5].lost = "after_uuid"  # uuid known: unhealthy
    with capture_logs() as logs:
        devices = await backend.enumerate()
    assert [d.index for d in devices] == [0, 1, 3, 4, 5, 6, 7]
    lost = devices[4]
    assert (lost.uuid, lost.healthy, lost.memory_mib) == (nvml.gpus[5].uuid, False, 0)
    assert all(d.healthy for d in devices if d.index != 5)
    events = {e["event"] for e in logs}
    assert {"nvidia.device_skipped", "nvidia.device_unhealthy"} <= events


async def test_device_lost_after_enumeration_keeps_its_identity(
    a100: tuple[FakeNvml, NvidiaBackend],
) -> None:
    nvml, backend = a100
    await backend.enumerate()
    nvml.gpus[3].lost = "handle"
    devices = await backend.enumerate()
    assert len(devices) == 8
    assert dataclasses.replace(devices[3], details=DeviceDetails()) == Device(
        nvml.gpus[3].uuid,
        3,
        "NVIDIA A100-SXM4-80GB",
        81920,
        0,
        healthy=False,
        unhealthy_reason="nvml-unreadable",
    )
    assert devices[3].details.product == "NVIDIA A100-SXM4-80GB"  # kept from the last reading
    nvml.gpus[3].lost = None  # a device once lost stays unhealthy until restart
    assert not (await backend.enumerate())[3].healthy
    assert (await backend.enumerate())[3].unhealthy_reason == "nvml-unreadable"


class HealthLog:
    def __init__(self) -> None:
        self.changes: list[tuple[str, bool]] = []
        self.changed = asyncio.Event()

    def __call__(self, uuid: str, healthy: bool) -> None:
        self.changes.append((uuid, healthy))
        self.changed.set()

    async def wait(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.changes) < count:
                self.changed.clear()
                await self.changed.wait()


async def test_health_xid_79_marks_unhealthy_xid_43_does_not(
    a100: tuple[FakeNvml, NvidiaBackend],
) -> None:
    nvml, backend = a100
    devices = await backend.enumerate()
    health = HealthLog()
    watcher = asyncio.create_task(backend.watch_health(devices, health))
    nvml.push_xid(43, 1)  # application error: GPU stopped processing
    nvml.push_xid(7, 2, event_type=pynvml.nvmlEventTypeSingleBitEccError)  # not an Xid event
    nvml.push_xid(79, 6)  # GPU has fallen off the bus
    await health.wait(1)
    assert health.changes == [(nvml.gpus[6].uuid, False)]
    assert sorted(nvml.registered) == sorted(g.uuid for g in nvml.gpus)
    assert threading.get_ident() not in nvml.threads

    # Re-enumeration keeps it unhealthy, with the Xid as its cause (the DRA taint's value).
    again = await backend.enumerate()
    assert [d.healthy for d in again] == [True] * 6 + [False, True]
    assert [d.unhealthy_reason for d in again] == [""] * 6 + ["xid-79", ""]

    watcher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watcher
    await backend.close()  # waits for the thread, then shuts NVML down
    assert nvml.freed == 1
    assert nvml.shutdown_calls == 1


async def test_health_event_without_device_marks_all(
    a100: tuple[FakeNvml, NvidiaBackend],
) -> None:
    nvml, backend = a100
    devices = await backend.enumerate()
    health = HealthLog()
    watcher = asyncio.create_task(backend.watch_health(devices, health))
    nvml.push_xid(48, None)  # double-bit ECC error, device unknown
    await health.wait(8)
    assert sorted(health.changes) == sorted((g.uuid, False) for g in nvml.gpus)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    await backend.close()


async def test_ignored_xids_are_configurable(tmp_path: Path) -> None:
    nvml = FakeNvml(load_node("nvml_mixed_v100_t4.json", tmp_path))
    backend = backend_for(nvml, tmp_path, ignored_xids=[79])
    devices = await backend.enumerate()
    health = HealthLog()
    watcher = asyncio.create_task(backend.watch_health(devices, health))
    nvml.push_xid(79, 0)
    nvml.push_xid(43, 2)  # no longer in the ignored list
    await health.wait(1)
    assert health.changes == [(nvml.gpus[2].uuid, False)]
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    await backend.close()


async def test_health_checks_can_be_disabled(tmp_path: Path) -> None:
    backend = backend_for(FakeNvml([]), tmp_path, health_checks=False)
    await asyncio.wait_for(backend.watch_health([], HealthLog()), 1)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"ignore_xids": [1]}, "ignore_xids"),
        ({"ignored_xids": "13,43"}, "ignored_xids"),
        ({"health_checks": "yes"}, "health_checks"),
        ({"event_timeout_ms": 0}, "event_timeout_ms"),
        ({"hamicore": {"libary": "/x"}}, "libary"),
    ],
)
def test_bad_options_name_the_key(options: dict[str, Any], named: str) -> None:
    with pytest.raises(BackendError, match=named):
        NvidiaBackend(BackendSettings(options=options), nvml=FakeNvml([]))


def test_allocate_is_the_hamicore_answer() -> None:
    backend = NvidiaBackend(nvml=FakeNvml([]))
    answer = backend.allocate(
        AllocationRequest(
            pod_namespace="default",
            pod_name="train",
            pod_uid="8d2c",
            container_name="main",
            container_index=0,
            devices=[ContainerDevice("GPU-a", "NVIDIA", 3000, 30)],
            node_devices=[],
        )
    )
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert answer.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert answer.host_dirs == ["/usr/local/vgpu/containers/8d2c_main"]
