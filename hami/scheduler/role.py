"""``hami run --role scheduler``: watches, handshake, extender and webhook in one process.

In-process use (tests, demos)::

    async with SchedulerRole(cfg, kube) as role:    # kube: a hami.kube.client.Kube
        role.url            # http(s)://127.0.0.1:PORT  (extender: /filter, /bind, /explain)
        role.probe_url      # http://127.0.0.1:PORT  (/healthz, /readyz, /metrics)
        role.webhook_url    # https://127.0.0.1:PORT/webhook, or None when disabled
        role.scheduler      # hami.scheduler.service.Scheduler (state, filter, bind)
        await role.wait_ready()

Port 0 in the config picks a free port. The long-lived tasks (the Node, Pod and
ResourceQuota reflectors, the handshake loop, TLS reloads) run under one
``asyncio.TaskGroup``: when one dies for an unexpected reason the others are cancelled,
``serve()`` raises ``RoleFailed`` and ``main`` exits 1, so the Deployment restarts the
process instead of it serving a frozen picture.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import ipaddress
import signal
import time
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any

from aiohttp import web

from hami import config, log
from hami.backends import registry
from hami.backends.base import BackendError
from hami.core.requests import DeviceKind
from hami.kube.client import Kube, KubeConfigError, open_client
from hami.kube.reflector import Handler, Reflector
from hami.listener import Limits, Listener
from hami.scheduler import heap, podinfo
from hami.scheduler.admission import Admission
from hami.scheduler.drascore import DraScore
from hami.scheduler.http import (
    ClientCertTLS,
    ExtenderTLSError,
    extender_app,
    probe_app,
    webhook_app,
)
from hami.scheduler.leader import LeaderElector, elector_for, mirror, sole_replica
from hami.scheduler.selftls import SelfTLS
from hami.scheduler.service import Clock, Scheduler
from hami.scheduler.webhook import ReloadingTLS, WebhookTLSError

_log = log.get(__name__)
TLS_CHECK_SECONDS = 10.0
# The defrag policy's rows filled ahead per slice (~40 µs each) and the pause between
# checks for stale ones (``_prefill_defrag``).
PREFILL_ROWS = 64
PREFILL_PAUSE = 0.05
# A watch may be down this long (a reconnect) before /readyz turns 503 and /filter refuses.
STALE_GRACE = 5.0


def device_kinds(cfg: config.Config) -> list[DeviceKind]:
    """The device kinds of the enabled backends (one per type word, first wins)."""
    kinds: dict[str, DeviceKind] = {}
    for name, section in cfg.enabled_backends().items():
        backend = registry.create(name, section.settings(name))
        kind = dataclasses.replace(
            DeviceKind.from_backend(backend), default_count=cfg.scheduler.default_device_count
        )
        if kind.type_word in kinds:
            _log.warning(
                "two enabled backends share a device type; keeping the first",
                type=kind.type_word,
                backend=name,
            )
            continue
        kinds[kind.type_word] = kind
    return list(kinds.values())


def dra_kinds(cfg: config.Config) -> list[DeviceKind]:
    """The device kinds of the enabled backends in ``mode: dra`` (one per type word)."""
    kinds: dict[str, DeviceKind] = {}
    for name, section in cfg.enabled_backends().items():
        if section.mode == "dra":
            kind = DeviceKind.from_backend(registry.create(name, section.settings(name)))
            kinds.setdefault(kind.type_word, kind)
    return list(kinds.values())


RESOURCE_API = "/apis/resource.k8s.io/v1"


def _fan_out(*handlers: Handler) -> Handler:
    def handle(kind: str, obj: dict[str, Any]) -> None:
        for handler in handlers:
            handler(kind, obj)

    return handle


class RoleFailed(Exception):
    """A long-lived task of the scheduler role ended; the process must restart."""


Work = Callable[[], Coroutine[Any, Any, None]]


class SchedulerRole:
    def __init__(
        self,
        cfg: config.Config,
        kube: Kube,
        *,
        kinds: Sequence[DeviceKind] | None = None,
        clock: Clock | None = None,
        handshake_loop: bool = True,
        emit_events: bool = True,
        stale_grace: float = STALE_GRACE,
    ) -> None:
        self.cfg = cfg
        self.kube = kube
        self.scheduler = Scheduler(
            cfg.scheduler,
            kinds if kinds is not None else device_kinds(cfg),
            kube,
            clock=clock,
            emit_events=emit_events,
        )
        # scheduler.dra_score: the DRA mode's /prioritize (hami.scheduler.drascore)
        self.dra_score: DraScore | None = None
        if cfg.scheduler.dra_score:
            self.dra_score = DraScore(
                dra_kinds(cfg),
                self.scheduler.metrics.registry,
                device_policy=cfg.scheduler.device_policy,
                clock=self.scheduler.clock.now,
            )
        self.handshake_loop = handshake_loop
        self.stale_grace = stale_grace
        self.url = ""
        self.probe_url = ""
        self.webhook_url: str | None = None
        self.tls: ReloadingTLS | None = None
        self.extender_tls: ClientCertTLS | None = None
        self.selftls: SelfTLS | None = None  # scheduler.webhook.tls_mode self
        self.elector: LeaderElector | None = None  # scheduler.leader_election.enabled
        self.reflectors: list[Reflector] = []
        self.dra_reflectors: list[Reflector] = []  # scheduler.dra_score's watches
        self._group: asyncio.Task[None] | None = None
        self.listeners: list[Listener] = []  # probes, extender, webhook (when enabled)

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
        on_node: Handler = sched.on_node
        on_pod: Handler = sched.on_pod
        score = self.dra_score
        if score is not None:
            on_node, on_pod = _fan_out(on_node, score.on_node), _fan_out(on_pod, score.on_pod)
        freeze = heap.freeze_listed
        nodes = Reflector(
            self.kube,
            "/api/v1/nodes",
            on_node,
            name="nodes",
            after_initial_page=freeze,
            after_list=sched.locks.lost_track,
        )
        pods = Reflector(self.kube, "/api/v1/pods", on_pod, name="pods", after_initial_page=freeze)
        self.reflectors = [nodes, pods]
        work: list[tuple[str, Work]] = [
            ("reflector-nodes", nodes.run),
            ("reflector-pods", pods.run),
            ("synced-nodes", lambda: _mark_synced(nodes, sched.nodes_synced)),
            ("synced-pods", lambda: _mark_synced(pods, sched.pods_synced)),
            ("synced-heap", lambda: _settle_heap(sched)),
            ("defrag-prefill", lambda: _prefill_defrag(sched)),
        ]
        if settings.resource_quotas:
            # Limits must be known before the first filter, or a restart would let a
            # namespace over its quota: not_ready() waits for this reflector too.
            quotas = Reflector(
                self.kube, "/api/v1/resourcequotas", sched.on_quota, name="resourcequotas"
            )
            self.reflectors.append(quotas)
            work.append(("reflector-resourcequotas", quotas.run))
        if score is not None:
            # DRA objects feed only the score: their watches never hold up /filter
            for what, handler in (
                ("resourceslices", score.on_slice),
                ("resourceclaims", score.on_claim),
                ("resourceclaimtemplates", score.on_template),
            ):
                reflector = Reflector(self.kube, f"{RESOURCE_API}/{what}", handler, name=what)
                self.dra_reflectors.append(reflector)
                work.append((f"reflector-{what}", reflector.run))
        if self.handshake_loop:
            work.append(("handshake", sched.handshake_loop))
        recorder = sched.event_recorder()
        if recorder is not None:
            work.append(("events", recorder.run))
        if settings.leader_election.enabled:
            elector = self.elector = elector_for(self.kube, settings.leader_election, sched)
            work.append(("leader-election", elector.run))
            work.append(("leader-mirror", lambda: mirror(elector, sched)))
        else:
            sole_replica(sched.metrics.registry)
        await self._serve_all(work)
        self._group = asyncio.get_running_loop().create_task(
            self._run_group(work), name="scheduler-role"
        )
        _log.info(
            "scheduler role started",
            url=self.url,
            probes=self.probe_url,
            webhook=self.webhook_url,
            types=[k.type_word for k in sched.kinds],
            node_policy=settings.node_policy,
            device_policy=settings.device_policy,
            dra_score=[k.type_word for k in score.kinds.values()] if score else None,
        )

    async def _serve_all(self, work: list[tuple[str, Work]]) -> None:
        sched = self.scheduler
        settings = self.cfg.scheduler
        host, port = await self._serve(probe_app(sched, self.not_ready), settings.http)
        self.probe_url = f"http://{_display(host)}:{port}"
        ext = settings.extender
        scheme, ssl_context = "http", None
        if ext.tls.enabled:
            self.extender_tls = ClientCertTLS(
                ext.tls.cert_file, ext.tls.key_file, ext.tls.client_ca_file
            )
            scheme, ssl_context = "https", self.extender_tls.context
            work.append(("extender-tls", lambda: _watch_tls(self.extender_tls)))
        elif not _is_loopback(ext.address):
            _log.warning(
                "the extender (/filter, /bind) is served without authentication on a "
                "non-loopback address: anyone who reaches it can bind pods; set "
                "scheduler.extender.tls or keep scheduler.extender.address 127.0.0.1",
                address=ext.address,
            )
        app = extender_app(sched, self.not_ready, self.dra_score, self.score_not_ready)
        host, port = await self._serve(app, ext, ssl_context)
        self.url = f"{scheme}://{_display(host)}:{port}"
        hook = settings.webhook
        if hook.enabled:
            if hook.tls_mode == "self":
                self.tls = await self._self_tls(work)
            else:
                self.tls = ReloadingTLS(hook.cert_file, hook.key_file)
                work.append(("webhook-tls", lambda: _watch_tls(self.tls)))
            admission = Admission(
                self.kube,
                sched.kinds,
                settings.scheduler_name,
                runtime_class=hook.runtime_class_name,
                default_mode=hook.device_mode,
                route_cpu_pods=settings.defrag_cpu_pods,
            )
            host, port = await self._serve(
                webhook_app(sched, settings.scheduler_name, hook.runtime_class_name, admission),
                hook,
                self.tls.context,
            )
            self.webhook_url = f"https://{_display(host)}:{port}/webhook"

    async def _self_tls(self, work: list[tuple[str, Work]]) -> ReloadingTLS:
        hook = self.cfg.scheduler.webhook
        try:
            namespace = podinfo.namespace(hook.namespace, "scheduler.webhook.namespace")
        except podinfo.PodInfoError as exc:
            raise WebhookTLSError(f"webhook TLS (tls_mode self): {exc}") from None
        self.selftls = SelfTLS(self.kube, hook, namespace)
        tls = await self.selftls.start()
        work.append(("webhook-certs", self.selftls.run))
        return tls

    def not_ready(self) -> str | None:
        """Why the role must not be trusted now (``/readyz`` 503, ``/filter`` refuses)."""
        if not self.scheduler.ready:
            return "node and pod state not synced yet"
        if not all(reflector.synced.is_set() for reflector in self.reflectors):
            return "resource quotas not synced yet"
        for reflector in self.reflectors:
            down = reflector.down_for()
            if down > self.stale_grace:
                return (
                    f"the {reflector.name} watch has been broken for {down:.0f}s and is "
                    "reconnecting (see the 'list/watch failed' logs): the picture may be stale"
                )
        if self._group is not None and self._group.done():
            return "a scheduler task ended; the process must restart"
        return None

    def score_not_ready(self) -> str | None:
        """Why the DRA score has no opinion now (its watches not synced or broken)."""
        reason = self.not_ready()
        if reason is not None:
            return reason
        for reflector in self.dra_reflectors:
            if not reflector.synced.is_set():
                return f"the {reflector.name} watch has not synced yet"
            down = reflector.down_for()
            if down > self.stale_grace:
                return f"the {reflector.name} watch has been broken for {down:.0f}s"
        return None

    async def wait_ready(self, seconds: float = 30.0) -> None:
        async with asyncio.timeout(seconds):
            await self.scheduler.nodes_synced.wait()
            await self.scheduler.pods_synced.wait()
            for reflector in (*self.reflectors, *self.dra_reflectors):
                await reflector.synced.wait()

    async def serve(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set. Raises RoleFailed when a long-lived task ends first."""
        group = self._group
        assert group is not None, "start() first"
        stopper = asyncio.get_running_loop().create_task(stop.wait(), name="stop")
        try:
            await asyncio.wait({group, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if group.done():
            raise RoleFailed(_failure(group))

    async def stop(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await group
        await self.scheduler.drain()
        if self.elector is not None:
            # hand the Lease over now rather than after lease_duration
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self.elector.release()
        if self.selftls is not None:
            self.selftls.close()
        for listener in self.listeners:
            await listener.close()
        self.listeners.clear()

    async def _run_group(self, work: Sequence[tuple[str, Work]]) -> None:
        async with asyncio.TaskGroup() as tg:
            for name, factory in work:
                tg.create_task(_logged(name, factory), name=name)

    async def _serve(
        self,
        app: web.Application,
        section: config.HttpConfig | config.ExtenderConfig | config.WebhookConfig,
        ssl_context: Any = None,
    ) -> tuple[str, int]:
        limits = Limits(section.request_timeout.seconds, section.max_pending_connections)
        listener = Listener(app, limits, ssl_context)
        self.listeners.append(listener)
        return await listener.start(section.address, section.port)


async def _logged(name: str, work: Work) -> None:
    try:
        await work()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        _log.error("scheduler task failed", task=name, error=repr(exc), exc_info=True)
        raise
    else:
        # These tasks run for the life of the role; one that returns is a bug too.
        if not name.startswith("synced-"):
            _log.error("scheduler task ended", task=name)
            raise RoleFailed(f"scheduler task {name} ended")


def _failure(group: asyncio.Task[None]) -> str:
    if group.cancelled():
        return "the scheduler role was cancelled"
    exc = group.exception()
    if exc is None:
        return "the scheduler role's tasks ended"
    errors = exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,)
    return "scheduler task failed: " + "; ".join(repr(e) for e in errors)


async def _mark_synced(reflector: Reflector, event: asyncio.Event) -> None:
    await reflector.synced.wait()
    event.set()


async def _settle_heap(sched: Scheduler) -> None:
    """Once both initial lists are in, group the nodes by summary (what the first no-fit
    answer would do: 0.35 s at 65,000 nodes, paid here rather than by a request) and
    freeze what they built (``heap.settle``): the collector then never walks the cluster
    state again (2.3 s passes at 65,000 nodes)."""
    await sched.nodes_synced.wait()
    await sched.pods_synced.wait()
    began = time.monotonic()
    sched.cluster.group_summaries()
    grouped = time.monotonic() - began
    heap.settle()
    _log.info(
        "heap settled",
        frozen=gc.get_freeze_count(),
        threshold=gc.get_threshold(),
        nodes_grouped_in_s=round(grouped, 3),
    )


async def _prefill_defrag(sched: Scheduler) -> None:
    """After the ``defrag`` policy's weights change, fill the nodes' rows for the
    requests weighed lately while the loop has nothing else to do, a slice at a time
    (``PREFILL_ROWS``, a few ms), so decisions do not pay for them. Idle (one check per
    ``PREFILL_PAUSE``) while nothing is stale or no pod asked for the policy."""
    await sched.nodes_synced.wait()
    said = False
    while True:
        await asyncio.sleep(PREFILL_PAUSE)
        began = time.monotonic()
        rows = 0
        while sched.cluster.prefill_defrag(PREFILL_ROWS):
            rows += PREFILL_ROWS
            await asyncio.sleep(0)  # a filter or a watch event goes first
        if rows and not said:
            said = True
            _log.info(
                "defrag rows filled ahead of decisions after its weights changed (logged once)",
                rows=rows,
                seconds=round(time.monotonic() - began, 3),
            )


async def _watch_tls(tls: ReloadingTLS | ClientCertTLS | None) -> None:
    assert tls is not None
    while True:
        await asyncio.sleep(TLS_CHECK_SECONDS)
        tls.maybe_reload()


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


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
            open_client(cfg.kubeconfig or None) as kube,
            SchedulerRole(cfg, kube, kinds=kinds) as role,
        ):
            await role.serve(stop)
            _log.info("stopping")
    except RoleFailed as exc:
        _log.error("scheduler role failed; exiting so that it is restarted", error=str(exc))
        return 1
    except (ExtenderTLSError, WebhookTLSError, podinfo.PodInfoError) as exc:
        _log.error("cannot start the scheduler", error=str(exc))
        return 2
    except KubeConfigError as exc:
        _log.error("cannot reach the API server", error=str(exc))
        return 2
    except (OSError, ValueError) as exc:
        _log.error("scheduler stopped", error=str(exc))
        return 1
    return 0
