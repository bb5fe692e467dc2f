"""The kubelet device plugin (API v1beta1, grpclib) for one backend's count resource.

``PluginServer.run`` serves ``{device_plugin_dir}/hami-{type}.sock``, registers it through
``kubelet.sock`` and watches both sockets (about once a second): when kubelet.sock is
recreated (kubelet restarted) the plugin registers again, and when its own socket is gone
(kubelet cleans the directory on start) it serves a new one first (protocol.md section 7).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from hami import log
from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.backends.base import ContainerAllocation
from hami.node.allocate import AllocateError, Allocator, preferred_replicas
from hami.node.capacity import CapacityService, resource_word
from hami.node.metrics import NodeMetrics
from hami.node.state import DeviceState

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

_log = log.get(__name__)


def socket_name(type_word: str) -> str:
    return f"hami-{type_word}.sock"


def list_response(state: DeviceState, numa: bool = False) -> api_pb2.ListAndWatchResponse:
    """``split count`` replicas ``{uuid}-{i}`` per device, with its health, and its NUMA
    node when ``numa`` (node.numa_topology). Without it kubelet's topology manager sees no
    hint for these devices, as with Go HAMi's default: a single-numa-node kubelet would
    otherwise refuse pods whose CPUs and GPU replicas it cannot put on one NUMA node."""
    devices = []
    for device in state.devices:
        health = HEALTHY if device.healthy else UNHEALTHY
        topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=device.numa)]) if numa else None
        for replica in state.replica_ids(device):
            devices.append(api_pb2.Device(ID=replica, health=health, topology=topology))
    return api_pb2.ListAndWatchResponse(devices=devices)


def container_response(allocation: ContainerAllocation) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in allocation.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in allocation.devices
        ],
    )


class DevicePluginService(api_grpc.DevicePluginBase):
    def __init__(
        self,
        state: DeviceState,
        allocator: Allocator,
        metrics: NodeMetrics,
        node: str = "",
        numa_topology: bool = False,
    ) -> None:
        self.state = state
        self.allocator = allocator
        self.metrics = metrics
        self.numa_topology = numa_topology
        self.log = _log.bind(role="node", node=node, backend=state.name)

    async def GetDevicePluginOptions(
        self, stream: Stream[api_pb2.Empty, api_pb2.DevicePluginOptions]
    ) -> None:
        await stream.recv_message()
        await stream.send_message(
            api_pb2.DevicePluginOptions(
                pre_start_required=False, get_preferred_allocation_available=True
            )
        )

    async def ListAndWatch(
        self, stream: Stream[api_pb2.Empty, api_pb2.ListAndWatchResponse]
    ) -> None:
        await stream.recv_message()
        seen = self.state.version
        await stream.send_message(list_response(self.state, self.numa_topology))
        while True:
            seen = await self.state.wait_changed(seen)
            self.log.info(
                "device_list_changed",
                healthy=sum(1 for d in self.state.devices if d.healthy),
                devices=len(self.state.devices),
            )
            await stream.send_message(list_response(self.state, self.numa_topology))

    async def GetPreferredAllocation(
        self,
        stream: Stream[api_pb2.PreferredAllocationRequest, api_pb2.PreferredAllocationResponse],
    ) -> None:
        request = await stream.recv_message()
        assert request is not None
        wanted = await self.allocator.preferred(self.state.backend)
        responses = [
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=preferred_replicas(
                    list(r.available_deviceIDs),
                    list(r.must_include_deviceIDs),
                    r.allocation_size,
                    wanted,
                    self.state.uuid_of,
                )
            )
            for r in request.container_requests
        ]
        await stream.send_message(
            api_pb2.PreferredAllocationResponse(container_responses=responses)
        )

    async def Allocate(
        self, stream: Stream[api_pb2.AllocateRequest, api_pb2.AllocateResponse]
    ) -> None:
        request = await stream.recv_message()
        assert request is not None
        counts = [len(r.devices_ids) for r in request.container_requests]
        name = self.state.name
        self.metrics.allocate_calls.labels(name).inc()
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            plan = await self.allocator.allocate(self.state.backend, counts, self.state.devices)
        except AllocateError as exc:
            self.metrics.allocate_errors.labels(name).inc()
            raise GRPCError(Status.FAILED_PRECONDITION, str(exc)) from None
        except Exception as exc:
            self.metrics.allocate_errors.labels(name).inc()
            self.log.exception("allocate_crashed")
            raise GRPCError(
                Status.INTERNAL, f"hami: allocate failed unexpectedly: {exc!r}"
            ) from None
        finally:
            self.metrics.allocate_seconds.labels(name).observe(loop.time() - began)
        await stream.send_message(
            api_pb2.AllocateResponse(
                container_responses=[container_response(c.allocation) for c in plan.containers]
            )
        )

    async def PreStartContainer(
        self, stream: Stream[api_pb2.PreStartContainerRequest, api_pb2.PreStartContainerResponse]
    ) -> None:
        await stream.recv_message()
        await stream.send_message(api_pb2.PreStartContainerResponse())


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


class PluginServer:
    """Serves one backend's device plugin and keeps it registered with kubelet."""

    def __init__(
        self,
        state: DeviceState,
        allocator: Allocator,
        metrics: NodeMetrics,
        plugin_dir: str | os.PathLike[str],
        *,
        poll: float = 1.0,
        register_timeout: float = 5.0,
        node: str = "",
        numa_topology: bool = False,
        capacity: str | None = None,
    ) -> None:
        """``capacity``: serve that capacity resource of the backend (hami.node.capacity)
        instead of its count resource."""
        self.state = state
        self.metrics = metrics
        self.plugin_dir = Path(plugin_dir)
        word = state.backend.type_word
        if capacity is not None:
            word = f"{word}-{resource_word(capacity)}"
        self.socket_path = self.plugin_dir / socket_name(word)
        if len(str(self.socket_path)) >= 108:
            raise ValueError(f"unix socket path too long (max 107 bytes): {self.socket_path}")
        self.kubelet_socket = self.plugin_dir / KUBELET_SOCKET
        self.poll = poll
        self.register_timeout = register_timeout
        self.service: api_grpc.DevicePluginBase
        if capacity is None:
            self.service = DevicePluginService(state, allocator, metrics, node, numa_topology)
        else:
            self.service = CapacityService(state, capacity, node)
        self.resource = capacity or state.backend.resources.count
        self.preferred = capacity is None  # GetPreferredAllocation steers to the decision
        self.log = _log.bind(role="node", node=node, backend=state.name, resource=self.resource)
        self.registered = asyncio.Event()  # set while registered with the current kubelet
        self.serving = asyncio.Event()  # set once the gRPC server listens
        self.registrations = 0
        self._server: Server | None = None
        self._own: tuple[int, int, int] | None = None

    async def _serve(self) -> None:
        await self._close()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = Server([self.service])
        await server.start(path=str(self.socket_path))
        self._server = server
        self._own = _identity(self.socket_path)
        self.log.info("device_plugin_serving", socket=str(self.socket_path))

    async def _close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await server.wait_closed()
            if _identity(self.socket_path) == self._own:
                with contextlib.suppress(FileNotFoundError):
                    self.socket_path.unlink()

    async def register(self) -> None:
        channel = Channel(path=str(self.kubelet_socket))
        try:
            stub = api_grpc.RegistrationStub(channel)
            await stub.Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket_path.name,
                    resource_name=self.resource,
                    options=api_pb2.DevicePluginOptions(
                        pre_start_required=False,
                        get_preferred_allocation_available=self.preferred,
                    ),
                ),
                timeout=self.register_timeout,
            )
        finally:
            channel.close()

    async def run(self) -> None:
        registered_with: tuple[int, int, int] | None = None
        failures = 0
        waiting_said = False
        try:
            await self._serve()
            self.serving.set()
            while True:
                if _identity(self.socket_path) != self._own:
                    self.log.info("device_plugin_socket_removed")
                    await self._serve()
                    registered_with = None
                kubelet = _identity(self.kubelet_socket)
                if kubelet is None:
                    if registered_with is not None:
                        self.log.info("kubelet_socket_gone")
                    elif not waiting_said:
                        # Said once: a wrong host path otherwise looks like a healthy agent.
                        self.log.info(
                            "waiting_for_kubelet",
                            socket=str(self.kubelet_socket),
                            hint="mount the host's /var/lib/kubelet/device-plugins at "
                            "node.device_plugin_dir",
                        )
                    waiting_said = True
                    registered_with = None
                    self.registered.clear()
                elif kubelet != registered_with:
                    self.registered.clear()
                    try:
                        await self.register()
                    except Exception as exc:
                        failures += 1
                        method = self.log.warning if failures == 1 else self.log.debug
                        method("kubelet_registration_failed", error=str(exc) or repr(exc))
                    else:
                        registered_with = kubelet
                        failures = 0
                        self.registrations += 1
                        self.metrics.kubelet_registrations.labels(self.resource).inc()
                        self.log.info("registered_with_kubelet", endpoint=self.socket_path.name)
                        self.registered.set()
                await asyncio.sleep(self.poll)
        finally:
            self.registered.clear()
            self.serving.clear()
            await self._close()
