"""The fake backend: devices from config, and the HAMi-core answer of protocol.md section 6."""

from __future__ import annotations

from typing import Any

import pytest

from hami.backends import (
    AllocationRequest,
    BackendError,
    BackendSettings,
    Mount,
    ResourceNames,
    registry,
)
from hami.backends.fake import FakeBackend
from hami.protocol import ContainerDevice, encode_node_devices

GROUPS = [
    {"count": 2, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "numa": 0},
    {"count": 1, "model": "NVIDIA-Tesla T4", "memory": 15360, "numa": 1, "healthy": False},
]


def fake(**options: Any) -> FakeBackend:
    settings = BackendSettings(options={"uuid_prefix": "GPU-fake-n1", "devices": GROUPS, **options})
    return FakeBackend(settings)


async def test_enumeration_follows_the_declared_groups() -> None:
    devices = await fake().enumerate()
    assert [(d.uuid, d.index, d.model, d.memory_mib, d.numa, d.healthy) for d in devices] == [
        ("GPU-fake-n1-0", 0, "NVIDIA-A100-SXM4-40GB", 40960, 0, True),
        ("GPU-fake-n1-1", 1, "NVIDIA-A100-SXM4-40GB", 40960, 0, True),
        ("GPU-fake-n1-2", 2, "NVIDIA-Tesla T4", 15360, 1, False),
    ]


async def test_uuid_prefix_defaults_to_the_node_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    backend = FakeBackend(BackendSettings(options={"devices": GROUPS[:1]}))
    assert [d.uuid for d in await backend.enumerate()] == [
        "GPU-fake-gpu-node-7-0",
        "GPU-fake-gpu-node-7-1",
    ]


async def test_words_and_entry_point() -> None:
    backend = registry.create("fake", BackendSettings(options={"devices": GROUPS}))
    assert isinstance(backend, FakeBackend)
    assert (backend.type_word, backend.vendor_word) == ("nvidia", "NVIDIA")
    assert backend.resources.count == "nvidia.com/gpu"
    assert backend.register_key == "hami.io/node-nvidia-register"
    assert backend.handshake_key == "hami.io/node-handshake-nvidia"
    assert backend.allocated_key == "hami.io/vgpu-devices-allocated"


async def test_another_type_word_gets_its_own_keys_and_resource() -> None:
    backend = fake(type="npu", vendor="NPU")
    assert (backend.type_word, backend.vendor_word) == ("npu", "NPU")
    assert backend.register_key == "hami.io/node-npu-register"
    assert backend.allocated_key == "hami.io/npu-devices-allocated"
    assert backend.to_allocate_key == "hami.io/npu-devices-to-allocate"
    assert backend.resources == ResourceNames(count="hami.io/npu")


async def test_node_devices_apply_split_and_scaling() -> None:
    settings = BackendSettings(
        split_count=4,
        memory_scaling=1.5,
        core_scaling=2.0,
        options={"uuid_prefix": "GPU-fake-n1", "devices": GROUPS},
    )
    backend = FakeBackend(settings)
    node = backend.to_node_devices(await backend.enumerate())
    assert [(n.count, n.memory, n.cores, n.healthy) for n in node] == [
        (4, 61440, 200, True),
        (4, 61440, 200, True),
        (4, 23040, 200, False),
    ]
    assert encode_node_devices(node[:1]) == (
        "GPU-fake-n1-0,4,61440,200,NVIDIA-A100-SXM4-40GB,0,true:"
    )


async def test_default_split_count_is_ten() -> None:
    backend = fake()
    assert {n.count for n in backend.to_node_devices(await backend.enumerate())} == {10}


async def test_set_health() -> None:
    backend = fake()
    backend.set_health("GPU-fake-n1-0", False)
    backend.set_health("GPU-fake-n1-2", True)
    assert [d.healthy for d in await backend.enumerate()] == [False, True, True]
    with pytest.raises(BackendError, match="GPU-fake-n1-9"):
        backend.set_health("GPU-fake-n1-9", False)


def allocation_request(
    devices: list[ContainerDevice], env: dict[str, str] | None = None
) -> AllocationRequest:
    return AllocationRequest(
        pod_namespace="default",
        pod_name="train-0",
        pod_uid="0d6b4c1e-8f5a-4e0b-9c7d-2a1f3e5b7c90",
        container_name="trainer",
        container_index=1,
        devices=devices,
        node_devices=[],
        container_env=env or {},
    )


HOST_DIR = "/usr/local/vgpu/containers/0d6b4c1e-8f5a-4e0b-9c7d-2a1f3e5b7c90_trainer"


def test_allocate_is_the_hamicore_contract() -> None:
    answer = fake().allocate(
        allocation_request(
            [
                ContainerDevice("GPU-fake-n1-0", "NVIDIA", 3000, 50),
                ContainerDevice("GPU-fake-n1-1", "NVIDIA", 5000, 30),
            ]
        )
    )
    envs = dict(answer.envs)
    cache = envs.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    assert cache.startswith("/usr/local/vgpu/") and cache.endswith(".cache")
    assert len(cache) > len("/usr/local/vgpu/.cache")  # a random name in between
    assert envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-fake-n1-0,GPU-fake-n1-1",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "5000m",
        "CUDA_DEVICE_SM_LIMIT": "50",  # cores of the first device
    }
    assert list(answer.mounts) == [
        Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", read_only=True),
        Mount(HOST_DIR, "/usr/local/vgpu", read_only=False),
        Mount("/tmp/vgpulock", "/tmp/vgpulock", read_only=False),
        Mount("/usr/local/vgpu/ld.so.preload", "/etc/ld.so.preload", read_only=True),
    ]
    assert list(answer.host_dirs) == [HOST_DIR]
    assert not answer.devices


def test_each_answer_gets_its_own_cache_file() -> None:
    backend = fake()
    req = allocation_request([ContainerDevice("GPU-fake-n1-0", "NVIDIA", 1000, 0)])
    first = backend.allocate(req).envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert first != backend.allocate(req).envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]


@pytest.mark.parametrize("value", ["true", "TRUE", "True"])
def test_cuda_disable_control_drops_the_preload_mount(value: str) -> None:
    answer = fake().allocate(
        allocation_request(
            [ContainerDevice("GPU-fake-n1-0", "NVIDIA", 3000, 0)],
            {"CUDA_DISABLE_CONTROL": value},
        )
    )
    assert [m.container_path for m in answer.mounts] == [
        "/usr/local/vgpu/libvgpu.so",
        "/usr/local/vgpu",
        "/tmp/vgpulock",
    ]
    assert answer.envs["CUDA_DEVICE_SM_LIMIT"] == "0"


def test_cuda_disable_control_false_keeps_it() -> None:
    answer = fake().allocate(
        allocation_request(
            [ContainerDevice("GPU-fake-n1-0", "NVIDIA", 3000, 0)],
            {"CUDA_DISABLE_CONTROL": "false"},
        )
    )
    assert len(answer.mounts) == 4


def test_hamicore_paths_are_configurable() -> None:
    backend = fake(hamicore={"containers_dir": "/var/lib/hami/containers", "lock_dir": "/run/l"})
    answer = backend.allocate(
        allocation_request([ContainerDevice("GPU-fake-n1-0", "NVIDIA", 3000, 0)])
    )
    assert answer.host_dirs == [
        "/var/lib/hami/containers/0d6b4c1e-8f5a-4e0b-9c7d-2a1f3e5b7c90_trainer"
    ]
    assert Mount("/run/l", "/run/l") in answer.mounts


def test_allocate_without_devices_names_the_pod() -> None:
    with pytest.raises(BackendError, match="default/train-0 container trainer"):
        fake().allocate(allocation_request([]))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"devices": {"count": 1}}, "'devices'"),
        ({"devices": ["A100"]}, r"devices\[0\]"),
        ({"devices": [{"count": 1, "model": "X", "memory": 1, "colour": "red"}]}, "colour"),
        ({"devices": [{"count": 0, "model": "X", "memory": 1}]}, r"devices\[0\]\.count"),
        ({"devices": [{"count": True, "model": "X", "memory": 1}]}, r"devices\[0\]\.count"),
        ({"devices": [{"model": "X"}]}, r"devices\[0\]\.memory"),
        ({"devices": [GROUPS[0], {"memory": 1}]}, r"devices\[1\]\.model"),
        ({"devices": [{"model": "X", "memory": 1, "numa": -1}]}, r"devices\[0\]\.numa"),
        ({"devices": [{"model": "X", "memory": 1, "healthy": "yes"}]}, r"devices\[0\]\.healthy"),
        ({"hamicore": {"libary": "/x"}}, "libary"),
        ({"hamicore": "/usr/local/vgpu"}, "hamicore"),
    ],
)
def test_config_errors_name_the_key(options: dict[str, Any], named: str) -> None:
    with pytest.raises(BackendError, match=named):
        FakeBackend(BackendSettings(options=options))


def test_split_count_must_be_positive() -> None:
    with pytest.raises(BackendError, match="split_count"):
        FakeBackend(BackendSettings(split_count=0))
