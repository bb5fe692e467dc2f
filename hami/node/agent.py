"""``NodeAgent``: the node role as an object, so tests and demos can run several in one process.

    agent = NodeAgent(cfg, node_name="node-a", kube=kube, backends={"fake": backend},
                      register_period=1.0, device_plugin_dir="/tmp/hk-x/0", http_port=0)
    task = asyncio.create_task(agent.run())
    await agent.wait_ready()
    ...
    await agent.stop()   # or cancel the task

Tasks, all under one ``asyncio.TaskGroup`` (each named, each failure logged at once):

- ``http``: ``/healthz`` and ``/metrics``;
- ``monitor``: per-container usage from HAMi-core's files (``hami.node.monitor``);
- ``pod-cache``: watches of this Node and of the pods bound to it, which ``Allocate``
  reads instead of the API server (``hami.node.podcache``; not with an in-memory client);
- per backend with devices: ``register[{name}]`` (the Node annotations),
  ``device-plugin[{name}]`` (gRPC server + kubelet registration watcher) and
  ``health[{name}]`` (the backend's health events), and for a backend that makes things
  for pods (NVIDIA MIG instances) ``pod-reconcile[{name}]`` (releases what gone pods
  held, every register period, and at once on start); with ``mode: dra`` instead
  ``dra-slices[{name}]`` (the ResourceSlice) and ``dra-plugin[{name}]`` (``hami.dra``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from hami import config, log
from hami.backends import registry
from hami.backends.base import Backend, BackendError
from hami.kube.raw import PATIENT_RETRY, RetryPolicy
from hami.listener import Limits
from hami.node import http
from hami.node import monitor as usage
from hami.node.allocate import Allocator, NodeKube
from hami.node.capacity import capacity_resources
from hami.node.metrics import NodeMetrics
from hami.node.plugin import PluginServer
from hami.node.registration import Registrar
from hami.node.state import DeviceState

if TYPE_CHECKING:
    from hami.node.podcache import NodeCache

_log = log.get(__name__)
T = TypeVar("T")


class AgentKube(NodeKube, Protocol):
    """The agent's client (``hami.kube.client.Kube``): the node's calls, and the same
    session under another retry policy (the Allocator's patient one)."""

    def with_retry(self, policy: RetryPolicy) -> NodeKube: ...


class _Stopped(Exception):
    """Raised inside the task group to end it on request."""


class NodeAgent:
    def __init__(
        self,
        cfg: config.Config,
        *,
        node_name: str | None = None,
        kube: AgentKube | None = None,
        kubeconfig: str | None = None,
        backends: Mapping[str, Backend] | Sequence[Backend] | None = None,
        register_period: float | None = None,
        device_plugin_dir: str | None = None,
        serve_http: bool = True,
        http_address: str | None = None,
        http_port: int | None = None,
        kubelet_poll: float = 1.0,
        min_backoff: float = 1.0,
        lock_timeout: float | None = None,
        now: Callable[[], datetime] | None = None,
        watch_pods: bool = True,
    ) -> None:
        self.cfg = cfg
        self.node = node_name or cfg.node.name
        if not self.node:
            raise ValueError("the node agent needs a node name (NODE_NAME or --node-name)")
        self._kubeconfig = kubeconfig if kubeconfig is not None else (cfg.kubeconfig or None)
        self._kube = kube
        if backends is None:
            self._given: dict[str, Backend] | None = None
        elif isinstance(backends, Mapping):
            self._given = dict(backends)
        else:
            self._given = {b.type_word: b for b in backends}
        self.period = register_period or cfg.node.register_period.seconds
        self.plugin_dir = device_plugin_dir or cfg.node.device_plugin_dir
        self.serve_http = serve_http
        self.http_address = http_address or cfg.node.http.address
        self.http_port: int = cfg.node.http.port if http_port is None else http_port
        self.kubelet_poll = kubelet_poll
        self.min_backoff = min_backoff
        self.lock_timeout = timedelta(
            seconds=lock_timeout or cfg.scheduler.node_lock_timeout.seconds
        )
        # the scheduler's setting: both sides judge a stalled lock holder by one rule
        self.allocation_timeout = timedelta(seconds=cfg.scheduler.allocation_timeout.seconds)
        self.now = now or (lambda: datetime.now(UTC))
        self.metrics = NodeMetrics()
        self.states: dict[str, DeviceState] = {}
        self.registrars: dict[str, Registrar] = {}
        self.plugins: dict[str, PluginServer] = {}
        self.capacity_plugins: dict[str, PluginServer] = {}  # "{backend}:{resource}"
        self.dra: dict[str, Any] = {}  # mode dra: name -> (DRAPluginServer, SlicePublisher)
        self._dra_metrics: Any = None
        self.allocator: Allocator | None = None
        self.monitor: usage.UsageMonitor | None = None
        self.watch_pods = watch_pods
        self.cache: NodeCache | None = None
        self.log = _log.bind(role="node", node=self.node)
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._pending: set[str] = set()
        self._done = asyncio.Event()

    # ------------------------------------------------------------------ public

    async def wait_ready(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Wait until every backend is serving its device plugin (or found no devices)."""
        async with asyncio.timeout(timeout):
            await self._ready.wait()

    def request_stop(self) -> None:
        self._stop.set()

    async def stop(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Ask ``run`` to end and wait (bounded) until it has."""
        self._stop.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._done.wait()

    def status(self) -> dict[str, Any]:
        backends: dict[str, Any] = {}
        for name, state in self.states.items():
            registrar = self.registrars.get(name)
            plugin = self.plugins.get(name)
            last = registrar.last_success if registrar else None
            backends[name] = {
                "type": state.backend.type_word,
                "devices": len(state.devices),
                "healthy": sum(1 for d in state.devices if d.healthy),
                "registered_with_kubelet": bool(plugin and plugin.registered.is_set()),
                "last_registration": last.isoformat() if last else None,
                "registration_failures": registrar.failures if registrar else 0,
            }
        out: dict[str, Any] = {"node": self.node, "backends": backends}
        if self.cache is not None:
            # Allocate reads the API server while the watches are not current: slower, not
            # wrong, so this is reported here and does not fail the probe
            out["pod_cache"] = self.cache.status()
        if self.allocator is not None:
            out["allocate_reads"] = dict(self.allocator.served)
        return out

    async def run(self) -> None:
        """Run until ``stop()`` (or cancellation). Raises on a fatal error."""
        self._done.clear()
        self._ready.clear()
        try:
            async with contextlib.AsyncExitStack() as stack:
                kube = self._kube
                if kube is None:
                    from hami.kube.client import open_client

                    kube = await stack.enter_async_context(open_client(self._kubeconfig))
                # kubelet waits for Allocate without a deadline and a pod whose Allocate
                # fails is Failed for good: its calls wait out a short API server outage
                patient = kube.with_retry(PATIENT_RETRY)
                self.cache = self._make_cache(kube, patient)
                self.allocator = Allocator(
                    self.node,
                    patient,
                    lock_timeout=self.lock_timeout,
                    allocation_timeout=self.allocation_timeout,
                    now=self.now,
                    cache=self.cache,
                )
                backends = self._given
                if backends is None:
                    backends = self._create_backends()
                    for backend in backends.values():
                        stack.push_async_callback(_close_backend, backend)
                self._pending = set(backends)
                if not backends:
                    self._ready.set()

                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self._wait_stop(), name="stop")
                        # per-container usage, cleanup and priority feedback (HAMi-core files)
                        self.monitor = usage.create(
                            self.cfg.node.monitor,
                            self.node,
                            kube,
                            backends.values(),
                            self.metrics,
                            cache=self.cache,
                        )
                        if self.monitor is not None:
                            tg.create_task(
                                self._logged("monitor", self.monitor.run()), name="monitor"
                            )
                        if self.cache is not None:
                            tg.create_task(
                                self._logged("pod-cache", self.cache.run()), name="pod-cache"
                            )
                        if self.serve_http:
                            listener, self.http_port = await http.start(
                                http.make_app(self.metrics, self.status),
                                self.http_address,
                                self.http_port,
                                Limits(
                                    self.cfg.node.http.request_timeout.seconds,
                                    self.cfg.node.http.max_pending_connections,
                                ),
                            )
                            stack.push_async_callback(listener.close)
                            self.log.info("http_serving", port=self.http_port)
                        for name, backend in backends.items():
                            tg.create_task(
                                self._logged(
                                    f"backend[{name}]",
                                    self._run_backend(tg, name, backend, kube),
                                ),
                                name=f"backend[{name}]",
                            )
                except* _Stopped:
                    pass
                # a node lock release sent after kubelet's answer: let it land (bounded)
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(5):
                        await self.allocator.settle()
        finally:
            self.log.info("stopped")
            self._done.set()

    # ------------------------------------------------------------------ internals

    def _make_cache(self, kube: AgentKube, patient: NodeKube) -> NodeCache | None:
        """The watches Allocate reads, for a real API client (an in-memory one has none);
        the lock release goes through ``patient``, the Allocator's client."""
        from hami.kube.client import Kube
        from hami.node.podcache import NodeCache

        if not self.watch_pods or not isinstance(kube, Kube) or not isinstance(patient, Kube):
            return None
        return NodeCache(kube, self.node, writer=patient)

    def _create_backends(self) -> dict[str, Backend]:
        created: dict[str, Backend] = {}
        enabled = self.cfg.enabled_backends()
        for name, section in enabled.items():
            try:
                created[name] = registry.create(name, section.settings(name))
            except (BackendError, config.ConfigError) as exc:
                self.log.error("backend_unavailable", backend=name, error=str(exc))
        if enabled and not created:
            raise BackendError(
                f"no backend could start (enabled: {', '.join(enabled)}); see the errors above"
            )
        return created

    async def _wait_stop(self) -> None:
        await self._stop.wait()
        raise _Stopped

    async def _logged(self, name: str, work: Awaitable[T]) -> T:
        try:
            return await work
        except (asyncio.CancelledError, _Stopped):
            raise
        except BaseException as exc:
            self.log.error("task_failed", task=name, error=repr(exc), exc_info=True)
            raise

    def _started(self, name: str) -> None:
        self._pending.discard(name)
        if not self._pending:
            self._ready.set()
            self.log.info("node_agent_ready", backends=sorted(self.states))

    async def _enumerate(self, name: str, backend: Backend) -> list[Any]:
        delay, failures = self.min_backoff, 0
        while True:
            try:
                return await backend.enumerate()
            except BackendError as exc:
                failures += 1
                method = self.log.warning if failures == 1 else self.log.debug
                method("enumerate_failed", backend=name, error=str(exc), retry_in=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.period)

    async def _run_backend(
        self,
        tg: asyncio.TaskGroup,
        name: str,
        backend: Backend,
        kube: NodeKube,
    ) -> None:
        blog = self.log.bind(backend=name)
        devices = await self._enumerate(name, backend)
        if not devices:
            blog.info("no_devices", type=backend.type_word)
            self._started(name)
            return
        state = DeviceState(name, backend)
        state.bind_loop()
        state.set_enumerated(devices)
        self.states[name] = state
        assert self.allocator is not None
        section = self.cfg.backends.get(name)
        if section is not None and section.mode == "dra":
            await self._run_dra(tg, name, state, kube)
            blog.info("backend_started", type=backend.type_word, devices=len(devices), mode="dra")
            self._started(name)
            return
        registrar = Registrar(
            state,
            kube,
            period=self.period,
            metrics=self.metrics,
            now=self.now,
            min_backoff=self.min_backoff,
            node=self.node,
        )
        plugin = PluginServer(
            state,
            self.allocator,
            self.metrics,
            self.plugin_dir,
            poll=self.kubelet_poll,
            node=self.node,
            numa_topology=self.cfg.node.numa_topology,
        )
        self.registrars[name] = registrar
        self.plugins[name] = plugin
        tg.create_task(
            self._logged(f"device-plugin[{name}]", plugin.run()), name=f"device-plugin[{name}]"
        )
        await plugin.serving.wait()
        for resource in capacity_resources(state):  # what Go HAMi reads from capacity
            extra = PluginServer(
                state,
                self.allocator,
                self.metrics,
                self.plugin_dir,
                poll=self.kubelet_poll,
                node=self.node,
                capacity=resource,
            )
            self.capacity_plugins[f"{name}:{resource}"] = extra
            task = f"device-plugin[{name}:{resource}]"
            tg.create_task(self._logged(task, extra.run()), name=task)
            await extra.serving.wait()
        blog.info(
            "backend_started",
            type=backend.type_word,
            devices=len(devices),
            resource=backend.resources.count,
        )
        tg.create_task(self._logged(f"register[{name}]", registrar.run()), name=f"register[{name}]")
        tg.create_task(
            self._logged(f"health[{name}]", self._watch_health(state, blog)),
            name=f"health[{name}]",
        )
        if type(backend).reconcile_pods is not Backend.reconcile_pods:
            task = f"pod-reconcile[{name}]"
            tg.create_task(self._logged(task, self._reconcile_pods(backend)), name=task)
        self._started(name)

    async def _reconcile_pods(self, backend: Backend) -> None:
        """Release what pods that are gone held (``Allocator.reconcile``), every period."""
        assert self.allocator is not None
        while True:
            await self.allocator.reconcile(backend)
            await asyncio.sleep(self.period)

    async def _run_dra(
        self, tg: asyncio.TaskGroup, name: str, state: DeviceState, kube: NodeKube
    ) -> None:
        """``mode: dra``: the ResourceSlice publisher and the kubelet DRA plugin instead of
        the node annotations and the device plugin (docs/dra.md "Node side")."""
        from hami.dra.checkpoint import Checkpoint
        from hami.dra.metrics import DRAMetrics
        from hami.dra.names import driver_name
        from hami.dra.plugin import DRAPluginServer, DRAService
        from hami.dra.publisher import SlicePublisher
        from hami.node.allocate import check_entry

        if not hasattr(kube, "request"):
            raise BackendError(f"{name}: mode dra needs a Kubernetes API client")
        api: Any = kube
        paths = self.cfg.node.dra
        driver = driver_name(state.backend.type_word)
        checkpoint = Checkpoint(f"{paths.plugins_dir}/{driver}/checkpoint.json")
        checkpoint.load()
        if self._dra_metrics is None:  # one set per registry, shared by the DRA backends
            self._dra_metrics = DRAMetrics(self.metrics.registry)
        service = DRAService(
            node=self.node,
            backend=state.backend,
            devices=lambda: state.devices,
            kube=api,
            check=check_entry,
            cdi_dir=paths.cdi_dir,
            checkpoint=checkpoint,
            metrics=self._dra_metrics,
        )
        server = DRAPluginServer(
            service,
            plugins_dir=paths.plugins_dir,
            registry_dir=paths.registry_dir,
            poll=self.kubelet_poll,
        )
        publisher = SlicePublisher(
            api,
            self.node,
            state.backend,
            state,
            period=self.period,
            min_backoff=self.min_backoff,
            metrics=self._dra_metrics,
            refresh=lambda: self._refresh(state),
        )
        self.dra[name] = (server, publisher)
        tg.create_task(
            self._logged(f"dra-plugin[{name}]", server.run()), name=f"dra-plugin[{name}]"
        )
        await server.serving.wait()
        tg.create_task(
            self._logged(f"dra-slices[{name}]", publisher.run()), name=f"dra-slices[{name}]"
        )
        tg.create_task(
            self._logged(f"health[{name}]", self._watch_health(state, self.log.bind(backend=name))),
            name=f"health[{name}]",
        )

    async def _refresh(self, state: DeviceState) -> None:
        """Re-enumerate as the registration loop does; on failure keep the last devices."""
        try:
            state.set_enumerated(await state.backend.enumerate())
        except BackendError as exc:
            self.log.warning("enumerate_failed", backend=state.name, error=str(exc))

    async def _watch_health(self, state: DeviceState, blog: Any) -> None:
        try:
            await state.backend.watch_health(state.devices, state.on_health)
        except BackendError as exc:
            blog.error("health_watch_failed", error=str(exc))


async def _close_backend(backend: Backend) -> None:
    try:
        async with asyncio.timeout(10):
            await backend.close()
    except Exception as exc:
        _log.warning("backend_close_failed", backend=backend.type_word, error=repr(exc))
