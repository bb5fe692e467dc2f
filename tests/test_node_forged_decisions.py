"""The node agent checks a decision before answering kubelet (issue 9 item 7): a forged or
foreign ``*-devices-to-allocate`` value fails the pod instead of reaching the container."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.backends.base import Backend, BackendSettings, Device
from hami.backends.cambricon import CambriconBackend
from hami.backends.fake import FakeBackend
from hami.node.allocate import AllocateError, check_entry, plan_allocation
from hami.protocol import ContainerDevice, keys

NODE = "node-f"
MEMORY = 16384
TO_ALLOC = "hami.io/vgpu-devices-to-allocate"


def fake(tmp: Path, scaling: float = 1.0) -> FakeBackend:
    return FakeBackend(
        BackendSettings(
            memory_scaling=scaling,
            options={
                "devices": [{"count": 2, "model": "NVIDIA-Test", "memory": MEMORY}],
                "uuid_prefix": "GPU-f",
                "hamicore": {"containers_dir": str(tmp / "containers")},
            },
        )
    )


def forged(value: str, key: str = TO_ALLOC, containers: int = 1) -> dict[str, Any]:
    """A pod created with spec.nodeName and hand-written decision annotations."""
    return {
        "metadata": {
            "namespace": "ns",
            "name": "forged",
            "uid": "uid-forged",
            "annotations": {
                keys.BIND_PHASE: "allocating",
                keys.VGPU_NODE: NODE,
                key: value,
            },
        },
        "spec": {"nodeName": NODE, "containers": [{"name": f"c{i}"} for i in range(containers)]},
        "status": {"phase": "Pending"},
    }


async def devices_of(backend: Backend) -> list[Device]:
    return await backend.enumerate()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("all,NVIDIA,1000,0:;", r"'all' is not a device uuid"),
        ("none,NVIDIA,1000,0:;", r"'none' is not a device uuid"),
        ("GPU-f-0=x,NVIDIA,1000,0:;", r"'GPU-f-0=x' is not a device uuid"),
        ("GPU f,NVIDIA,1000,0:;", r"'GPU f' is not a device uuid"),
        ("GPU-other-node-0,NVIDIA,1000,0:;", r"GPU-other-node-0 is not a nvidia device"),
        ("GPU-f-0,NVIDIA,999999,0:;", r"memory 999999 MiB on device GPU-f-0 is outside 0..16384"),
        # (negative and over-100 numbers are refused by the decoder already)
        ("GPU-f-0,NVIDIA,-1,0:;", r"memory.*-1"),
        ("GPU-f-0,NVIDIA,1000,101:;", r"cores.*101"),
        ("GPU-f-0,NVIDIA,1000,-5:;", r"cores.*-5"),
    ],
)
async def test_forged_values_are_refused_naming_pod_value_and_fix(
    tmp_path: Path, value: str, message: str
) -> None:
    backend = fake(tmp_path)
    with pytest.raises(AllocateError, match=message) as caught:
        plan_allocation(forged(value), backend, [1], await devices_of(backend))
    text = str(caught.value)
    assert "ns/forged" in text and TO_ALLOC in text


@pytest.mark.parametrize(
    ("memory", "cores", "message"),
    [(-1, 0, r"memory -1 MiB"), (1000, 101, r"cores 101 .*0..100"), (1000, -5, r"cores -5")],
)
async def test_the_check_itself_bounds_numbers(
    tmp_path: Path, memory: int, cores: int, message: str
) -> None:
    # Independent of the decoder: the check is what stands before the container's env.
    backend = fake(tmp_path)
    entry = [ContainerDevice("GPU-f-0", "NVIDIA", memory, cores)]
    with pytest.raises(AllocateError, match=message + ".*HAMi scheduler"):
        check_entry(entry, backend, await devices_of(backend), "entry 0")


async def test_the_same_device_twice_is_refused(tmp_path: Path) -> None:
    backend = fake(tmp_path)
    value = "GPU-f-0,NVIDIA,1000,0:GPU-f-0,NVIDIA,1000,0:;"
    with pytest.raises(AllocateError, match=r"GPU-f-0 is listed twice"):
        plan_allocation(forged(value), backend, [2], await devices_of(backend))


async def test_the_limit_is_the_registered_scaled_memory(tmp_path: Path) -> None:
    # memory_scaling 2: the node registers 32768 MiB per device, and the scheduler may hand
    # that out; above it is refused.
    backend = fake(tmp_path, scaling=2.0)
    devices = await devices_of(backend)
    plan = plan_allocation(forged("GPU-f-1,NVIDIA,32768,100:;"), backend, [1], devices)
    assert plan.containers[0].allocation.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "32768m"
    with pytest.raises(AllocateError, match=r"outside 0..32768"):
        plan_allocation(forged("GPU-f-1,NVIDIA,32769,0:;"), backend, [1], devices)


async def test_mlu_decisions_are_checked_too(tmp_path: Path) -> None:
    backend = CambriconBackend(BackendSettings(options={"host_root": str(tmp_path)}))
    cards = [Device("MLU-a", 0, "MLU-370", 24576), Device("MLU-b", 1, "MLU-370", 24576)]
    key = backend.to_allocate_key
    ok = plan_allocation(forged("MLU-b,MLU,256,100:;", key), backend, [1], cards)
    assert ok.containers[0].allocation.envs["CAMBRICON_SPLIT_VISIBLE_DEVICES"] == "1"
    for value in ("MLU-b,MLU,99999,100:;", "MLU-x,MLU,256,100:;", "all,MLU,256,100:;"):
        with pytest.raises(AllocateError, match=r"ns/forged"):
            plan_allocation(forged(value, key), backend, [1], cards)


# ------------------------------------------------------------------ fuzzing

_UUID_OK = re.compile(r"GPU-f-[01]")
_uuids = st.sampled_from(
    ["GPU-f-0", "GPU-f-1", "GPU-f-2", "all", "ALL", "none", "", "GPU-f-0 ", "a=b", "GPU-x-0"]
) | st.text(alphabet=st.characters(blacklist_characters=",:;"), max_size=12)
_numbers = st.sampled_from([0, 1, 100, 101, MEMORY, MEMORY + 1, 999999, -1, 2**40]) | st.integers()
_device = st.builds(
    lambda u, m, c: f"{u},NVIDIA,{m},{c}:", _uuids, _numbers.map(str), _numbers.map(str)
)
_values = st.lists(st.lists(_device, max_size=3).map("".join), max_size=3).map(
    lambda entries: "".join(e + ";" for e in entries)
) | st.text(max_size=60)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_values, containers=st.integers(1, 3), asked=st.integers(1, 3))
def test_garbage_never_yields_a_foreign_uuid_or_a_limit_above_the_device(
    tmp_path_factory: pytest.TempPathFactory, value: str, containers: int, asked: int
) -> None:
    backend = fake(tmp_path_factory.getbasetemp())
    devices = backend._devices
    try:
        plan = plan_allocation(forged(value, containers=containers), backend, [asked], devices)
    except AllocateError as exc:
        assert "ns/forged" in str(exc)
        return
    for container in plan.containers:
        envs = container.allocation.envs
        visible = envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(visible) == asked and all(_UUID_OK.fullmatch(u) for u in visible)
        assert len(set(visible)) == len(visible)
        for name, limit in envs.items():
            if name.startswith("CUDA_DEVICE_MEMORY_LIMIT_"):
                assert re.fullmatch(r"\d+m", limit) and int(limit[:-1]) <= MEMORY
        assert 0 <= int(envs["CUDA_DEVICE_SM_LIMIT"]) <= 100
