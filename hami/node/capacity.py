"""Device plugins for capacity resources: kubelet resources a backend advertises besides
its count resource (``Backend.capacity_units``), so that Go HAMi's scheduler, which reads
some vendors only from a Node's ``status.capacity`` (Cambricon's ``mlu.smlu.vcore`` and
``mlu.smlu.vmemory``), finds the devices of a node this project's agent serves.

Each resource lists ``units`` ids per healthy device (``{uuid}-{word}-{k}``) and answers
Allocate with nothing: the scheduler's decision and the count resource's Allocate carry what
a container gets; these only let kubelet admit pods that name the resource.
"""

from __future__ import annotations

from grpclib.server import Stream

from hami import log
from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.node.state import DeviceState

_log = log.get(__name__)


def resource_word(resource: str) -> str:
    """``cambricon.com/mlu.smlu.vcore`` -> ``vcore``: the word in its ids and socket name."""
    return resource.rsplit("/", 1)[-1].rsplit(".", 1)[-1]


def capacity_resources(state: DeviceState) -> list[str]:
    """The capacity resources the backend advertises for the node's devices, sorted."""
    names = {name for d in state.devices for name in state.backend.capacity_units(d)}
    return sorted(names)


def list_units(state: DeviceState, resource: str) -> api_pb2.ListAndWatchResponse:
    word = resource_word(resource)
    devices = []
    for device in state.devices:
        health = "Healthy" if device.healthy else "Unhealthy"
        units = state.backend.capacity_units(device).get(resource, 0)
        devices += [
            api_pb2.Device(ID=f"{device.uuid}-{word}-{k}", health=health) for k in range(units)
        ]
    return api_pb2.ListAndWatchResponse(devices=devices)


class CapacityService(api_grpc.DevicePluginBase):
    """One capacity resource of one backend's devices."""

    def __init__(self, state: DeviceState, resource: str, node: str = "") -> None:
        self.state = state
        self.resource = resource
        self.log = _log.bind(role="node", node=node, backend=state.name, resource=resource)

    async def GetDevicePluginOptions(
        self, stream: Stream[api_pb2.Empty, api_pb2.DevicePluginOptions]
    ) -> None:
        await stream.recv_message()
        await stream.send_message(api_pb2.DevicePluginOptions())

    async def ListAndWatch(
        self, stream: Stream[api_pb2.Empty, api_pb2.ListAndWatchResponse]
    ) -> None:
        await stream.recv_message()
        seen = self.state.version
        await stream.send_message(list_units(self.state, self.resource))
        while True:
            seen = await self.state.wait_changed(seen)
            await stream.send_message(list_units(self.state, self.resource))

    async def GetPreferredAllocation(
        self,
        stream: Stream[api_pb2.PreferredAllocationRequest, api_pb2.PreferredAllocationResponse],
    ) -> None:
        await stream.recv_message()
        await stream.send_message(api_pb2.PreferredAllocationResponse())

    async def Allocate(
        self, stream: Stream[api_pb2.AllocateRequest, api_pb2.AllocateResponse]
    ) -> None:
        request = await stream.recv_message()
        assert request is not None
        answers = [api_pb2.ContainerAllocateResponse() for _ in request.container_requests]
        await stream.send_message(api_pb2.AllocateResponse(container_responses=answers))

    async def PreStartContainer(
        self, stream: Stream[api_pb2.PreStartContainerRequest, api_pb2.PreStartContainerResponse]
    ) -> None:
        await stream.recv_message()
        await stream.send_message(api_pb2.PreStartContainerResponse())
