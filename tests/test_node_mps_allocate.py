"""A node in ``operating_mode: mps`` through kubelet's real device-plugin gRPC over a unix
socket (issue 23 item 4): the agent starts the MPS control daemon (a stand-in
``nvidia-cuda-mps-control`` on PATH, tests/_mps_fake.py), registers its GPUs with mode
``mps``, answers a pod's Allocate with MPS's client limits (no HAMi-core), refuses a pod
while the daemon is gone, and quits the daemon it started when it stops. Fake NVML; no
GPU and no real MPS here."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _mps_fake import FakeMpsControl
from _node_helpers import NODE, TO_ALLOC, MemoryKube, MiniKubelet, pod, running_agent, short_tmp_dir
from _nvml_helpers import FakeGpu, FakeNvml
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from hami import log
from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.backends import BackendSettings
from hami.backends.nvidia import NvidiaBackend
from hami.protocol import decode_node_devices, keys
from hami.testkit.cluster import poll

GPU = "GPU-p-1"
REGISTER = "hami.io/node-nvidia-register"


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> None:
    log.configure("info", "console", stream=sys.__stderr__)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with short_tmp_dir() as path:
        yield path


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMpsControl]:
    fake = FakeMpsControl(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.bin_dir}:/usr/bin:/bin")
    yield fake
    fake.kill(tmp_path / "mps" / "pipe")  # whatever the test left running


def nvidia(work: Path) -> NvidiaBackend:
    options: dict[str, Any] = {
        "sysfs_root": str(work),
        "topology_score": False,
        "health_checks": False,
        "operating_mode": "mps",
        "mps": {
            "pipe_dir": str(work / "mps" / "pipe"),
            "log_dir": str(work / "mps" / "log"),
            "shm_dir": str(work / "mps" / "shm"),
        },
        "mig_state_file": str(work / "mig.json"),
        "hamicore": {"containers_dir": str(work / "vgpu" / "containers")},
    }
    nvml = FakeNvml(
        [
            FakeGpu(0, "GPU-p-0", "Tesla T4", 15360 * 2**20, "00000000:07:00.0"),
            FakeGpu(1, GPU, "Tesla T4", 15360 * 2**20, "00000000:08:00.0"),
        ]
    )
    return NvidiaBackend(
        BackendSettings(split_count=4, options=options, register_format="json"), nvml=nvml
    )


def pending(kube: MemoryKube, name: str, value: str, bind_time: str = "100") -> None:
    """The pod as the scheduler leaves it: its decision and the node lock."""
    kube.add(pod(name, value, bind_time=bind_time))
    kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: f"2024-01-01T00:00:00Z,ns,{name}"})


async def allocate(plugin_dir: Path, device_id: str) -> api_pb2.ContainerAllocateResponse:
    channel = Channel(path=str(plugin_dir / "hami-nvidia.sock"))
    try:
        answer = await api_grpc.DevicePluginStub(channel).Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[device_id])]
            )
        )
    finally:
        channel.close()
    (response,) = answer.container_responses
    return response


async def test_an_mps_pod_through_the_device_plugin(
    short_dir: Path, tmp_path: Path, control: FakeMpsControl
) -> None:
    pipe = tmp_path / "mps" / "pipe"
    kube = MemoryKube()
    kubelet = MiniKubelet(short_dir)
    await kubelet.start()
    backend = nvidia(tmp_path)
    try:
        async with running_agent(short_dir, kube, backend, name="nvidia"):
            await poll(lambda: REGISTER in kube.nodes[NODE]["metadata"].get("annotations", {}))
            register = kube.nodes[NODE]["metadata"]["annotations"][REGISTER]
            assert [(d.uuid, d.mode, d.healthy) for d in decode_node_devices(register)] == [
                ("GPU-p-0", "mps", True),
                (GPU, "mps", True),
            ]
            daemon = control.daemon_pid(pipe)
            assert daemon is not None  # the agent started it

            pending(kube, "p", f"{GPU},NVIDIA,3000,40:;")
            response = await allocate(short_dir, f"{GPU}-2")
            assert dict(response.envs) == {
                "NVIDIA_VISIBLE_DEVICES": GPU,
                "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3000M",
            }
            assert [(m.host_path, m.container_path) for m in response.mounts] == [
                (str(pipe), str(pipe)),
                (str(tmp_path / "mps" / "shm"), "/dev/shm"),
            ]
            annotations = kube.annotations("p")
            assert annotations[keys.BIND_PHASE] == "success" and annotations[TO_ALLOC] == ";"
            assert not (tmp_path / "vgpu" / "containers").exists()  # no HAMi-core directory

            # the daemon dies: the next pod is refused (its CUDA would run unlimited), the agent
            # serves on, and registers the GPUs unhealthy until its next enumeration restarts it
            control.kill(pipe)
            pending(kube, "q", f"{GPU},NVIDIA,1000,10:;", bind_time="200")
            with pytest.raises(GRPCError, match=r"pod ns/q: .*no MPS control daemon answers"):
                await allocate(short_dir, f"{GPU}-3")
            assert kube.annotations("q")[keys.BIND_PHASE] == "failed"
            await poll(lambda: control.daemon_pid(pipe) not in (None, daemon))
    finally:
        await backend.close()  # the agent closes the backends it made; this one is ours
        await kubelet.stop()
    # it quit the daemon it started, and an enumeration still running then started none
    calls = [c.split(" pipe")[0] for c in control.calls()]
    assert "client quit" in calls and "start" not in calls[calls.index("client quit") :]
    assert control.daemon_pid(pipe) is None
