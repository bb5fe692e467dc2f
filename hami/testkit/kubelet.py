"""A kubelet emulator: the parts of kubelet a device plugin and a scheduler can see.

For one node name it

- creates (or takes over) the Node object and keeps its status: capacity/allocatable for
  cpu, memory, pods and every extended resource learned from device plugins, a Ready
  condition with a heartbeat every `heartbeat_interval` seconds;
- serves the kubelet `Registration` service (device plugin API v1beta1) on
  `<plugin_dir>/kubelet.sock`; for each registration it connects to
  `<plugin_dir>/<endpoint>`, follows `ListAndWatch` and reports the devices in the Node
  status (capacity: all devices, allocatable: the healthy ones);
- notices a plugin going away, as kubelet does: when its `ListAndWatch` stream ends or its
  socket file is removed (or replaced), every device of that resource is marked unhealthy
  at once and the Node status is patched (allocatable 0, capacity kept; kubelet drops the
  capacity only after a grace period of minutes, longer than any test); the next
  registration of that resource restores it. (A real plugin process that dies closes its
  connection, which ends the stream; a plugin stopped inside the test process may leave
  the connection open, so the socket file is watched too, every `plugin_poll` seconds);
- watches the pods bound to its node and admits each new one: for every container that
  requests a registered resource (init containers first, in spec order, then containers)
  it picks device ids (through `GetPreferredAllocation` when the plugin offers it, else the
  first free healthy ones; devices of init containers may be reused by later containers,
  as kubelet does), calls `Allocate` (and `PreStartContainer` when the plugin asks for it),
  records the answers in `admissions`, and sets the pod `Running`; when anything fails the
  pod becomes `Failed` with reason `UnexpectedAdmissionError`, like kubelet;
- finishes the deletion of its pods (kubelet's final delete with grace period 0) and
  releases their devices;
- with ``dra_registry_dir`` set, speaks DRA as kubelet 1.36 does (hami.testkit.kubelet_dra):
  discovers DRA drivers in that directory, calls ``NodePrepareResources`` for a bound pod's
  allocated claims before it runs the pod (recording in ``PodAdmission.cdi_env`` the
  environment the CDI specs under ``cdi_dirs`` give each container), leaves the pod Pending
  with a ``FailedPrepareDynamicResources`` Event and tries again when that fails, and calls
  ``NodeUnprepareResources`` when the pod goes.

Extended resources with no registered plugin are ignored, as kubelet ignores resources
the node does not have (they may belong to a scheduler extender). Pods already past
Pending when the emulator starts are left alone (their devices are not known to it).

    async with KubeletEmulator("node-a", kubeconfig, plugin_dir) as kubelet:
        await kubelet.wait_for_resource("hami.io/vgpu", 4)
        admission = await kubelet.wait_for_admission("default", "pod-1")
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.kube.client import Kube, node_path, open_client, pod_path
from hami.kube.objects import metadata_of
from hami.kube.raw import JSON, Conflict, KubeError, NotFound
from hami.kube.reflector import Reflector
from hami.protocol.nodelock import rfc3339
from hami.testkit.kubelet_dra import FAILED_PREPARE, DRAClient, PrepareError

log = logging.getLogger("hami.testkit.kubelet")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
CONDITION_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _now() -> str:
    return rfc3339(dt.datetime.now(dt.UTC))


def _identity(path: Path) -> tuple[int, int] | None:
    """A socket file's inode and change time: a new file at the same path differs."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def _is_extended(resource: str) -> bool:
    return "/" in resource and not resource.startswith(("kubernetes.io/", "requests."))


@dataclass
class PluginState:
    """A registered device plugin, as the emulator sees it."""

    resource: str
    endpoint: str
    options: api_pb2.DevicePluginOptions
    #: device id -> health ("Healthy"/"Unhealthy"), in the order ListAndWatch sent them
    devices: dict[str, str] = field(default_factory=dict)
    connected: bool = False
    #: how many ListAndWatch answers arrived on the current connection
    updates: int = 0
    error: str | None = None
    #: identity of the endpoint socket file when the plugin registered (None: it was absent)
    socket: tuple[int, int] | None = None

    @property
    def healthy(self) -> list[str]:
        return [d for d, h in self.devices.items() if h == "Healthy"]


@dataclass
class ContainerAllocation:
    """One Allocate call made for one container and one resource."""

    container: str
    init: bool
    resource: str
    device_ids: list[str]
    response: api_pb2.ContainerAllocateResponse


@dataclass
class PodAdmission:
    """What the emulator did with a pod bound to its node."""

    namespace: str
    name: str
    uid: str
    containers: list[ContainerAllocation] = field(default_factory=list)
    #: "Running" or "Failed"
    phase: str = "Pending"
    reason: str | None = None
    message: str | None = None
    #: the pod object is gone from the API server (its devices are free again)
    deleted: bool = False
    #: container name -> the environment its DRA claims' CDI devices give (DRA only)
    cdi_env: dict[str, dict[str, str]] = field(default_factory=dict)
    #: NodePrepareResources tries that failed (the pod stays Pending meanwhile)
    prepare_failures: int = 0

    def for_container(self, name: str) -> list[ContainerAllocation]:
        return [c for c in self.containers if c.container == name]

    @property
    def envs(self) -> dict[str, dict[str, str]]:
        """Container name -> the environment from all its Allocate answers."""
        out: dict[str, dict[str, str]] = {}
        for c in self.containers:
            out.setdefault(c.container, {}).update(dict(c.response.envs))
        for name, env in self.cdi_env.items():
            out.setdefault(name, {}).update(env)
        return out


class _AdmissionError(Exception):
    pass


class _Registration(api_grpc.RegistrationBase):
    def __init__(self, kubelet: KubeletEmulator) -> None:
        self._kubelet = kubelet

    async def Register(self, stream: Stream[api_pb2.RegisterRequest, api_pb2.Empty]) -> None:
        request = await stream.recv_message()
        assert request is not None
        error = self._kubelet._register(request)
        await self._kubelet._notify()
        if error:
            raise GRPCError(Status.INVALID_ARGUMENT, error)
        await stream.send_message(api_pb2.Empty())


class KubeletEmulator:
    """See the module docstring. Use `async with`, or `start()` and `stop()`."""

    def __init__(
        self,
        node_name: str,
        kubeconfig: str | Path,
        plugin_dir: str | Path,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        base_capacity: Mapping[str, str] | None = None,
        heartbeat_interval: float = 10.0,
        rpc_timeout: float | None = None,
        status_retry: tuple[float, float] = (0.2, 5.0),
        plugin_poll: float = 0.1,
        dra_registry_dir: str | Path | None = None,
        cdi_dirs: Sequence[str | Path] = (),
        prepare_retry: tuple[float, float] = (0.5, 5.0),
    ) -> None:
        self.node_name = node_name
        self.kubeconfig = Path(kubeconfig)
        self.plugin_dir = Path(plugin_dir)
        self.socket_path = self.plugin_dir / KUBELET_SOCKET
        if len(str(self.socket_path)) >= 108:
            raise ValueError(f"unix socket path too long (max 107 bytes): {self.socket_path}")
        self.labels = {"kubernetes.io/hostname": node_name, **(labels or {})}
        self.annotations = dict(annotations or {})
        self.base_capacity = dict(base_capacity or {"cpu": "32", "memory": "128Gi", "pods": "110"})
        self.heartbeat_interval = heartbeat_interval
        # kubelet calls device plugins without a deadline (a plugin may wait out an API
        # server outage before answering Allocate); None does the same
        self.rpc_timeout = rpc_timeout
        #: first and largest pause between tries of a failed pod status write
        self.status_retry = status_retry
        #: how often the registered plugins' socket files are looked at
        self.plugin_poll = plugin_poll
        #: pods ("namespace/name") this kubelet never calls Allocate for and leaves Pending:
        #: an Allocate lost in an outage, for fault tests
        self.lose: set[str] = set()
        #: resource name -> plugin
        self.plugins: dict[str, PluginState] = {}
        #: (namespace, name) -> the latest admission of that pod
        self.admissions: dict[tuple[str, str], PodAdmission] = {}
        #: every Register request received, in order
        self.registrations: list[api_pb2.RegisterRequest] = []
        self._kube: Kube | None = None
        self._kube_cm: contextlib.AbstractAsyncContextManager[Kube] | None = None
        self._server: Server | None = None
        self._channels: dict[str, Channel] = {}
        self._plugin_tasks: dict[str, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._by_uid: dict[str, PodAdmission] = {}
        self._used: dict[str, dict[str, str]] = {}  # resource -> device id -> pod uid
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._changed = asyncio.Condition()
        self._status_lock = asyncio.Lock()
        self._deleting: set[str] = set()
        self._ready_since: str | None = None
        #: the DRA side (None: this kubelet knows device plugins only)
        self.dra: DRAClient | None = (
            DRAClient(node_name, Path(dra_registry_dir), [Path(d) for d in cdi_dirs])
            if dra_registry_dir is not None
            else None
        )
        #: first and largest pause before NodePrepareResources is tried again
        self.prepare_retry = prepare_retry
        self._retries: set[asyncio.Task[None]] = set()  # pod workers and their retries

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> KubeletEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._kube_cm = open_client(self.kubeconfig)
        self._kube = await self._kube_cm.__aenter__()
        self._ready_since = _now()
        try:
            await self._ensure_node()
            await self._serve()
        except BaseException:
            await self.stop()
            raise
        if self.dra is not None:
            self.dra.registry_dir.mkdir(parents=True, exist_ok=True)
            await self.dra.scan()
        self._tasks = [
            asyncio.create_task(self._heartbeat(), name=f"kubelet[{self.node_name}].heartbeat"),
            asyncio.create_task(self._pods().run(), name=f"kubelet[{self.node_name}].pods"),
            asyncio.create_task(self._admit_loop(), name=f"kubelet[{self.node_name}].admit"),
            asyncio.create_task(
                self._watch_sockets(), name=f"kubelet[{self.node_name}].plugin-sockets"
            ),
        ]
        if self.dra is not None:
            self._tasks.append(
                asyncio.create_task(self._watch_dra(), name=f"kubelet[{self.node_name}].dra")
            )

    async def stop(self) -> None:
        """Stop serving and watching; the Node object stays."""
        tasks = self._tasks + list(self._plugin_tasks.values()) + list(self._retries)
        self._tasks = []
        self._retries.clear()
        self._plugin_tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._close_server()
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        if self._kube_cm is not None:
            cm, self._kube_cm = self._kube_cm, None
            await cm.__aexit__(None, None, None)

    async def restart(self) -> None:
        """Like a kubelet restart: drop the plugin connections, remove kubelet.sock and
        serve a new one. Plugins must register again (they watch for the new socket);
        until then their resources show 0 allocatable. Pods and admissions are kept."""
        await self._close_server()
        tasks = list(self._plugin_tasks.values())
        self._plugin_tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        for plugin in self.plugins.values():
            plugin.connected = False
        await self._patch_node_status()
        await self._serve()
        await self._notify()

    async def _serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._server = Server([_Registration(self)])
        await self._server.start(path=str(self.socket_path))

    async def _close_server(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    @property
    def kube(self) -> Kube:
        """The emulator's API client (while started)."""
        if self._kube is None:
            raise RuntimeError(f"kubelet emulator {self.node_name} is not started")
        return self._kube

    # ------------------------------------------------------------------ waiting helpers

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(
        self,
        predicate: Callable[[], bool],
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> None:
        """Wait until predicate() holds; it is re-checked whenever the emulator's state
        changes (registration, device update, admission)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_for_resource(
        self,
        resource: str,
        healthy: int | None = None,
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> PluginState:
        """Wait until `resource`'s plugin is connected and has sent its devices (and, if
        given, reports exactly `healthy` healthy devices); the Node status is patched by
        then. A connection whose socket file was replaced does not count, even before the
        socket watch has noticed: it belongs to a plugin that has been restarted."""

        def ready() -> bool:
            p = self.plugins.get(resource)
            return (
                p is not None
                and p.connected
                and p.updates > 0
                and (healthy is None or len(p.healthy) == healthy)
                and _identity(self.plugin_dir / p.endpoint) == p.socket
            )

        try:
            await self.wait_for(ready, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{self.node_name}: resource {resource} not ready after {timeout}s: "
                f"{self.plugins.get(resource)}"
            ) from None
        return self.plugins[resource]

    async def wait_for_admission(
        self,
        namespace: str,
        name: str,
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> PodAdmission:
        """Wait until the pod was admitted (Running) or rejected (Failed); its status has
        been patched by then."""

        def done() -> bool:
            a = self.admissions.get((namespace, name))
            return a is not None and a.phase != "Pending"

        try:
            await self.wait_for(done, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{self.node_name}: pod {namespace}/{name} not admitted after {timeout}s"
            ) from None
        return self.admissions[(namespace, name)]

    # ------------------------------------------------------------------ node

    def _node_status(self) -> dict[str, Any]:
        capacity = dict(self.base_capacity)
        allocatable = dict(self.base_capacity)
        for resource, plugin in self.plugins.items():
            capacity[resource] = str(len(plugin.devices))
            allocatable[resource] = str(len(plugin.healthy) if plugin.connected else 0)
        now = _now()
        return {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet emulator is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": self._ready_since or now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node_name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.36.2-hami-emulator",
                "containerRuntimeVersion": "emulated://0",
                "kernelVersion": "",
                "osImage": "hami kubelet emulator",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
                "kubeProxyVersion": "",
            },
        }

    async def _ensure_node(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": self.labels,
                "annotations": self.annotations,
            },
        }
        try:
            await self.kube.create("/api/v1/nodes", body)
        except Conflict:
            patch = {"metadata": {"labels": self.labels, "annotations": self.annotations}}
            await self.kube.merge_patch(node_path(self.node_name), patch)
        await self._patch_node_status()
        await self._untaint()

    async def _untaint(self) -> None:
        """Remove the not-ready/unreachable taints (the API server's TaintNodesByCondition
        admission puts `node.kubernetes.io/not-ready` on every new Node; without
        kube-controller-manager nobody else takes it off once the node is Ready)."""
        for _ in range(5):
            node = await self.kube.get_node(self.node_name)
            taints = node.get("spec", {}).get("taints") or []
            keep = [t for t in taints if t.get("key") not in CONDITION_TAINTS]
            if keep == taints:
                return
            patch = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": keep or None},
            }
            with contextlib.suppress(Conflict):
                await self.kube.merge_patch(node_path(self.node_name), patch)
                return
        raise RuntimeError(f"{self.node_name}: could not remove the not-ready taint")

    async def _patch_node_status(self) -> None:
        async with self._status_lock:
            await self.kube.merge_patch(
                node_path(self.node_name) + "/status", {"status": self._node_status()}
            )

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self._patch_node_status()
            except Exception:
                log.exception("%s: node status heartbeat failed", self.node_name)

    # ------------------------------------------------------------------ device plugins

    def _register(self, request: api_pb2.RegisterRequest) -> str | None:
        """Handle Register; returns an error message, or None when accepted."""
        self.registrations.append(request)
        if request.version != API_VERSION:
            return f"unsupported API version {request.version!r}, want {API_VERSION!r}"
        if not _is_extended(request.resource_name):
            return f"invalid extended resource name {request.resource_name!r}"
        if "/" in request.endpoint or not request.endpoint:
            return f"invalid endpoint {request.endpoint!r}: a file name in {self.plugin_dir}"
        resource = request.resource_name
        old = self._plugin_tasks.pop(resource, None)
        if old is not None:
            old.cancel()
        if (channel := self._channels.pop(resource, None)) is not None:
            channel.close()
        previous = self.plugins.get(resource)
        plugin = PluginState(
            resource=resource,
            endpoint=request.endpoint,
            options=request.options,
            devices=dict(previous.devices) if previous else {},
        )
        plugin.socket = _identity(self.plugin_dir / request.endpoint)
        self.plugins[resource] = plugin
        self._plugin_tasks[resource] = asyncio.create_task(
            self._follow_plugin(plugin), name=f"kubelet[{self.node_name}].plugin[{resource}]"
        )
        log.info("%s: registered %s at %s", self.node_name, resource, request.endpoint)
        return None

    def _stub(self, plugin: PluginState) -> api_grpc.DevicePluginStub:
        channel = self._channels.get(plugin.resource)
        if channel is None:
            channel = Channel(path=str(self.plugin_dir / plugin.endpoint))
            self._channels[plugin.resource] = channel
        return api_grpc.DevicePluginStub(channel)

    async def _follow_plugin(self, plugin: PluginState) -> None:
        stub = self._stub(plugin)
        try:
            async with stub.ListAndWatch.open() as stream:
                await stream.send_message(api_pb2.Empty(), end=True)
                plugin.connected = True
                while (resp := await stream.recv_message()) is not None:
                    plugin.devices = {d.ID: d.health for d in resp.devices}
                    plugin.updates += 1
                    await self._patch_node_status_or_log(plugin.resource)
                    await self._notify()
            error = "ListAndWatch stream ended"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = f"ListAndWatch failed: {exc!r}"
        if self._plugin_tasks.get(plugin.resource) is not asyncio.current_task():
            return  # taken down by the socket watcher, which said why
        plugin.error = error
        log.warning("%s: %s: %s", self.node_name, plugin.resource, error)
        await self._plugin_gone(plugin)

    async def _patch_node_status_or_log(self, resource: str) -> None:
        """A failed write is not the plugin's fault: the heartbeat writes the same status
        within heartbeat_interval (and the plugin stays connected, as with kubelet)."""
        try:
            await self._patch_node_status()
        except Exception:
            log.exception("%s: node status after a change of %s", self.node_name, resource)

    async def _plugin_gone(self, plugin: PluginState) -> None:
        """kubelet's answer to a plugin going away: all its devices unhealthy (allocatable
        0, capacity kept) and the Node status patched at once; the plugin must register
        again to get them back."""
        plugin.devices = dict.fromkeys(plugin.devices, "Unhealthy")
        await self._patch_node_status_or_log(plugin.resource)
        plugin.connected = False  # only now: waiters on it look at the Node next
        await self._notify()

    async def _watch_sockets(self) -> None:
        """End the connection of every plugin whose socket file is gone or replaced."""
        while True:
            await asyncio.sleep(self.plugin_poll)
            for resource, task in list(self._plugin_tasks.items()):
                plugin = self.plugins[resource]
                if task.done() or _identity(self.plugin_dir / plugin.endpoint) == plugin.socket:
                    continue
                # no await before the task and channel are taken down: a registration
                # arriving in between would have its new ones taken down instead
                del self._plugin_tasks[resource]
                task.cancel()
                if (channel := self._channels.pop(resource, None)) is not None:
                    channel.close()
                plugin.error = f"socket {plugin.endpoint} was removed or replaced"
                log.warning("%s: %s: %s", self.node_name, resource, plugin.error)
                await self._plugin_gone(plugin)

    # ------------------------------------------------------------------ DRA

    async def _watch_dra(self) -> None:
        """kubelet's plugin watcher, by polling the registration directory."""
        assert self.dra is not None
        while True:
            await asyncio.sleep(self.plugin_poll)
            try:
                if await self.dra.scan():
                    await self._notify()
            except Exception:
                log.exception("%s: DRA plugin scan failed", self.node_name)

    async def wait_for_dra_driver(
        self,
        driver: str,
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> None:
        """Wait until the DRA driver `driver` has registered."""
        assert self.dra is not None, "this kubelet emulator was started without DRA"
        dra = self.dra
        try:
            await self.wait_for(lambda: driver in dra.plugins, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{self.node_name}: DRA driver {driver} not registered after {timeout}s "
                f"(registered: {sorted(dra.plugins)}; registry {dra.registry_dir})"
            ) from None

    @staticmethod
    def _uses_dra(pod: Mapping[str, Any]) -> bool:
        return bool(
            (pod.get("spec") or {}).get("resourceClaims")
            or ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get(
                "resourceClaimName"
            )
        )

    async def _prepare_failed(self, adm: PodAdmission, pod: dict[str, Any], error: str) -> None:
        """As kubelet: a Warning Event, the pod left Pending, another try after a pause."""
        adm.prepare_failures += 1
        adm.reason = FAILED_PREPARE
        adm.message = f"Failed to prepare dynamic resources: {error}"
        log.warning("%s: %s/%s: %s", self.node_name, adm.namespace, adm.name, adm.message)
        with contextlib.suppress(Exception):
            await self._event(pod, FAILED_PREPARE, adm.message)
        await self._notify()
        first, largest = self.prepare_retry
        delay = min(first * 2 ** (adm.prepare_failures - 1), largest)
        task = asyncio.create_task(self._retry_admit(adm, delay))
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    def _start_worker(self, adm: PodAdmission, pod: dict[str, Any]) -> None:
        task = asyncio.create_task(
            self._pod_worker(adm, pod), name=f"kubelet[{self.node_name}].pod[{adm.name}]"
        )
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    def _gone(self, adm: PodAdmission) -> bool:
        return adm.deleted or adm.uid in self._deleting or self._by_uid.get(adm.uid) is not adm

    async def _pod_worker(self, adm: PodAdmission, pod: dict[str, Any]) -> None:
        """kubelet's SyncPod for an admitted pod with claims: prepare them (each pod in its
        own worker, as kubelet's pod workers run in parallel), then run the containers."""
        assert self.dra is not None
        try:
            envs = await self.dra.prepare(self.kube, pod)
        except PrepareError as exc:
            if not self._gone(adm):
                await self._prepare_failed(adm, pod, str(exc))
            return
        if self._gone(adm):  # deleted while preparing: its release already ran
            await self._release_dra(adm.uid)
            return
        adm.cdi_env = {
            name: dict(e.split("=", 1) for e in entries if "=" in e)
            for name, entries in envs.items()
        }
        try:
            await self._write_status(adm, self._running_status(pod.get("spec", {})))
        finally:
            adm.phase, adm.reason, adm.message = "Running", None, None
            await self._notify()

    async def _retry_admit(self, adm: PodAdmission, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._gone(adm):
            return
        try:
            pod = await self.kube.get_pod(adm.namespace, adm.name)
        except NotFound:
            return
        except Exception as exc:
            log.warning("%s: pod %s/%s not read: %r", self.node_name, adm.namespace, adm.name, exc)
            pod = None
        if pod is None or pod["metadata"].get("uid") != adm.uid:
            if pod is None:  # try again later
                await self._prepare_failed(adm, {"metadata": {}}, "pod not readable")
            return
        self._start_worker(adm, pod)  # from the current object

    async def _event(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        meta = pod.get("metadata") or {}
        if not meta.get("uid"):
            return
        now = _now()
        await self.kube.create(
            f"/api/v1/namespaces/{meta['namespace']}/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
                "reason": reason,
                "message": message,
                "type": "Warning",
                "source": {"component": "kubelet", "host": self.node_name},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )

    async def _release_dra(self, uid: str) -> None:
        if self.dra is None:
            return
        try:
            await self.dra.release(uid)
        except Exception:
            log.exception("%s: unprepare for pod %s failed", self.node_name, uid)

    # ------------------------------------------------------------------ pods

    def _pods(self) -> Reflector:
        """The pods bound to this node, listed and watched (re-listed after a failure)."""
        return Reflector(
            self.kube,
            "/api/v1/pods",
            self._on_pod,
            name=f"kubelet[{self.node_name}].pods",
            field_selector=f"spec.nodeName={self.node_name}",
            max_backoff=2.0,
        )

    def _on_pod(self, kind: str, pod: JSON) -> None:
        """Queue a pod event for the admission loop, by uid (as kubelet keys its pods)."""
        meta = metadata_of(pod)
        key = (str(meta.get("namespace")), str(meta.get("name")))
        known = self.admissions.get(key)
        if kind == "DELETED" and not meta.get("uid"):
            # a deletion seen only by a re-list names the pod, not its uid
            if known is None:
                return
            pod = {"metadata": {**meta, "uid": known.uid}}
        elif known is not None and known.uid != meta.get("uid") and known.uid in self._by_uid:
            # the pod was deleted and made again under the same name while the watch was
            # down: the old one's devices are free
            gone = {"metadata": {"uid": known.uid, "namespace": key[0], "name": key[1]}}
            self._queue.put_nowait(("DELETED", gone))
        self._queue.put_nowait((kind, pod))

    async def _admit_loop(self) -> None:
        while True:
            kind, pod = await self._queue.get()
            try:
                await self._handle(kind, pod)
            except asyncio.CancelledError:
                raise
            except Exception:
                meta = pod.get("metadata", {})
                log.exception(
                    "%s: handling pod %s/%s failed",
                    self.node_name,
                    meta.get("namespace"),
                    meta.get("name"),
                )

    async def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        if kind == "DELETED":
            self._release(uid)
            await self._release_dra(uid)
            adm = self._by_uid.pop(uid, None)
            self._deleting.discard(uid)
            if adm is not None:
                adm.deleted = True
                await self._notify()
            return
        if meta.get("deletionTimestamp"):
            self._release(uid)
            await self._release_dra(uid)
            if uid not in self._deleting:
                self._deleting.add(uid)
                await self._finish_delete(meta)
            return
        phase = pod.get("status", {}).get("phase", "Pending")
        if phase in ("Succeeded", "Failed"):
            self._release(uid)
            await self._release_dra(uid)
            return
        if uid in self._by_uid or phase != "Pending":
            return
        await self._admit(pod)

    async def _finish_delete(self, meta: dict[str, Any]) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        with contextlib.suppress(NotFound, Conflict):
            await self.kube.delete(pod_path(meta["namespace"], meta["name"]), body)

    def _release(self, uid: str) -> None:
        for used in self._used.values():
            for device in [d for d, owner in used.items() if owner == uid]:
                del used[device]

    @staticmethod
    def _device_requests(
        container: dict[str, Any], plugins: Mapping[str, Any]
    ) -> list[tuple[str, int]]:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        out = []
        for name, quantity in wanted.items():
            if name not in plugins:
                continue
            try:
                count = int(str(quantity))
            except ValueError:
                raise _AdmissionError(
                    f"invalid quantity {quantity!r} for device resource {name}"
                ) from None
            if count > 0:
                out.append((name, count))
        return out

    async def _admit(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec", {})
        adm = PodAdmission(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
        self._by_uid[adm.uid] = adm
        self.admissions[(adm.namespace, adm.name)] = adm
        containers = [(True, c) for c in spec.get("initContainers") or []]
        containers += [(False, c) for c in spec.get("containers") or []]
        reusable: dict[str, list[str]] = {}  # devices of finished init containers
        if f"{adm.namespace}/{adm.name}" in self.lose:
            log.warning(
                "%s: losing the admission of %s/%s", self.node_name, adm.namespace, adm.name
            )
            return
        try:
            for init, container in containers:
                for resource, count in self._device_requests(container, self.plugins):
                    adm.containers.append(
                        await self._allocate(
                            adm.uid, container["name"], init, resource, count, reusable
                        )
                    )
        except Exception as exc:
            self._release(adm.uid)
            detail = str(exc) if isinstance(exc, _AdmissionError) else repr(exc)
            phase = "Failed"
            reason: str | None = UNEXPECTED_ADMISSION_ERROR
            message: str | None = f"Allocate failed due to {detail}, which is unexpected"
            status: dict[str, Any] = {
                "phase": phase,
                "reason": reason,
                "message": message,
                "startTime": _now(),
            }
        else:
            if self.dra is not None and self._uses_dra(pod):
                # admitted; kubelet's pod worker prepares the claims, pods in parallel
                self._start_worker(adm, pod)
                return
            phase, reason, message = "Running", None, None
            status = self._running_status(spec)
        try:
            await self._write_status(adm, status)
        finally:
            # only now: waiters look at the pod once its status is written
            adm.phase, adm.reason, adm.message = phase, reason, message
            await self._notify()

    async def _write_status(self, adm: PodAdmission, status: dict[str, Any]) -> None:
        """Patch the pod's status, retrying with capped back-off as kubelet's status manager
        does (an API server outage must not leave an admitted pod Pending for ever); a pod
        that is gone (404) or a deleted admission ends the tries."""
        delay, largest = self.status_retry
        while True:
            try:
                await self._patch_status(adm, status)
                return
            except NotFound:
                return
            except KubeError as exc:
                # status 0: the API server did not answer (hami.kube.raw.Unreachable)
                if 0 < exc.status < 500 and exc.status not in (409, 429):
                    raise
                error = exc
            if adm.deleted:
                return
            log.warning(
                "%s: status of pod %s/%s not written, retrying in %.1fs: %r",
                self.node_name,
                adm.namespace,
                adm.name,
                delay,
                error,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, largest)

    async def _patch_status(self, adm: PodAdmission, status: dict[str, Any]) -> None:
        await self.kube.merge_patch(
            pod_path(adm.namespace, adm.name) + "/status", {"status": status}
        )

    async def _allocate(
        self,
        uid: str,
        container: str,
        init: bool,
        resource: str,
        count: int,
        reusable: dict[str, list[str]],
    ) -> ContainerAllocation:
        plugin = self.plugins[resource]
        if not plugin.connected:
            raise _AdmissionError(f"device plugin for {resource} is not connected")
        used = self._used.setdefault(resource, {})
        reuse = [d for d in reusable.get(resource, []) if d in plugin.devices]
        free = reuse + [d for d in plugin.healthy if d not in used and d not in reuse]
        if len(free) < count:
            raise _AdmissionError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(free)}"
            )
        stub = self._stub(plugin)
        if plugin.options.get_preferred_allocation_available:
            preferred = await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=free, allocation_size=count
                        )
                    ]
                ),
                timeout=self.rpc_timeout,
            )
            ids = list(preferred.container_responses[0].deviceIDs)
            if len(ids) != count or not set(ids) <= set(free):
                raise _AdmissionError(
                    f"GetPreferredAllocation for {resource} answered {ids}, want {count} of {free}"
                )
        else:
            ids = free[:count]
        response = await stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
            ),
            timeout=self.rpc_timeout,
        )
        if len(response.container_responses) != 1:
            raise _AdmissionError(
                f"Allocate for {resource} returned {len(response.container_responses)} "
                "container responses, want 1"
            )
        if plugin.options.pre_start_required:
            await stub.PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=ids), timeout=self.rpc_timeout
            )
        for device in ids:
            used[device] = uid
        if init:
            reusable[resource] = ids
        else:
            reusable[resource] = [d for d in reusable.get(resource, []) if d not in ids]
        return ContainerAllocation(container, init, resource, ids, response.container_responses[0])

    def _running_status(self, spec: dict[str, Any]) -> dict[str, Any]:
        now = _now()

        def cstatus(c: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
            return {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"emulated://{self.node_name}/{c['name']}",
                "ready": True,
                "started": "terminated" not in state,
                "restartCount": 0,
                "state": state,
            }

        done = {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": now,
                "finishedAt": now,
            }
        }
        conditions = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in (
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled",
            )
        ]
        status: dict[str, Any] = {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": now,
            "conditions": conditions,
            "containerStatuses": [
                cstatus(c, {"running": {"startedAt": now}}) for c in spec.get("containers") or []
            ],
        }
        if spec.get("initContainers"):
            status["initContainerStatuses"] = [cstatus(c, done) for c in spec["initContainers"]]
        return status
