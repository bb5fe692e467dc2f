"""A node in ``operating_mode: mig`` through kubelet's real device-plugin gRPC over a unix
socket (issue 23 item 3): a pod with a MIG reservation is allocated (the instance made, the
MIG UUID answered, the reservation completed on the pod), allocated again (nothing new
made), the agent restarted (the instance kept and adopted), and the pod deleted (the
instance removed), on the fake NVML."""

from __future__ import annotations

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
    pod,
    running_agent,
    short_tmp_dir,
)
from _nvml_helpers import FakeGpu, FakeNvml
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from hami import log
from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.backends import BackendSettings
from hami.backends.nvidia import NvidiaBackend
from hami.protocol import decode_node_devices, keys
from hami.protocol.mig import (
    MIG_ALLOCATIONS_KEY,
    MigAllocation,
    MigPlacement,
    decode_mig_allocations,
    encode_mig_allocations,
)
from hami.testkit.cluster import poll

GPU = "GPU-m-0"
VALUE = f"{GPU},NVIDIA,19968,43:;"
RESERVED = [MigAllocation(0, 0, GPU, "3g.20gb", MigPlacement(4, 4))]


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> None:
    log.configure("info", "console", stream=sys.__stderr__)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with short_tmp_dir() as path:
        yield path


def nvidia(nvml: FakeNvml, work: Path) -> NvidiaBackend:
    options: dict[str, Any] = {
        "sysfs_root": str(work),
        "topology_score": False,
        "health_checks": False,
        "operating_mode": "mig",
        "mig_profile_allowlist": [{"models": ["A100"], "profiles": ["1g.5gb", "3g.20gb"]}],
        "hamicore": {"containers_dir": str(work / "vgpu" / "containers")},
    }
    return NvidiaBackend(
        BackendSettings(split_count=7, options=options, register_format="json"), nvml=nvml
    )


def agent(plugin_dir: Path, kube: MemoryKube, backend: NvidiaBackend) -> Any:
    return running_agent(plugin_dir, kube, backend, name="nvidia")


def pending(kube: MemoryKube, allocations: list[MigAllocation]) -> None:
    """The pod as the scheduler leaves it: its decision, its reservation, the node lock."""
    the_pod = pod("p", VALUE)
    the_pod["metadata"]["annotations"][MIG_ALLOCATIONS_KEY] = encode_mig_allocations(allocations)
    kube.add(the_pod)
    kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: "2024-01-01T00:00:00Z,ns,p"})


def again(kube: MemoryKube) -> None:
    """kubelet asks again (its answer was lost): the decision pending once more."""
    kube._merge(
        kube.pods[("ns", "p")],
        {TO_ALLOC: VALUE, keys.BIND_PHASE: "allocating"},
    )
    kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: "2024-01-01T00:00:00Z,ns,p"})


async def allocate(plugin_dir: Path) -> dict[str, str]:
    channel = Channel(path=str(plugin_dir / "hami-nvidia.sock"))
    try:
        answer = await api_grpc.DevicePluginStub(channel).Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{GPU}-0"])]
            )
        )
    finally:
        channel.close()
    assert not answer.container_responses[0].mounts  # no HAMi-core on a MIG instance
    return dict(answer.container_responses[0].envs)


async def test_a_mig_pod_through_the_device_plugin(short_dir: Path, tmp_path: Path) -> None:
    nvml = FakeNvml(
        [
            FakeGpu(0, GPU, "A100-SXM4-40GB", 40960 * 2**20, "00000000:07:00.0", mig_mode=1),
            FakeGpu(1, "GPU-m-1", "A100-SXM4-40GB", 40960 * 2**20, "00000000:08:00.0"),
        ]
    )
    kube = MemoryKube()
    kubelet = MiniKubelet(short_dir)
    await kubelet.start()
    try:
        async with agent(short_dir, kube, nvidia(nvml, tmp_path)):
            await poll(
                lambda: (
                    "hami.io/node-nvidia-register"
                    in kube.nodes[NODE]["metadata"].get("annotations", {})
                )
            )
            register = kube.nodes[NODE]["metadata"]["annotations"]["hami.io/node-nvidia-register"]
            assert [(d.uuid, d.mode) for d in decode_node_devices(register)] == [(GPU, "mig")]

            pending(kube, RESERVED)
            envs = await allocate(short_dir)
            annotations = kube.annotations("p")
            (done,) = decode_mig_allocations(annotations[MIG_ALLOCATIONS_KEY])
            assert envs == {"NVIDIA_VISIBLE_DEVICES": done.mig_uuid}
            assert done.mig_uuid.startswith("MIG-") and done.compute_instance_id == 0
            assert annotations[keys.BIND_PHASE] == "success" and annotations[TO_ALLOC] == ";"
            assert [p for p, _ in nvml.live(0).values()] == [MigPlacement(4, 4)]

            again(kube)
            assert await allocate(short_dir) == envs
            assert len(nvml.created) == 1

            # a second pod reserving a placement a foreign instance holds: a clear error, and
            # the agent serves on
            foreign = nvml.add_instance(0, 0, 0)
            kube.add(pod("q", VALUE, bind_time="200"))
            kube._merge(
                kube.pods[("ns", "q")],
                {
                    MIG_ALLOCATIONS_KEY: encode_mig_allocations(
                        [MigAllocation(0, 0, GPU, "1g.5gb", MigPlacement(0, 1))]
                    )
                },
            )
            kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: "2024-01-01T00:00:00Z,ns,q"})
            with pytest.raises(GRPCError, match=r"pod ns/q: .*did not make.*-dgi -gi"):
                await allocate(short_dir)
            assert kube.annotations("q")[keys.BIND_PHASE] == "failed"
            del kube.pods[("ns", "q")]

        # the agent restarts: the instance stays (its pod runs) and is adopted
        again(kube)
        async with agent(short_dir, kube, nvidia(nvml, tmp_path)):
            assert await allocate(short_dir) == envs
            assert len(nvml.created) == 2 and foreign in nvml.live(0)  # 1 + the operator's
            del kube.pods[("ns", "p")]  # the pod is deleted: its instance goes, no other
            await poll(lambda: list(nvml.live(0)) == [foreign])
    finally:
        await kubelet.stop()
