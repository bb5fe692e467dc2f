"""One queue and one task that send Events: repeats folded, writes rate-limited per pod.

``record`` is what hot paths (filter, bind) call: it puts the occurrence on a bounded
queue and returns at once, never blocking and never raising. When the queue is full (the
API server is slow or down) the occurrence is dropped and ``hami_events_dropped_total``
counts it. ``run`` is the one sender: it folds what arrives (``hami.kube.eventfold``) and
creates or patches core/v1 Events (``count``, ``lastTimestamp``) as the folder says.
``flush`` writes whatever is still pending, ignoring the rate limit (shutdown, tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from hami import log
from hami.kube.client import Kube
from hami.kube.eventfold import (
    BURST,
    MAX_KEYS,
    REFILL_SECONDS,
    UPDATE_EVERY,
    Folder,
    Occurrence,
    Write,
)
from hami.kube.events import event_body, events_path, ref_of
from hami.kube.raw import MERGE_PATCH, NotFound, RetryPolicy
from hami.protocol.nodelock import rfc3339

_log = log.get(__name__)
QUEUE_SIZE = 1024
# An Event is not worth a long wait: a dead API server must not hold the sender for
# minutes (the queue drops meanwhile instead).
EVENT_RETRY = RetryPolicy(retries=2, base=0.2, cap=1.0, budget=5.0)
WRITE_TIMEOUT = 10.0
FLUSH_SECONDS = 5.0


class _Metrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.dropped = Counter(
            "hami_events_dropped_total",
            "Event occurrences dropped because the event queue was full",
            registry=registry,
        )
        self.folded = Counter(
            "hami_events_folded_total",
            "Event occurrences counted into an existing Event instead of a new one",
            registry=registry,
        )
        self.writes = Counter(
            "hami_events_writes_total",
            "Event writes to the API server by verb (create, patch) and outcome",
            ["verb", "outcome"],
            registry=registry,
        )


class EventRecorder:
    def __init__(
        self,
        kube: Kube,
        *,
        component: str = "hami-scheduler",
        queue_size: int = QUEUE_SIZE,
        burst: int = BURST,
        refill: float = REFILL_SECONDS,
        update_every: float = UPDATE_EVERY,
        max_keys: int = MAX_KEYS,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube.with_retry(EVENT_RETRY)
        self.component = component
        self.folder = Folder(burst, refill, update_every, max_keys)
        self.metrics = _Metrics(registry)
        self.dropped = 0
        self._queue: asyncio.Queue[Occurrence] = asyncio.Queue(queue_size)
        self._clock = clock
        self._wall = wall
        self._lock = asyncio.Lock()  # one writer at a time: run() or flush()

    def record(
        self, obj: Mapping[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None:
        """Queue one occurrence; O(1), never blocks, never raises."""
        try:
            occ = Occurrence(ref_of(obj), reason, message, type_, self._wall())
            self._queue.put_nowait(occ)
        except asyncio.QueueFull:
            self.dropped += 1
            self.metrics.dropped.inc()
            if self.dropped == 1 or self.dropped % 1000 == 0:
                _log.warning("event queue full, events dropped", dropped=self.dropped)
        except Exception:  # an Event must never fail the caller's work
            _log.exception("event not queued", reason=reason)

    @property
    def pending(self) -> int:
        """Occurrences queued and not yet folded."""
        return self._queue.qsize()

    async def run(self) -> None:
        """The sender; runs until cancelled. A bug here costs Events, never the role: an
        unexpected error is logged and the loop goes on."""
        while True:
            try:
                await self._step()
            except Exception:
                _log.exception("event sender step failed; going on")
                await asyncio.sleep(1.0)

    async def _step(self) -> None:
        wait = self.folder.next_due(self._clock())
        try:
            if wait is None:
                occ = await self._queue.get()
            else:
                async with asyncio.timeout(wait):
                    occ = await self._queue.get()
        except TimeoutError:
            pass
        else:
            self._fold(occ)
        async with self._lock:
            self._take_queued()
            await self._send(self.folder.due(self._clock()))

    async def flush(self, seconds: float = FLUSH_SECONDS) -> None:
        """Write everything queued or folded and not yet written, within ``seconds``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds), self._lock:
                self._take_queued()
                await self._send(self.folder.drain())

    def _take_queued(self) -> None:
        while True:
            try:
                occ = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            self._fold(occ)

    def _fold(self, occ: Occurrence) -> None:
        if self.folder.add(occ, self._clock()):
            self.metrics.folded.inc()

    async def _send(self, writes: list[Write]) -> None:
        for write in writes:
            try:
                name = await self._write(write)
            except asyncio.CancelledError:
                self.folder.failed(write, self._clock())
                raise
            except Exception as exc:  # logged and retried later; never ends the sender
                gone = isinstance(exc, NotFound)
                self.folder.failed(write, self._clock(), gone=gone)
                self.metrics.writes.labels("create" if write.create else "patch", "error").inc()
                _log.warning(
                    "event not recorded",
                    pod=f"{write.first.ref.namespace}/{write.first.ref.name}",
                    reason=write.first.reason,
                    error=str(exc),
                )
            else:
                self.folder.written(write, name, self._clock())
                self.metrics.writes.labels("create" if write.create else "patch", "ok").inc()

    async def _write(self, write: Write) -> str:
        occ = write.first
        path = events_path(occ.ref.namespace)
        if not write.create:
            patch = {"count": write.count, "lastTimestamp": rfc3339(write.last)}
            try:
                await self.kube.request(
                    "PATCH",
                    f"{path}/{write.name}",
                    body=patch,
                    content_type=MERGE_PATCH,
                    request_timeout=WRITE_TIMEOUT,
                )
                return write.name
            except NotFound:
                pass  # the Event expired (the API server's TTL): a new one carries the count
        body = event_body(
            occ.ref,
            occ.reason,
            occ.message,
            occ.type_,
            self.component,
            count=write.count,
            first=occ.at,
            last=write.last,
        )
        await self.kube.request("POST", path, body=body, request_timeout=WRITE_TIMEOUT)
        return str(body["metadata"]["name"])
