"""Node role without a cluster: allocation decisions, the registration loop, the gRPC plugin
against an in-memory API server and a minimal kubelet Registration service."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _node_helpers import (
    NODE,
    TO_ALLOC,
    MemoryKube,
    MiniKubelet,
    counting_clock,
    fake_backend,
    pod,
    running_agent,
    short_tmp_dir,
)
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from hami import log
from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.backends.base import BackendSettings, HealthCallback
from hami.backends.fake import FakeBackend
from hami.config import Config, NodeConfig
from hami.node.allocate import (
    AllocateError,
    choose_pod,
    plan_allocation,
    preferred_replicas,
)
from hami.node.metrics import NodeMetrics
from hami.node.registration import Registrar
from hami.node.state import DeviceState
from hami.protocol import keys
from hami.testkit.cluster import poll


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> None:
    """Another test's cli.main may have pointed logging at a capture stream closed since."""
    log.configure("info", "console", stream=sys.__stderr__)


# --------------------------------------------------------------------------- pure decisions


def test_choose_pod_prefers_lock_then_oldest_bind_time() -> None:
    a, b = pod("a", "GPU-u-0,NVIDIA,1,0:;", bind_time="200"), pod("b", "x", bind_time="100")
    c = pod("c", "x", phase="success", bind_time="1")
    assert choose_pod(NODE, TO_ALLOC, None, [a, b, c]) is b
    assert choose_pod(NODE, TO_ALLOC, a, [a, b, c]) is a
    assert choose_pod(NODE, TO_ALLOC, c, [c]) is None
    assert choose_pod(NODE, TO_ALLOC, None, [pod("d", "x", node="other")]) is None
    # Done with this type (waiting for another type's Allocate): not a candidate.
    done = pod("e", ";", bind_time="1")
    assert choose_pod(NODE, TO_ALLOC, done, [done, b]) is b


def test_plan_two_containers_then_done(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    value = "GPU-u-0,NVIDIA,3000,0:;GPU-u-0,NVIDIA,5000,0:;"
    p = pod("p", value, containers=2)
    devices = backend._devices
    first = plan_allocation(p, backend, [1], devices)
    assert first.annotations == {TO_ALLOC: ";GPU-u-0,NVIDIA,5000,0:;"} and not first.done
    assert first.containers[0].name == "c0"
    assert first.containers[0].allocation.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    p["metadata"]["annotations"][TO_ALLOC] = first.annotations[TO_ALLOC]
    second = plan_allocation(p, backend, [1], devices)
    assert second.done and second.containers[0].name == "c1"
    assert second.annotations == {TO_ALLOC: ";;", keys.BIND_PHASE: "success"}


def test_plan_errors_name_the_pod_and_cause(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    with pytest.raises(AllocateError, match=r"ns/p.*count mismatch.*asked for 2.*assigned 1"):
        plan_allocation(pod("p", "GPU-u-0,NVIDIA,1,0:;"), backend, [2], [])
    with pytest.raises(AllocateError, match=r"ns/p.*invalid pod devices value"):
        plan_allocation(pod("p", "GPU-u-0,NVIDIA,many,0:;"), backend, [1], [])
    with pytest.raises(AllocateError, match=r"no devices left"):
        plan_allocation(pod("p", ";"), backend, [1], [])
    with pytest.raises(AllocateError, match=r"no matching container"):
        plan_allocation(pod("p", ";GPU-u-0,NVIDIA,1,0:;"), backend, [1], [])


def test_preferred_replicas_steer_to_chosen_devices() -> None:
    def uuid_of(replica: str) -> str | None:
        return replica.rpartition("-")[0]

    available = ["GPU-a-0", "GPU-a-1", "GPU-b-0", "GPU-b-1", "GPU-c-0"]
    assert preferred_replicas(available, [], 2, ["GPU-c", "GPU-b"], uuid_of) == [
        "GPU-c-0",
        "GPU-b-0",
    ]
    assert preferred_replicas(available, ["GPU-a-1"], 1, ["GPU-c"], uuid_of) == ["GPU-a-1"]
    assert preferred_replicas(available, [], 2, None, uuid_of) == ["GPU-a-0", "GPU-a-1"]
    assert preferred_replicas(available, [], 2, ["GPU-zz"], uuid_of) == ["GPU-a-0", "GPU-a-1"]


# --------------------------------------------------------------------------- registration loop


class HealthyFake(FakeBackend):
    """A fake backend whose health changes arrive as events, like NVML's."""

    def __init__(self, settings: BackendSettings) -> None:
        super().__init__(settings)
        self.callback: HealthCallback | None = None

    async def watch_health(self, devices: Any, on_change: HealthCallback) -> None:
        self.callback = on_change
        await asyncio.Event().wait()


async def test_registrar_writes_at_once_retries_and_reacts_to_health(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    state = DeviceState("fake", backend)
    state.bind_loop()
    state.set_enumerated(await backend.enumerate())
    kube = MemoryKube()
    kube.fail_node_patches = 2
    writes = kube.node_patches
    registrar = Registrar(
        state,
        kube,
        node=NODE,
        period=30,
        metrics=NodeMetrics(),
        now=counting_clock(),
        min_backoff=0.05,
    )
    task = asyncio.create_task(registrar.run())
    try:
        await poll(lambda: bool(writes), 5)
        assert writes[0] == {
            "hami.io/node-nvidia-register": "GPU-u-0,4,16384,100,NVIDIA-Test,0,true:"
            "GPU-u-1,4,16384,100,NVIDIA-Test,0,true:",
            "hami.io/node-handshake-nvidia": "Reported_2024-01-23 04:30:02",
            # Go HAMi's NVIDIA key too (protocol.md §1), so its schedulers see the heartbeat
            "hami.io/node-handshake": "Reported_2024-01-23 04:30:02",
        }
        assert registrar.failures == 0
        # A health change is written at once, not after the 30 s period.
        state.on_health("GPU-u-1", False)
        await poll(lambda: len(writes) >= 2, 5)
        assert "GPU-u-1,4,16384,100,NVIDIA-Test,0,false:" in str(
            writes[1]["hami.io/node-nvidia-register"]
        )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --------------------------------------------------------------------------- plugin over gRPC


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with short_tmp_dir() as path:
        yield path


@pytest.mark.parametrize("numa_topology", [False, True])
async def test_numa_topology_reaches_kubelet_only_when_asked(
    short_dir: Path, numa_topology: bool
) -> None:
    """node.numa_topology (Go HAMi's enableNumaTopology, off by default): the devices'
    NUMA node goes to kubelet's topology manager only when turned on."""
    kube = MemoryKube()
    kubelet = MiniKubelet(short_dir)
    await kubelet.start()
    backend = FakeBackend(
        BackendSettings(
            split_count=2,
            options={
                "devices": [{"count": 2, "model": "NVIDIA-Test", "memory": 16384, "numa": 1}],
                "uuid_prefix": "GPU-u",
                "hamicore": {"containers_dir": str(short_dir / "containers")},
            },
        )
    )
    cfg = Config(node=NodeConfig(numa_topology=numa_topology))
    try:
        async with running_agent(short_dir, kube, backend, cfg):
            await poll(lambda: len(kubelet.requests) == 1)
            channel = Channel(path=str(short_dir / "hami-nvidia.sock"))
            try:
                stub = api_grpc.DevicePluginStub(channel)
                async with stub.ListAndWatch.open() as lw:
                    await lw.send_message(api_pb2.Empty(), end=True)
                    listed = await lw.recv_message()
                    await lw.cancel()
            finally:
                channel.close()
    finally:
        await kubelet.stop()
    assert listed is not None and len(listed.devices) == 4
    if numa_topology:
        assert {tuple(n.ID for n in d.topology.nodes) for d in listed.devices} == {(1,)}
    else:
        assert not any(d.HasField("topology") for d in listed.devices)


async def test_plugin_allocate_health_and_reregistration(short_dir: Path) -> None:
    kube = MemoryKube()
    kubelet = MiniKubelet(short_dir)
    await kubelet.start()
    backend = HealthyFake(fake_backend(short_dir).settings)
    try:
        async with running_agent(short_dir, kube, backend) as agent:
            await poll(lambda: len(kubelet.requests) == 1)
            request = kubelet.requests[0]
            assert (request.version, request.endpoint, request.resource_name) == (
                "v1beta1",
                "hami-nvidia.sock",
                "nvidia.com/gpu",
            )
            assert request.options.get_preferred_allocation_available
            await poll(
                lambda: (
                    "hami.io/node-nvidia-register"
                    in kube.nodes[NODE]["metadata"].get("annotations", {})
                )
            )
            channel = Channel(path=str(short_dir / "hami-nvidia.sock"))
            stub = api_grpc.DevicePluginStub(channel)
            try:
                options = await stub.GetDevicePluginOptions(api_pb2.Empty())
                assert options.get_preferred_allocation_available
                async with stub.ListAndWatch.open() as lw:
                    await lw.send_message(api_pb2.Empty(), end=True)
                    first = await lw.recv_message()
                    assert first is not None
                    assert [d.ID for d in first.devices][:5] == [
                        "GPU-u-0-0",
                        "GPU-u-0-1",
                        "GPU-u-0-2",
                        "GPU-u-0-3",
                        "GPU-u-1-0",
                    ]
                    assert {d.health for d in first.devices} == {"Healthy"}
                    await poll(lambda: backend.callback is not None)
                    assert backend.callback is not None
                    backend.callback("GPU-u-1", False)
                    second = await lw.recv_message()
                    assert second is not None
                    health = {d.ID: d.health for d in second.devices}
                    assert health["GPU-u-1-2"] == "Unhealthy" and health["GPU-u-0-2"] == "Healthy"
                    await lw.cancel()
                # No pending pod: a clear error, and the plugin keeps serving.
                with pytest.raises(GRPCError, match="no pending pod"):
                    await stub.Allocate(
                        api_pb2.AllocateRequest(
                            container_requests=[
                                api_pb2.ContainerAllocateRequest(devices_ids=["GPU-u-0-0"])
                            ]
                        )
                    )
                kube.add(pod("p", "GPU-u-1,NVIDIA,3000,50:;"))
                kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: "2024-01-01T00:00:00Z,ns,p"})
                preferred = await stub.GetPreferredAllocation(
                    api_pb2.PreferredAllocationRequest(
                        container_requests=[
                            api_pb2.ContainerPreferredAllocationRequest(
                                available_deviceIDs=["GPU-u-0-0", "GPU-u-1-3"], allocation_size=1
                            )
                        ]
                    )
                )
                assert list(preferred.container_responses[0].deviceIDs) == ["GPU-u-1-3"]
                answer = await stub.Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[
                            api_pb2.ContainerAllocateRequest(devices_ids=["GPU-u-1-3"])
                        ]
                    )
                )
                envs = dict(answer.container_responses[0].envs)
                assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-u-1"
                assert envs["CUDA_DEVICE_SM_LIMIT"] == "50"
                host_dir = short_dir / "containers" / "uid-p_c0"
                assert stat.S_IMODE(os.stat(host_dir).st_mode) == 0o777
                assert kube.annotations("p")[TO_ALLOC] == ";"
                assert kube.annotations("p")[keys.BIND_PHASE] == "success"
                assert keys.NODE_LOCK not in kube.nodes[NODE]["metadata"]["annotations"]
                assert await stub.PreStartContainer(api_pb2.PreStartContainerRequest()) is not None
            finally:
                channel.close()

            # kubelet restarts: a new kubelet.sock -> registered again within seconds.
            await kubelet.stop()
            await kubelet.start()
            await poll(lambda: len(kubelet.requests) == 2)
            # kubelet wiped the directory: the plugin serves a new socket and registers.
            (short_dir / "hami-nvidia.sock").unlink()
            await poll(lambda: len(kubelet.requests) == 3)
            assert (short_dir / "hami-nvidia.sock").exists()
            assert agent.metrics.render().count(b"hami_node_allocate_calls_total") >= 1
    finally:
        await kubelet.stop()
    assert not (short_dir / "hami-nvidia.sock").exists()


def test_pod_with_two_device_types_is_done_when_both_are(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    p = pod("p", "GPU-u-0,NVIDIA,3000,0:;")
    p["metadata"]["annotations"]["hami.io/cambricon-mlu-devices-to-allocate"] = "MLU-1,MLU,256,0:;"
    plan = plan_allocation(p, backend, [1], backend._devices)
    assert not plan.done and keys.BIND_PHASE not in plan.annotations
    p["metadata"]["annotations"]["hami.io/cambricon-mlu-devices-to-allocate"] = ";"
    assert plan_allocation(p, backend, [1], backend._devices).done
