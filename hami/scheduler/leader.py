"""Leader election for the scheduler role (``scheduler.leader_election``).

One replica leads: it stamps the handshakes, releases stale node locks, answers
``/filter`` and ``/bind`` and exports the cluster gauges. A standby runs its watches (its
picture stays warm), serves the webhook and the probes, and answers ``/filter`` and
``/bind`` with an error, so the kube-scheduler that called it retries. The decisions are in
``hami.scheduler.lease``; this module reads and writes the Lease every ``retry_period``.

A leader that could not renew for ``renew_deadline`` stops leading at once (``leading``
also checks the time, so a stalled loop cannot keep it leading); a standby takes the Lease
after it has looked unchanged for ``lease_duration``, so the two never overlap while
``renew_deadline < lease_duration``. A replica that stops releases the Lease: a standby
takes it on its next try.

kube-scheduler in the same pod: with ``follow_kube_scheduler`` set (``namespace/name`` of
kube-scheduler's Lease) a replica only leads while its own kube-scheduler holds that Lease
(the holder is ``<pod name>_<uuid>``), and releases hami's Lease when its kube-scheduler
loses, so the extender kube-scheduler calls is the leading one (docs/operations.md). While
hami's Lease is free for it and only its kube-scheduler does not lead yet, a standby reads
kube-scheduler's Lease every ``FOLLOW_POLL`` and takes over right after it.

RBAC the scheduler role needs (the Helm chart renders it): ``leases``
(coordination.k8s.io) get, create, update in its namespace; with
``follow_kube_scheduler``, get on that Lease too.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from hami import log
from hami.config import LeaderElectionConfig
from hami.kube.client import Kube
from hami.kube.raw import Conflict, KubeError, NotFound
from hami.scheduler import podinfo
from hami.scheduler.lease import (
    LeaseRecord,
    Sighting,
    Step,
    decide,
    follows,
    lease_body,
    parse_lease,
)

_log = log.get(__name__)
LEADER_HELP = "1 while this scheduler replica leads (stamps handshakes, binds), 0 on standby"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
# how often a standby reads kube-scheduler's Lease while only that stands between it and
# hami's free Lease: it takes over right after its kube-scheduler, not a retry_period later
FOLLOW_POLL = 0.25


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        settings: LeaderElectionConfig,
        namespace: str,
        identity: str,
        *,
        registry: CollectorRegistry | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], dt.datetime] = utcnow,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.namespace = namespace
        self.identity = identity
        self.name = settings.lease_name
        self.path = LEASES.format(namespace=namespace) + "/" + self.name
        self.monotonic = monotonic
        self.now = now
        self.sleep = sleep
        self.changed = asyncio.Event()  # set on every change of leading
        self._leading = False
        self._renewed_at = float("-inf")
        self._seen = Sighting()
        self._record: LeaseRecord | None = None
        self.holder = ""  # the holder last read
        self.steps = 0
        # hami's Lease is ours to take, but this pod's kube-scheduler does not lead yet
        self.awaiting_kube_scheduler = False
        self.gauge: Gauge | None = None
        if registry is not None:
            self.gauge = Gauge(
                "hami_leader",
                LEADER_HELP,
                registry=registry,
            )
            self.gauge.set_function(lambda: 1 if self.leading else 0)

    @property
    def leading(self) -> bool:
        """True while this replica holds the Lease and renewed it within renew_deadline."""
        fresh = self.monotonic() - self._renewed_at < self.settings.renew_deadline.seconds
        return self._leading and fresh

    async def run(self) -> None:
        """Campaign and renew for the life of the role."""
        _log.info(
            "leader election running",
            lease=f"{self.namespace}/{self.name}",
            identity=self.identity,
        )
        while True:
            await self.step()
            await self._pause()

    async def _pause(self) -> None:
        """``retry_period``; cut short when awaiting this pod's kube-scheduler and it leads."""
        retry = self.settings.retry_period.seconds
        if not self.awaiting_kube_scheduler:
            await self.sleep(retry)
            return
        deadline = self.monotonic() + retry
        while (left := deadline - self.monotonic()) > 0:
            await self.sleep(min(FOLLOW_POLL, left))
            try:
                if await self._eligible():
                    return
            except KubeError:
                continue  # the next step reports it

    async def step(self) -> None:
        """One read, decision and (maybe) write."""
        self.steps += 1
        try:
            record = await self._read()
            eligible = await self._eligible()
        except KubeError as exc:
            _log.warning("cannot read the leader lease", lease=self.name, error=str(exc))
            self._set(self.leading)
            return
        seen_for = self._seen.see(record, self.monotonic())
        self._record = record
        self.holder = record.holder if record is not None else ""
        duration = self.settings.lease_duration.seconds
        step = decide(record, self.identity, seen_for, duration, eligible=eligible)
        self.awaiting_kube_scheduler = (
            step is Step.WAIT
            and not eligible
            and decide(record, self.identity, seen_for, duration) in (Step.CREATE, Step.TAKE)
        )
        if step is Step.WAIT:
            self._set(False)
            return
        if step is Step.RELEASE:
            await self.release()
            return
        sent = self.monotonic()  # the Lease's new renewTime is no older than this
        try:
            await self._write(step, record)
        except KubeError as exc:
            # 409: someone else wrote first; anything else: the API server is unhappy.
            # Either way we lead only until renew_deadline passes without a renewal.
            _log.info("leader lease write failed", step=step.value, error=str(exc))
            self._set(self.leading)
            return
        # counted from before the write: a slow answer must not stretch the deadline
        # past what a standby, which saw the write, allows
        self._renewed_at = sent
        self._set(True)

    async def release(self) -> None:
        """Hand the Lease back (on stop, or when no longer eligible)."""
        was, record = self._leading, self._record
        self._leading = False
        self._set(False)
        if record is None or record.holder != self.identity:
            return
        try:
            try:
                await self._write(Step.RELEASE, record)
            except Conflict:
                # our own last renewal may have landed unseen (a step cancelled mid-write)
                record = await self._read()
                if record is None or record.holder != self.identity:
                    return
                await self._write(Step.RELEASE, record)
        except KubeError as exc:
            _log.info("leader lease release failed; it expires instead", error=str(exc))
            return
        if was:
            _log.info("leader lease released", lease=self.name, identity=self.identity)

    async def _read(self) -> LeaseRecord | None:
        try:
            return parse_lease(await self.kube.request("GET", self.path))
        except NotFound:
            return None

    async def _eligible(self) -> bool:
        follow = self.settings.follow_kube_scheduler
        if not follow:
            return True
        namespace, _, name = follow.partition("/")
        path = LEASES.format(namespace=namespace) + "/" + name
        try:
            holder = parse_lease(await self.kube.request("GET", path)).holder
        except NotFound:
            holder = ""
        return follows(holder, self.identity)

    async def _write(self, step: Step, record: LeaseRecord | None) -> None:
        body = lease_body(
            self.name,
            self.namespace,
            self.identity,
            step,
            self.now(),
            self.settings.lease_duration.seconds,
            record,
        )
        if step is Step.CREATE:
            written = await self.kube.create(LEASES.format(namespace=self.namespace), body)
        else:
            written = await self.kube.request("PUT", self.path, body=body)
        self._record = parse_lease(written)
        self._seen.see(self._record, self.monotonic())

    def _set(self, leading: bool) -> None:
        if leading != self._leading:
            _log.info(
                "leading" if leading else "standby",
                lease=f"{self.namespace}/{self.name}",
                identity=self.identity,
                holder=self.holder,
            )
            self.changed.set()
        self._leading = leading


def sole_replica(registry: CollectorRegistry) -> None:
    """``hami_leader`` 1 for a role without leader election: it always leads."""
    Gauge("hami_leader", LEADER_HELP, registry=registry).set(1)


def elector_for(kube: Kube, settings: LeaderElectionConfig, scheduler: Any) -> LeaderElector:
    """An elector for the role's ``scheduler``, which stays on standby until it leads."""
    namespace = podinfo.namespace(settings.namespace, "scheduler.leader_election.namespace")
    elector = LeaderElector(
        kube,
        settings,
        namespace,
        podinfo.identity(settings.identity),
        registry=scheduler.metrics.registry,
    )
    # read on every handshake pass, filter and bind: never a stale copy
    scheduler.lead_check = lambda: elector.leading
    scheduler.metrics.cluster_gauges = False
    return elector


async def mirror(elector: LeaderElector, scheduler: Any, period: float = 0.5) -> None:
    """Export the cluster gauges only while leading: switched at once on a change, and
    every ``period`` for a leader whose renewals lapsed."""
    while True:
        scheduler.metrics.cluster_gauges = elector.leading
        scheduler.leadership_changed()
        elector.changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(period):
                await elector.changed.wait()
