"""An Ascend node agent through the real device-plugin gRPC (issue 24 item 3): a stand-in
``npu-smi`` printing the documented layouts, kubelet's Registration and Allocate calls, and
an in-memory API server holding the pod as the scheduler leaves it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _ascend_helpers import b3_node, fake_npu_smi
from _node_helpers import NODE, MemoryKube, MiniKubelet, pod, running_agent, short_tmp_dir
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.backends import BackendSettings
from hami.backends.ascend import BACKENDS
from hami.backends.ascend_chips import CHIPS
from hami.backends.ascend_rules import runtime_info
from hami.protocol import ContainerDevice, encode_pod_devices, keys
from hami.testkit.ascend_node import ascend_register
from hami.testkit.cluster import poll

WORD = "Ascend910B3"
REGISTER = f"hami.io/node-register-{WORD}"
TO_ALLOC = f"hami.io/{WORD}-devices-to-allocate"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with short_tmp_dir() as path:
        yield path


def ascend_pod(name: str, devices: list[ContainerDevice], **extra: str) -> dict[str, Any]:
    """The pod as this scheduler leaves it on the node: its decision under Ascend's keys."""
    value = encode_pod_devices([devices])
    the_pod = pod(name, value)
    annotations = the_pod["metadata"]["annotations"]
    annotations.pop("hami.io/vgpu-devices-to-allocate")
    annotations.pop("hami.io/vgpu-devices-allocated")
    annotations[TO_ALLOC] = value
    annotations[f"hami.io/{WORD}-devices-allocated"] = value
    annotations.update(runtime_info(CHIPS[WORD], [devices], extra), **extra)
    return the_pod


async def allocate(short_dir: Path, ids: list[str]) -> api_pb2.ContainerAllocateResponse:
    channel = Channel(path=str(short_dir / f"hami-{WORD}.sock"))
    try:
        answer = await api_grpc.DevicePluginStub(channel).Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
            )
        )
    finally:
        channel.close()
    (response,) = answer.container_responses
    assert isinstance(response, api_pb2.ContainerAllocateResponse)
    return response


async def listed(short_dir: Path) -> api_pb2.ListAndWatchResponse:
    channel = Channel(path=str(short_dir / f"hami-{WORD}.sock"))
    try:
        async with api_grpc.DevicePluginStub(channel).ListAndWatch.open() as lw:
            await lw.send_message(api_pb2.Empty(), end=True)
            first = await lw.recv_message()
            await lw.cancel()
    finally:
        channel.close()
    assert first is not None
    return first


async def test_an_ascend_node_agent_registers_and_allocates(short_dir: Path) -> None:
    chips = b3_node(8, unhealthy=(7,))
    script, dev = fake_npu_smi(short_dir, chips)
    backend = BACKENDS[WORD](BackendSettings(options={"npu_smi": str(script), "dev_dir": str(dev)}))
    kube = MemoryKube()
    kubelet = MiniKubelet(short_dir)
    await kubelet.start()
    try:
        async with running_agent(short_dir, kube, backend, name=WORD):
            node = kube.nodes[NODE]["metadata"]
            await poll(lambda: REGISTER in node.get("annotations", {}))
            annotations = node["annotations"]
            expected = json.loads(ascend_register(WORD, [c.uuid for c in chips], 65536, 20, 4))
            del expected[7]["health"]  # Go leaves a false health out
            assert json.loads(annotations[REGISTER]) == expected
            assert annotations[f"hami.io/node-handshake-{WORD}"].startswith("Reported_")
            assert annotations["hami-vnpu-core"] == "false"

            (registered,) = kubelet.requests
            assert registered.resource_name == f"huawei.com/{WORD}"
            assert registered.endpoint == f"hami-{WORD}.sock"
            devices = (await listed(short_dir)).devices
            assert len(devices) == 8 * 4  # four vNPUs of the smallest template per chip
            unhealthy = {d.ID for d in devices if d.health != "Healthy"}
            assert unhealthy == {f"{chips[7].uuid}-{i}" for i in range(4)}

            # a 16 GiB vNPU on the chip of logic id 2, which is /dev/davinci5
            vnpu = [ContainerDevice(chips[2].uuid, WORD, 16384, 0)]
            kube.add(ascend_pod("p", vnpu))
            kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: "2024-01-01T00:00:00Z,ns,p"})
            answer = await allocate(short_dir, [devices[0].ID])
            assert dict(answer.envs) == {
                "ASCEND_VISIBLE_DEVICES": "5",
                "ASCEND_VNPU_SPECS": "vir05_1c_16g",
            }
            after = kube.annotations("p")
            assert after[keys.BIND_PHASE] == "success" and after[TO_ALLOC] == ";"
            assert keys.NODE_LOCK not in kube.nodes[NODE]["metadata"]["annotations"]

            # a pod asking for the soft split: refused by name, the pod marked failed
            soft = [ContainerDevice(chips[3].uuid, WORD, 4000, 10)]
            kube.add(ascend_pod("q", soft, **{"huawei.com/vnpu-mode": "hami-core"}))
            kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: "2024-01-01T00:00:00Z,ns,q"})
            with pytest.raises(GRPCError, match=r"pod ns/q.*soft split .*does not offer"):
                await allocate(short_dir, [devices[4].ID])
            assert kube.annotations("q")[keys.BIND_PHASE] == "failed"
    finally:
        await kubelet.stop()
