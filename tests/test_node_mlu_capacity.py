"""The MLU node agent advertises what Go HAMi 2.10's scheduler reads for Cambricon (issue 24
item 2): besides its register value and ``cambricon.com/vmlu``, a device plugin each for
``cambricon.com/mlu.smlu.vcore`` (100 units per card) and ``cambricon.com/mlu.smlu.vmemory``
(256 MiB units), whose Allocate adds nothing. Go's own reading of those capacities is
checked against its vectors in tests/test_go_vendor_vectors.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _cambricon_helpers import backend as mlu_backend
from _cambricon_helpers import fake_cnmon
from _node_helpers import MemoryKube, MiniKubelet, running_agent, short_tmp_dir
from grpclib.client import Channel

from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.backends.cambricon_go import devices_from_capacity
from hami.testkit.cluster import poll

VCORE = "cambricon.com/mlu.smlu.vcore"
VMEM = "cambricon.com/mlu.smlu.vmemory"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with short_tmp_dir() as path:
        yield path


async def _listed(socket: Path) -> api_pb2.ListAndWatchResponse:
    channel = Channel(path=str(socket))
    try:
        stub = api_grpc.DevicePluginStub(channel)
        async with stub.ListAndWatch.open() as lw:
            await lw.send_message(api_pb2.Empty(), end=True)
            listed = await lw.recv_message()
            await lw.cancel()
        assert listed is not None
        return listed
    finally:
        channel.close()


async def test_the_mlu_agent_advertises_gos_capacities(short_dir: Path) -> None:
    kube = MemoryKube()
    kubelet = MiniKubelet(short_dir)
    await kubelet.start()
    backend = mlu_backend(fake_cnmon(short_dir, "file"), host_root=str(short_dir))
    try:
        async with running_agent(short_dir, kube, backend):
            await poll(lambda: len(kubelet.requests) == 3)
            registered = {r.resource_name: r for r in kubelet.requests}
            assert set(registered) == {"cambricon.com/vmlu", VCORE, VMEM}
            assert registered[VCORE].endpoint == "hami-mlu-vcore.sock"
            assert not registered[VCORE].options.get_preferred_allocation_available
            vcore = await _listed(short_dir / "hami-mlu-vcore.sock")
            vmem = await _listed(short_dir / "hami-mlu-vmemory.sock")
            # Two MLU370-X4 of 23308 MiB: 2 x 100 vcore, 2 x 91 vmemory units.
            assert len(vcore.devices) == 200 and len(vmem.devices) == 182
            assert {d.health for d in vcore.devices} == {"Healthy"}
            channel = Channel(path=str(short_dir / "hami-mlu-vmemory.sock"))
            try:
                stub = api_grpc.DevicePluginStub(channel)
                answer = await stub.Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[
                            api_pb2.ContainerAllocateRequest(
                                devices_ids=[d.ID for d in vmem.devices[:4]]
                            )
                        ]
                    )
                )
            finally:
                channel.close()
            assert list(answer.container_responses) == [api_pb2.ContainerAllocateResponse()]
    finally:
        await kubelet.stop()
    # What kubelet then reports is what Go's scheduler reads: the two cards.
    node = {
        "metadata": {"name": "n"},
        "status": {"capacity": {VCORE: str(len(vcore.devices)), VMEM: str(len(vmem.devices))}},
    }
    cards = devices_from_capacity(node, backend.resources) or []
    assert [(c.uuid, c.memory) for c in cards] == [
        ("n-cambricon-mlu-0", 23296),
        ("n-cambricon-mlu-1", 23296),
    ]
