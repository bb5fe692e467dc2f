"""``hami run --role scheduler``: watches, handshake, extender and webhook in one process.

In-process use (tests, demos)::

    async with SchedulerRole(cfg, api) as role:     # api: a kubernetes_asyncio ApiClient
        role.url            # http://127.0.0.1:PORT  (extender, probes, metrics, explain)
        role.webhook_url    # https://127.0.0.1:PORT/webhook, or None when disabled
        role.scheduler      # hami.scheduler.service.Scheduler (state, filter, bind)
        await role.wait_ready()

Port 0 in the config picks a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from aiohttp import web

from hami import config, log
from hami.backends import registry
from hami.backends.base import BackendError
from hami.core.requests import DeviceKind
from hami.kube.client import KubeConfigError, open_client
from hami.kube.reflector import Reflector
from hami.scheduler.http import build_app
from hami.scheduler.service import Clock, Scheduler
from hami.scheduler.webhook import ReloadingTLS

_log = log.get(__name__)
TLS_CHECK_SECONDS = 10.0


def device_kinds(cfg: config.Config) -> list[DeviceKind]:
    """The device kinds of the enabled backends (one per type word, first wins)."""
    kinds: dict[str, DeviceKind] = {}
    for name, section in cfg.enabled_backends().items():
        backend = registry.create(name, section.settings(name))
        kind = DeviceKind.from_backend(backend)
        if kind.type_word in kinds:
            _log.warning(
                "two enabled backends share a device type; keeping the first",
                type=kind.type_word,
                backend=name,
            )
            continue
        kinds[kind.type_word] = kind
    return list(kinds.values())


class SchedulerRole:
    def __init__(
        self,
        cfg: config.Config,
        api: Any,
        *,
        kinds: Sequence[DeviceKind] | None = None,
        clock: Clock | None = None,
        handshake_loop: bool = True,
        emit_events: bool = True,
    ) -> None:
        self.cfg = cfg
        self.api = api
        self.scheduler = Scheduler(
            cfg.scheduler,
            kinds if kinds is not None else device_kinds(cfg),
            api,
            clock=clock,
            emit_events=emit_events,
        )
        self.handshake_loop = handshake_loop
        self.url = ""
        self.webhook_url: str | None = None
        self.tls: ReloadingTLS | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._runners: list[web.AppRunner] = []

    async def __aenter__(self) -> SchedulerRole:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        sched = self.scheduler
        settings = self.cfg.scheduler
        nodes = Reflector(self.api, "/api/v1/nodes", sched.on_node, name="nodes")
        pods = Reflector(self.api, "/api/v1/pods", sched.on_pod, name="pods")
        self._spawn(nodes.run(), "reflector-nodes")
        self._spawn(pods.run(), "reflector-pods")
        self._spawn(self._mark_synced(nodes, sched.nodes_synced), "synced-nodes")
        self._spawn(self._mark_synced(pods, sched.pods_synced), "synced-pods")
        if self.handshake_loop:
            self._spawn(sched.handshake_loop(), "handshake")
        host, port = await self._serve(
            build_app(sched, settings.scheduler_name), settings.http.address, settings.http.port
        )
        self.url = f"http://{_display(host)}:{port}"
        hook = settings.webhook
        if hook.enabled:
            self.tls = ReloadingTLS(hook.cert_file, hook.key_file)
            host, port = await self._serve(
                build_app(sched, settings.scheduler_name, extender=False),
                hook.address,
                hook.port,
                ssl_context=self.tls.context,
            )
            self.webhook_url = f"https://{_display(host)}:{port}/webhook"
            self._spawn(self._watch_tls(self.tls), "webhook-tls")
        _log.info(
            "scheduler role started",
            url=self.url,
            webhook=self.webhook_url,
            types=[k.type_word for k in sched.kinds],
            node_policy=settings.node_policy,
            device_policy=settings.device_policy,
        )

    async def wait_ready(self, seconds: float = 30.0) -> None:
        async with asyncio.timeout(seconds):
            await self.scheduler.nodes_synced.wait()
            await self.scheduler.pods_synced.wait()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.scheduler.drain()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(self._task_done)
        self._tasks.append(task)

    @staticmethod
    def _task_done(task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            _log.error("scheduler task failed", task=task.get_name(), error=repr(exc))

    async def _serve(
        self, app: web.Application, address: str, port: int, ssl_context: Any = None
    ) -> tuple[str, int]:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, address, port, ssl_context=ssl_context)
        await site.start()
        bound = runner.addresses[0]
        return str(bound[0]), int(bound[1])

    @staticmethod
    async def _mark_synced(reflector: Reflector, event: asyncio.Event) -> None:
        await reflector.synced.wait()
        event.set()

    @staticmethod
    async def _watch_tls(tls: ReloadingTLS) -> None:
        while True:
            await asyncio.sleep(TLS_CHECK_SECONDS)
            tls.maybe_reload()


def _display(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


async def main(cfg: config.Config) -> int:
    log.bind(role="scheduler")
    try:
        kinds = device_kinds(cfg)
    except (BackendError, config.ConfigError) as exc:
        _log.error("cannot start the scheduler", error=str(exc))
        return 2
    if not kinds:
        _log.error("no backend is enabled: enable one under 'backends' in the config")
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        async with (
            open_client(cfg.kubeconfig or None) as api,
            SchedulerRole(cfg, api, kinds=kinds),
        ):
            await stop.wait()
            _log.info("stopping")
    except KubeConfigError as exc:
        _log.error("cannot reach the API server", error=str(exc))
        return 2
    except (OSError, ValueError) as exc:
        _log.error("scheduler stopped", error=str(exc))
        return 1
    return 0
