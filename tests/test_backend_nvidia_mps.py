"""The NVIDIA backend in ``operating_mode: mps`` (issue 23 item 4): configuration checks, the
register's ``mode: mps``, the MPS control daemon started, attached to, restarted and stopped
(through a stand-in ``nvidia-cuda-mps-control`` on PATH, tests/_mps_fake.py: no driver here),
and the Allocate answer (MPS client limits, no HAMi-core), on the fake NVML."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _mps_fake import FakeMpsControl
from _nvml_helpers import FakeGpu, FakeNvml
from structlog.testing import capture_logs

from hami.backends import BackendError, BackendSettings
from hami.backends.base import AllocationRequest
from hami.backends.mps import MpsSettings, mps_allocation
from hami.backends.nvidia import NvidiaBackend
from hami.protocol import ContainerDevice, decode_node_devices
from hami.protocol.mig import MIG_ALLOCATIONS_KEY, MigAllocation, MigPlacement
from hami.protocol.mig import encode_mig_allocations as encode_mig


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMpsControl]:
    fake = FakeMpsControl(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.bin_dir}:/usr/bin:/bin")
    yield fake
    fake.kill(tmp_path / "pipe")


def gpu(index: int, name: str = "Tesla T4", mig_mode: int | None = None) -> FakeGpu:
    return FakeGpu(
        index, f"GPU-s-{index}", name, 15360 * 2**20, f"00000000:0{index + 7}:00.0",
        mig_mode=mig_mode,
    )  # fmt: skip


def backend(
    tmp_path: Path,
    gpus: list[FakeGpu] | None = None,
    *,
    mps: dict[str, Any] | None = None,
    register_format: str = "json",
    **settings: Any,
) -> NvidiaBackend:
    options: dict[str, Any] = {
        "sysfs_root": str(tmp_path),
        "topology_score": False,
        "health_checks": False,
        "operating_mode": "mps",
        "mps": {
            "pipe_dir": str(tmp_path / "pipe"),
            "log_dir": str(tmp_path / "log"),
            **(mps or {}),
        },
        "mig_state_file": str(tmp_path / "mig.json"),
    }
    return NvidiaBackend(
        BackendSettings(options=options, register_format=register_format, **settings),
        nvml=FakeNvml(gpus if gpus is not None else [gpu(0), gpu(1)]),
    )


def request(
    devices: list[ContainerDevice],
    limits: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> AllocationRequest:
    return AllocationRequest(
        pod_namespace="ns",
        pod_name="p",
        pod_uid="uid-p",
        container_name="c",
        container_index=0,
        devices=devices,
        node_devices=[],
        container_limits=limits or {},
        pod_annotations=annotations or {},
    )


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("mps", "message"),
    [
        ("yes", "option 'mps' must be a mapping"),
        ({"pipe": "/x"}, "unknown mps option(s) ['pipe']"),
        ({"pipe_dir": "relative/pipe"}, "'pipe_dir' must be absolute"),
        ({"pipe_dir": ""}, "'pipe_dir' must not be empty"),
        ({"log_dir": 3}, "'log_dir' must be a path"),
        ({"shm_dir": "/a,b"}, "'shm_dir' must be a path without ','"),
        ({"daemon": "run"}, "'daemon' must be start"),
        ({"start_timeout_s": 0}, "'start_timeout_s' must be a number > 0"),
        ({"start_timeout_s": True}, "'start_timeout_s' must be a number > 0"),
    ],
)
def test_bad_mps_options_are_config_errors(tmp_path: Path, mps: Any, message: str) -> None:
    options = {"operating_mode": "mps", "mps": mps}
    with pytest.raises(BackendError) as caught:
        NvidiaBackend(BackendSettings(options=options, register_format="json"), nvml=FakeNvml([]))
    assert message in str(caught.value)


def test_mps_needs_the_json_register_form(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="operating_mode mps needs register_format: json"):
        backend(tmp_path, register_format="seed")


def test_an_unknown_mode_names_the_three(tmp_path: Path) -> None:
    options = {"operating_mode": "time-slicing"}
    with pytest.raises(BackendError, match="one of hami-core, mig, mps") as caught:
        NvidiaBackend(BackendSettings(options=options), nvml=FakeNvml([]))
    assert "'time-slicing'" in str(caught.value)


def test_defaults(tmp_path: Path) -> None:
    nvidia = NvidiaBackend(
        BackendSettings(options={"operating_mode": "mps"}, register_format="json"),
        nvml=FakeNvml([]),
    )
    assert nvidia.mps is not None and nvidia.mps.settings == MpsSettings()
    assert nvidia.allocate_does_io
    assert NvidiaBackend(BackendSettings(), nvml=FakeNvml([])).mps is None


# --------------------------------------------------------------------------- register + daemon


async def test_registers_mode_mps_and_starts_the_daemon(
    tmp_path: Path, control: FakeMpsControl
) -> None:
    nvidia = backend(
        tmp_path, [gpu(0), gpu(1), gpu(2, "A100-SXM4-40GB", mig_mode=1)], memory_scaling=2.0
    )
    with capture_logs() as logs:
        devices = await nvidia.enumerate()
    assert [d.healthy for d in devices] == [True, True]  # the MIG GPU is not registered
    skipped = next(e for e in logs if e["event"] == "nvidia.device_skipped_for_mode")
    assert skipped["uuid"] == "GPU-s-2" and "MPS mode cannot share" in skipped["hint"]
    value = nvidia.register_value(nvidia.to_node_devices(devices))
    assert json.loads(value)[0] == {
        "id": "GPU-s-0",
        "count": 10,
        "devmem": 30720,  # scaled as in hami-core mode (Go applies scaling unless mig)
        "devcore": 100,
        "type": "NVIDIA-Tesla T4",
        "mode": "mps",
        "health": True,
    }
    assert [d.mode for d in decode_node_devices(value)] == ["mps", "mps"]
    first = f"client get_server_list pipe={tmp_path}/pipe log={tmp_path}/log"
    assert control.calls()[0] == first
    assert control.calls()[1].startswith("start pipe=")
    assert nvidia.mps is not None and nvidia.mps.started
    assert control.daemon_pid(tmp_path / "pipe") is not None
    assert any(e["event"] == "nvidia.mps_daemon_started" for e in logs)

    # enumerating again only asks: the daemon answers
    before = len(control.calls())
    await nvidia.enumerate()
    assert [c.split(" pipe")[0] for c in control.calls()[before:]] == ["client get_server_list"]

    # the daemon dies behind the agent's back: the next enumeration starts another
    control.kill(tmp_path / "pipe")
    assert all(d.healthy for d in await nvidia.enumerate())
    assert sum(c.startswith("start") for c in control.calls()) == 2

    await nvidia.close()  # quits the daemon it started
    assert control.calls()[-1].startswith("client quit")
    assert control.daemon_pid(tmp_path / "pipe") is None


async def test_attaches_to_a_running_daemon_and_leaves_it_running(
    tmp_path: Path, control: FakeMpsControl
) -> None:
    theirs = control.start_elsewhere(tmp_path / "pipe", tmp_path / "log")
    nvidia = backend(tmp_path)
    with capture_logs() as logs:
        assert all(d.healthy for d in await nvidia.enumerate())
    assert nvidia.mps is not None and not nvidia.mps.started
    assert any(e["event"] == "nvidia.mps_daemon_attached" for e in logs)
    await nvidia.close()
    assert control.daemon_pid(tmp_path / "pipe") == theirs  # not ours to stop
    assert not any("quit" in c for c in control.calls())


async def test_without_a_daemon_the_gpus_are_unhealthy_and_allocate_refuses(
    tmp_path: Path, control: FakeMpsControl
) -> None:
    nvidia = backend(tmp_path, mps={"daemon": "attach"})
    with capture_logs() as logs:
        devices = await nvidia.enumerate()
        await nvidia.enumerate()
    assert [d.healthy for d in devices] == [False, False]
    warned = [e for e in logs if e["event"] == "nvidia.mps_daemon_unavailable"]
    assert len(warned) == 1 and "daemon: attach" in warned[0]["hint"]  # once per change
    assert "Cannot find MPS control daemon process" in warned[0]["problem"]
    assert not any(c.startswith("start") for c in control.calls())  # attach never starts
    one = [ContainerDevice("GPU-s-0", "NVIDIA", 3000, 30)]
    with pytest.raises(BackendError, match="shares its GPUs through MPS and no MPS control"):
        nvidia.allocate(request(one))

    # someone starts it: healthy again at the next enumeration, and Allocate answers
    control.start_elsewhere(tmp_path / "pipe", tmp_path / "log")
    assert all(d.healthy for d in await nvidia.enumerate())
    assert nvidia.allocate(request(one)).envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"


async def test_a_daemon_that_cannot_start_or_no_control_program(
    tmp_path: Path, control: FakeMpsControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    control.fail_start()
    nvidia = backend(tmp_path, mps={"start_timeout_s": 1})
    with capture_logs() as logs:
        assert not any(d.healthy for d in await nvidia.enumerate())
    (warned,) = [e for e in logs if e["event"] == "nvidia.mps_daemon_unavailable"]
    assert f"-d exited 1 (its log: {tmp_path}/log/control.log)" in warned["problem"]
    assert (tmp_path / "pipe").is_dir() and (tmp_path / "log").is_dir()

    monkeypatch.setenv("PATH", "/nonexistent")
    with capture_logs() as logs:
        assert not any(d.healthy for d in await backend(tmp_path).enumerate())
    (warned,) = [e for e in logs if e["event"] == "nvidia.mps_daemon_unavailable"]
    assert "'nvidia-cuda-mps-control' is not on the agent's PATH" in warned["problem"]


# --------------------------------------------------------------------------- Allocate


def test_the_answer_is_mps_limits_and_no_hamicore(tmp_path: Path) -> None:
    settings = MpsSettings(pipe_dir="/run/mps/pipe", shm_dir="/run/mps/shm")
    devices = [
        ContainerDevice("GPU-s-0", "NVIDIA", 3000, 30),
        ContainerDevice("GPU-s-1", "NVIDIA", 4096, 30),
    ]
    answer = mps_allocation(
        request(devices, limits={"nvidia.com/priority": "1"}),
        settings,
        priority_resource="nvidia.com/priority",
    )
    assert answer.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-s-0,GPU-s-1",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3000M,1=4096M",
        "CUDA_MPS_CLIENT_PRIORITY": "1",
    }
    assert [(m.host_path, m.container_path, m.read_only) for m in answer.mounts] == [
        ("/run/mps/pipe", "/run/mps/pipe", False),
        ("/run/mps/shm", "/dev/shm", False),
    ]
    assert not answer.host_dirs and not answer.devices and not answer.pod_annotations


@pytest.mark.parametrize(
    ("devices", "threads", "pinned"),
    [
        ([("GPU-s-0", 0, 0)], None, None),  # no cores, no memory asked: no limit
        ([("GPU-s-0", 15360, 100)], "100", "0=15360M"),
        ([("GPU-s-0", 0, 50), ("GPU-s-1", 2000, 50)], "50", "1=2000M"),
    ],
)
def test_limits_follow_cores_and_memory(
    devices: list[tuple[str, int, int]], threads: str | None, pinned: str | None
) -> None:
    answer = mps_allocation(
        request([ContainerDevice(u, "NVIDIA", m, c) for u, m, c in devices]), MpsSettings()
    )
    assert answer.envs.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == threads
    assert answer.envs.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == pinned
    assert [m.container_path for m in answer.mounts] == ["/run/nvidia/mps/pipe"]
    assert "CUDA_MPS_CLIENT_PRIORITY" not in answer.envs


async def test_backend_allocate_on_an_mps_node(tmp_path: Path, control: FakeMpsControl) -> None:
    nvidia = backend(tmp_path)
    await nvidia.enumerate()
    one = [ContainerDevice("GPU-s-1", "NVIDIA", 2048, 25)]
    answer = nvidia.allocate(request(one, limits={"nvidia.com/priority": 0}))
    assert answer.envs["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "pipe")
    assert answer.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert answer.envs["CUDA_MPS_CLIENT_PRIORITY"] == "0"
    assert not any(k.startswith("CUDA_DEVICE_") for k in answer.envs)  # no HAMi-core
    assert not any("vgpu" in m.host_path for m in answer.mounts)

    # a pod that reserved a MIG instance is refused here
    reserved = encode_mig([MigAllocation(0, 0, "GPU-s-1", "1g.5gb", MigPlacement(0, 1))])
    with pytest.raises(BackendError, match="operating_mode: mps, which makes no MIG"):
        nvidia.allocate(request(one, annotations={MIG_ALLOCATIONS_KEY: reserved}))
    with pytest.raises(BackendError, match="no devices to allocate"):
        nvidia.allocate(request([]))
    await nvidia.close()
