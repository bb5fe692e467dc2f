"""The kubelet emulator against a device plugin written here with grpclib."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.kube.client import Kube, pod_path, pods_path
from hami.testkit import KubeletEmulator

RESOURCE = "example.com/widget"


class FakePlugin(api_grpc.DevicePluginBase):
    """Serves ListAndWatch/Allocate on <dir>/<name>.sock and registers with the kubelet;
    re-registers when kubelet.sock is recreated (as real plugins do)."""

    def __init__(
        self,
        plugin_dir: Path,
        devices: list[str],
        *,
        resource: str = RESOURCE,
        preferred: bool = False,
        fail_allocate: str | None = None,
    ) -> None:
        self.dir = plugin_dir
        self.endpoint = f"widget-{uuid.uuid4().hex[:6]}.sock"
        self.resource = resource
        self.health = dict.fromkeys(devices, "Healthy")
        self.preferred = preferred
        self.fail_allocate = fail_allocate
        self.allocate_calls: list[list[str]] = []
        self.ended = False
        self.preferred_calls: list[tuple[list[str], int]] = []
        self._updates: asyncio.Queue[None] = asyncio.Queue()
        self._server = Server([self])
        self._watcher: asyncio.Task[None] | None = None

    async def start(self, register: bool = True) -> None:
        await self._server.start(path=str(self.dir / self.endpoint))
        if register:
            await self.register()
        self._watcher = asyncio.create_task(self._watch_kubelet())

    async def stop(self) -> None:
        if self._watcher:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        self._server.close()
        await self._server.wait_closed()

    async def register(self) -> None:
        channel = Channel(path=str(self.dir / "kubelet.sock"))
        try:
            await api_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version="v1beta1",
                    endpoint=self.endpoint,
                    resource_name=self.resource,
                    options=api_pb2.DevicePluginOptions(
                        get_preferred_allocation_available=self.preferred
                    ),
                )
            )
        finally:
            channel.close()

    async def _watch_kubelet(self) -> None:
        sock = self.dir / "kubelet.sock"

        def identity() -> tuple[int, int] | None:
            try:
                st = sock.stat()
            except FileNotFoundError:
                return None
            return (st.st_ino, st.st_ctime_ns)

        seen = identity()
        while True:
            await asyncio.sleep(0.05)
            now = identity()
            if now is not None and now != seen:
                await self.register()
            seen = now

    def set_health(self, device: str, health: str) -> None:
        self.health[device] = health
        self._updates.put_nowait(None)

    async def GetDevicePluginOptions(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        await stream.send_message(
            api_pb2.DevicePluginOptions(get_preferred_allocation_available=self.preferred)
        )

    def end_streams(self) -> None:
        """End ListAndWatch (the server and its socket stay)."""
        self.ended = True
        self._updates.put_nowait(None)

    async def ListAndWatch(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        while not self.ended:
            await stream.send_message(
                api_pb2.ListAndWatchResponse(
                    devices=[api_pb2.Device(ID=d, health=h) for d, h in self.health.items()]
                )
            )
            await self._updates.get()

    async def GetPreferredAllocation(self, stream: Stream[Any, Any]) -> None:
        req = await stream.recv_message()
        assert req is not None
        answers = []
        for creq in req.container_requests:
            available = list(creq.available_deviceIDs)
            self.preferred_calls.append((available, creq.allocation_size))
            answers.append(
                api_pb2.ContainerPreferredAllocationResponse(
                    deviceIDs=available[::-1][: creq.allocation_size]
                )
            )
        await stream.send_message(api_pb2.PreferredAllocationResponse(container_responses=answers))

    async def Allocate(self, stream: Stream[Any, Any]) -> None:
        req = await stream.recv_message()
        assert req is not None
        if self.fail_allocate:
            raise GRPCError(Status.FAILED_PRECONDITION, self.fail_allocate)
        responses = []
        for creq in req.container_requests:
            ids = list(creq.devices_ids)
            self.allocate_calls.append(ids)
            responses.append(
                api_pb2.ContainerAllocateResponse(
                    envs={"WIDGETS": ",".join(ids)},
                    annotations={"call": str(len(self.allocate_calls))},
                )
            )
        await stream.send_message(api_pb2.AllocateResponse(container_responses=responses))

    async def PreStartContainer(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        await stream.send_message(api_pb2.PreStartContainerResponse())


@contextlib.asynccontextmanager
async def running(plugin: FakePlugin) -> Any:
    await plugin.start()
    try:
        yield plugin
    finally:
        await plugin.stop()


def _node_name() -> str:
    return f"k-{uuid.uuid4().hex[:8]}"


def _container(name: str, widgets: int | None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox"}
    if widgets is not None:
        c["resources"] = {"limits": {RESOURCE: str(widgets)}}
    return c


def _pod(name: str, node: str, containers: list[Any], init: list[Any] | None = None) -> Any:
    spec: dict[str, Any] = {"nodeName": node, "containers": containers}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name}, "spec": spec}


async def _allocatable(kube: Kube, node: str) -> tuple[str | None, str | None]:
    got = await kube.get_node(node)
    return got["status"]["capacity"].get(RESOURCE), got["status"]["allocatable"].get(RESOURCE)


async def test_node_is_registered_ready_with_labels(kube: Kube, kubelet_factory: Any) -> None:
    node = _node_name()
    await kubelet_factory(node, labels={"gpu": "on"}, heartbeat_interval=0.2)
    got = await kube.get_node(node)
    assert got["metadata"]["labels"]["kubernetes.io/hostname"] == node
    assert got["metadata"]["labels"]["gpu"] == "on"
    ready = [c for c in got["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    first = ready[0]["lastHeartbeatTime"]
    async with asyncio.timeout(10):
        while True:
            await asyncio.sleep(0.3)
            got = await kube.get_node(node)
            beat = next(c for c in got["status"]["conditions"] if c["type"] == "Ready")
            if beat["lastHeartbeatTime"] > first:
                break


async def test_plugin_devices_show_in_allocatable_and_follow_health(
    kube: Kube, kubelet_factory: Any
) -> None:
    node = _node_name()
    kubelet: KubeletEmulator = await kubelet_factory(node)
    async with running(FakePlugin(kubelet.plugin_dir, ["w0", "w1", "w2", "w3"])) as plugin:
        await kubelet.wait_for_resource(RESOURCE, healthy=4)
        assert await _allocatable(kube, node) == ("4", "4")
        plugin.set_health("w2", "Unhealthy")
        await kubelet.wait_for_resource(RESOURCE, healthy=3)
        assert await _allocatable(kube, node) == ("4", "3")
    assert kubelet.registrations[0].endpoint == plugin.endpoint


async def test_bound_pod_gets_allocate_in_container_order_and_runs(
    kube: Kube, namespace: str, kubelet_factory: Any
) -> None:
    node = _node_name()
    kubelet: KubeletEmulator = await kubelet_factory(node)
    async with running(FakePlugin(kubelet.plugin_dir, ["w0", "w1", "w2", "w3"])) as plugin:
        await kubelet.wait_for_resource(RESOURCE, healthy=4)
        pod = _pod(
            "p",
            node,
            [_container("a", 2), _container("plain", None), _container("b", 1)],
            init=[_container("setup", 1)],
        )
        await kube.create(pods_path(namespace), pod)
        adm = await kubelet.wait_for_admission(namespace, "p")
        assert adm.phase == "Running", adm.message
        assert [(c.container, c.init) for c in adm.containers] == [
            ("setup", True),
            ("a", False),
            ("b", False),
        ]
        # first free healthy devices; the init container's device is reused by "a"
        assert [c.device_ids for c in adm.containers] == [["w0"], ["w0", "w1"], ["w2"]]
        assert plugin.allocate_calls == [["w0"], ["w0", "w1"], ["w2"]]
        assert adm.envs == {"setup": {"WIDGETS": "w0"}, "a": {"WIDGETS": "w0,w1"},
                            "b": {"WIDGETS": "w2"}}  # fmt: skip
        assert adm.for_container("b")[0].response.annotations["call"] == "3"
        got = await kube.get_pod(namespace, "p")
        assert got["status"]["phase"] == "Running"
        assert [s["name"] for s in got["status"]["containerStatuses"]] == ["a", "plain", "b"]

        # a second pod gets what is left; deleting the first frees its devices
        await kube.create(pods_path(namespace), _pod("q", node, [_container("c", 1)]))
        assert (await kubelet.wait_for_admission(namespace, "q")).containers[0].device_ids == ["w3"]
        await kube.delete(pod_path(namespace, "p"))
        await kubelet.wait_for(lambda: kubelet.admissions[(namespace, "p")].deleted)
        await kube.create(pods_path(namespace), _pod("r", node, [_container("d", 3)]))
        adm = await kubelet.wait_for_admission(namespace, "r")
        assert adm.phase == "Running", adm.message
        assert adm.containers[0].device_ids == ["w0", "w1", "w2"]


async def test_preferred_allocation_is_asked_when_offered(
    kube: Kube, namespace: str, kubelet_factory: Any
) -> None:
    node = _node_name()
    kubelet: KubeletEmulator = await kubelet_factory(node)
    devices = ["w0", "w1", "w2"]
    async with running(FakePlugin(kubelet.plugin_dir, devices, preferred=True)) as plugin:
        await kubelet.wait_for_resource(RESOURCE, healthy=3)
        await kube.create(pods_path(namespace), _pod("p", node, [_container("a", 2)]))
        adm = await kubelet.wait_for_admission(namespace, "p")
        assert plugin.preferred_calls == [(devices, 2)]
        assert adm.containers[0].device_ids == ["w2", "w1"]


async def test_failed_allocate_fails_the_pod_like_kubelet(
    kube: Kube, namespace: str, kubelet_factory: Any
) -> None:
    node = _node_name()
    kubelet: KubeletEmulator = await kubelet_factory(node)
    async with running(FakePlugin(kubelet.plugin_dir, ["w0"], fail_allocate="no luck")):
        await kubelet.wait_for_resource(RESOURCE, healthy=1)
        await kube.create(pods_path(namespace), _pod("p", node, [_container("a", 1)]))
        await kube.create(pods_path(namespace), _pod("big", node, [_container("a", 2)]))
        for name, text in (("p", "no luck"), ("big", "Requested: 2, Available: 1")):
            adm = await kubelet.wait_for_admission(namespace, name)
            assert adm.phase == "Failed"
            got = await kube.get_pod(namespace, name)
            assert got["status"]["phase"] == "Failed"
            assert got["status"]["reason"] == "UnexpectedAdmissionError"
            assert text in got["status"]["message"]


async def test_restart_makes_the_plugin_register_again(
    kube: Kube, namespace: str, kubelet_factory: Any
) -> None:
    node = _node_name()
    kubelet: KubeletEmulator = await kubelet_factory(node)
    async with running(FakePlugin(kubelet.plugin_dir, ["w0", "w1"])):
        await kubelet.wait_for_resource(RESOURCE, healthy=2)
        await kubelet.restart()
        assert kubelet.plugins[RESOURCE].connected is False
        await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, timeout=10)
        await kubelet.wait_for_resource(RESOURCE, healthy=2)
        assert await _allocatable(kube, node) == ("2", "2")
        await kube.create(pods_path(namespace), _pod("p", node, [_container("a", 2)]))
        adm = await kubelet.wait_for_admission(namespace, "p")
        assert adm.phase == "Running", adm.message


async def test_plugin_gone_drops_allocatable_at_once_and_register_restores_it(
    kube: Kube, namespace: str, kubelet_factory: Any
) -> None:
    # kubelet marks every device of a plugin whose connection ends unhealthy: allocatable 0,
    # capacity kept (until a grace period, longer than any test); a new registration
    # restores it. Here the plugin's server closes, its socket goes away, and nothing
    # re-registers until the second plugin starts.
    node = _node_name()
    kubelet: KubeletEmulator = await kubelet_factory(node)
    first = FakePlugin(kubelet.plugin_dir, ["w0", "w1"])
    async with running(first):
        await kubelet.wait_for_resource(RESOURCE, healthy=2)
    (kubelet.plugin_dir / first.endpoint).unlink(missing_ok=True)  # as a dying process's
    await kubelet.wait_for(lambda: not kubelet.plugins[RESOURCE].connected, timeout=5)
    assert await _allocatable(kube, node) == ("2", "0")  # patched before the state changed
    state = kubelet.plugins[RESOURCE]
    assert not state.connected and state.healthy == [], state
    await kube.create(pods_path(namespace), _pod("p", node, [_container("a", 1)]))
    adm = await kubelet.wait_for_admission(namespace, "p")
    assert adm.phase == "Failed" and "not connected" in (adm.message or ""), adm

    async with running(FakePlugin(kubelet.plugin_dir, ["w0", "w1"])):
        await kubelet.wait_for_resource(RESOURCE, healthy=2)
        assert await _allocatable(kube, node) == ("2", "2")


async def test_ended_list_and_watch_drops_allocatable_until_the_plugin_registers_again(
    kube: Kube, kubelet_factory: Any
) -> None:
    node = _node_name()
    kubelet: KubeletEmulator = await kubelet_factory(node)
    async with running(FakePlugin(kubelet.plugin_dir, ["w0", "w1"])) as plugin:
        await kubelet.wait_for_resource(RESOURCE, healthy=2)
        plugin.end_streams()
        await kubelet.wait_for(lambda: not kubelet.plugins[RESOURCE].connected, timeout=5)
        assert await _allocatable(kube, node) == ("2", "0")
        assert kubelet.plugins[RESOURCE].error == "ListAndWatch stream ended"
        plugin.ended = False
        await plugin.register()
        await kubelet.wait_for_resource(RESOURCE, healthy=2)
        assert await _allocatable(kube, node) == ("2", "2")


async def test_removed_plugin_socket_counts_as_gone_while_the_stream_lingers(
    kube: Kube, kubelet_factory: Any
) -> None:
    # A plugin stopped inside this process may leave its ListAndWatch connection open (its
    # handler is cancelled, the connection is not closed); the socket file going away is
    # what the emulator goes by then, as kubelet sees a dead process's connection end.
    node = _node_name()
    kubelet: KubeletEmulator = await kubelet_factory(node)
    async with running(FakePlugin(kubelet.plugin_dir, ["w0", "w1", "w2"])) as plugin:
        await kubelet.wait_for_resource(RESOURCE, healthy=3)
        (kubelet.plugin_dir / plugin.endpoint).unlink()
        await kubelet.wait_for(lambda: not kubelet.plugins[RESOURCE].connected, timeout=5)
        assert await _allocatable(kube, node) == ("3", "0")
        assert "socket" in (kubelet.plugins[RESOURCE].error or "")
        # registering again names a socket that is not there: the connection fails
        await plugin.register()
        await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, timeout=5)
        await kubelet.wait_for(lambda: kubelet.plugins[RESOURCE].error is not None, timeout=5)
        assert not kubelet.plugins[RESOURCE].connected
        assert await _allocatable(kube, node) == ("3", "0")


async def test_a_plugin_restarted_faster_than_the_socket_watch_is_not_ready_until_it_registers(
    kube: Kube, kubelet_factory: Any
) -> None:
    # The old connection's state must not answer for the new plugin: a caller waiting for
    # the resource right after a restart would go on before kubelet has the new devices, and
    # kubelet would then report 0 allocatable until the new stream's first answer.
    node = _node_name()
    kubelet: KubeletEmulator = await kubelet_factory(node, plugin_poll=60.0)  # no socket watch
    first = FakePlugin(kubelet.plugin_dir, ["w0", "w1"])
    async with running(first):
        await kubelet.wait_for_resource(RESOURCE, healthy=2)
    (kubelet.plugin_dir / first.endpoint).unlink(missing_ok=True)
    second = FakePlugin(kubelet.plugin_dir, ["w0", "w1", "w2"])
    second.endpoint = first.endpoint  # same path, a new socket file
    await second.start(register=False)
    try:
        with pytest.raises(TimeoutError):
            await kubelet.wait_for_resource(RESOURCE, timeout=0.3)
        await second.register()
        assert (await kubelet.wait_for_resource(RESOURCE)).healthy == ["w0", "w1", "w2"]
        assert await _allocatable(kube, node) == ("3", "3")
    finally:
        await second.stop()
