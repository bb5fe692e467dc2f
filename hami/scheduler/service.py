"""The scheduler's behaviour: watch handlers, handshake pass, filter, bind and explain.

The cluster state (``hami.core.cluster``) is pure; this module adds the Kubernetes I/O
around it. Every call that touches the API goes through ``self.kube``
(``hami.kube.client.Kube``); time comes from the injected ``now`` and
``monotonic`` so timing is testable without sleeping.

Concurrency: the event loop runs one coroutine at a time, and a decision plus its
reservation happen without an ``await`` in between, so concurrent filter calls always see
each other's reservations.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hami import log
from hami.config import SchedulerConfig
from hami.core import nofit
from hami.core.cluster import Cluster, Decision, PodRecord
from hami.core.quota import QuotaStatus
from hami.core.requests import DeviceKind, PodRequest, RequestError, parse_pod
from hami.kube.client import Kube
from hami.kube.nodelock import (
    OWN_LOCK,
    LockRules,
    held_longer_than,
    judge_holder,
    judge_value,
)
from hami.kube.objects import annotations_of, metadata_of, pod_key
from hami.kube.raw import Conflict, KubeError, NotFound
from hami.kube.recorder import EventRecorder
from hami.protocol import NodeLock, encode_pod_devices, keys, parse_lock
from hami.scheduler.bindqueue import BindQueue, QueueTimeout
from hami.scheduler.metrics import SchedulerMetrics

_log = log.get(__name__)

Json = dict[str, Any]
_CODE = re.compile(r"^\d+/\d+ (\S+)$")
# A bind waiting for a node lock reads the Node itself when the watch said nothing for
# this long (a watch that fell behind must not stall binds until their deadline).
LOCK_POLL_SECONDS = 2.0


def utcnow() -> datetime:
    return datetime.now(UTC)


def lower_keys(value: Any) -> Any:
    """Extender JSON field names are matched case-insensitively (top level only)."""
    if isinstance(value, Mapping):
        return {str(k).lower(): v for k, v in value.items()}
    return {}


def reason_codes(reason: str) -> list[str]:
    """``"2/4 CardInsufficientMemory, 2/4 CardTypeMismatch"`` -> the two codes."""
    codes: list[str] = []
    for part in reason.split(", "):
        match = _CODE.match(part.strip())
        codes.append(match.group(1) if match else part.split(":", 1)[0].strip() or "unknown")
    return codes


def summarise_failures(failed: Mapping[str, str]) -> str:
    """``0/3 nodes are available: 2 handshake timed out, 1 2/4 CardInsufficientMemory``."""
    return nofit.summary_message(Counter(failed.values()))


STANDBY = (
    "hami scheduler replica is on standby (another replica leads); kube-scheduler retries the pod"
)


class BindError(Exception):
    """A bind step failed; the message is what kube-scheduler and the Event show."""


@dataclass
class Clock:
    """Time sources, replaceable in tests."""

    now: Callable[[], datetime] = utcnow
    monotonic: Callable[[], float] = time.monotonic


class Scheduler:
    def __init__(
        self,
        settings: SchedulerConfig,
        kinds: Sequence[DeviceKind],
        kube: Kube | None,
        *,
        clock: Clock | None = None,
        emit_events: bool = True,
    ) -> None:
        self.settings = settings
        self.kinds = list(kinds)
        self.kube = kube  # None: no API server (a filter-only or unit-test scheduler)
        self.clock = clock or Clock()
        self.emit_events = emit_events
        self.cluster = Cluster(
            self.kinds,
            handshake_timeout=timedelta(seconds=settings.handshake_timeout.seconds),
            node_policy=settings.node_policy,
            device_policy=settings.device_policy,
            decision_timeout=timedelta(seconds=settings.decision_timeout.seconds),
        )
        self.metrics = SchedulerMetrics(self.cluster)
        self.lock_rules = LockRules(
            timeout=timedelta(seconds=settings.node_lock_timeout.seconds),
            allocation_timeout=timedelta(seconds=settings.allocation_timeout.seconds),
        )
        # A node lock held this long is suspect: filter tries such nodes last.
        self.lock_busy_after = timedelta(
            seconds=min(settings.bind_lock_wait.seconds, settings.allocation_timeout.seconds) / 2
        )
        self._node_locks: dict[str, NodeLock] = {}  # node -> its parsed hami.io/mutex.lock
        self.nodes_synced = asyncio.Event()
        self.pods_synced = asyncio.Event()
        self.bind_queue = BindQueue()  # binds wait their turn per node
        self._binding: set[str] = set()  # pods being bound now: their reservation stays
        # node -> (resourceVersion, lock value) of our latest lock write not yet seen by the
        # Node watch: until it is, the watch's copy of the node is older than that write
        self._lock_writes: dict[str, tuple[str, str]] = {}
        self._node_errors: dict[str, tuple[str, ...]] = {}
        self._pod_errors: dict[str, tuple[str, ...]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._handshake_announced = False
        self._warned: set[tuple[str, str]] = set()  # (pod uid, message) already reported

    @property
    def ready(self) -> bool:
        return self.nodes_synced.is_set() and self.pods_synced.is_set()

    # ------------------------------------------------------------------ watches

    def on_node(self, kind: str, obj: Json) -> None:
        name = str(metadata_of(obj).get("name") or "")
        if kind == "DELETED":
            self.cluster.delete_node(name)
            self._node_errors.pop(name, None)
            self._node_locks.pop(name, None)
            self._lock_writes.pop(name, None)
            self.bind_queue.changed(name)
            return
        previous = self.cluster.nodes.get(name)
        old_lock = previous.lock if previous is not None else None
        errors, changes = self.cluster.upsert_node(obj, self.clock.now())
        state = self.cluster.nodes.get(name)
        current_errors = tuple(
            f"{keys.node_register(word)}: {t.error}"
            for word, t in (state.types.items() if state else ())
            if t.error
        )
        if current_errors != self._node_errors.get(name, ()):
            for error in errors:
                _log.error("node register value rejected", node=name, error=error)
                self.metrics.annotation_errors.labels("node").inc()
            self._node_errors[name] = current_errors
        self._log_changes(changes)
        written = self._lock_writes.get(name)
        if (
            written is not None
            and state is not None
            and (state.resource_version == written[0] or state.lock == written[1])
        ):
            del self._lock_writes[name]  # the watch caught up with our lock write
        if state is not None and state.lock != old_lock:
            lock = parse_lock(state.lock)
            if lock is None:
                self._node_locks.pop(name, None)
            else:
                self._node_locks[name] = lock
            self.bind_queue.changed(name)  # wakes the one bind whose turn it is, if any

    def on_pod(self, kind: str, obj: Json) -> None:
        key = pod_key(obj)
        if (
            key not in self.cluster.pods
            and key not in self.cluster.lapsed
            and key not in self._pod_errors
            and keys.VGPU_NODE not in annotations_of(obj)
        ):
            # Holds nothing, held nothing: most pod events (other pods' status changes)
            # stop here in O(1), without decoding anything.
            return
        if kind == "DELETED":
            self.cluster.delete_pod(key)
            self._pod_errors.pop(key, None)
            return
        errors = tuple(self.cluster.upsert_pod(obj, self.clock.now()))
        if errors != self._pod_errors.get(key, ()):
            for error in errors:
                _log.error("pod device annotation rejected", pod=key, error=error)
                self.metrics.annotation_errors.labels("pod").inc()
            if errors:
                self._pod_errors[key] = errors
            else:
                self._pod_errors.pop(key, None)

    def on_quota(self, kind: str, obj: Json) -> None:
        """A ResourceQuota event: its ``limits.`` keys of device memory and cores."""
        meta = metadata_of(obj)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if kind == "DELETED":
            self.cluster.quotas.delete(namespace, name)
            return
        for error in self.cluster.quotas.upsert(obj):
            _log.error("resource quota value ignored", quota=f"{namespace}/{name}", error=error)

    def _log_changes(self, changes: Sequence[Any]) -> None:
        for change in changes:
            self.metrics.availability_changes.labels(
                change.type_word, "true" if change.available else "false"
            ).inc()
            if change.available:
                _log.info("device type available", node=change.node, type=change.type_word)
            else:
                _log.warning(
                    "device type unavailable",
                    node=change.node,
                    type=change.type_word,
                    reason=change.reason,
                )

    @property
    def _kube(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("this scheduler was made without an API client")
        return self.kube

    # ------------------------------------------------------------------ handshake

    # Set by hami.scheduler.leader: whether this replica holds the Lease now (checked
    # against the renew deadline on every call). None: a sole replica, always leading.
    lead_check: Callable[[], bool] | None = None

    @property
    def leading(self) -> bool:
        """False on a standby replica: it writes nothing, and its extender answers with an
        error so that kube-scheduler retries."""
        return self.lead_check is None or self.lead_check()

    async def handshake_pass(self) -> None:
        """One pass of protocol.md section 2 over every known node."""
        if not self.leading:
            return
        self.expire_reservations()
        now = self.clock.now()
        for key in self.cluster.expire_decisions(now):
            _log.info(
                "decision lapsed: not bound in time, its devices are free again",
                pod=key,
                timeout=self.settings.decision_timeout.seconds,
            )
        writes, changes = self.cluster.refresh(now)
        self._log_changes(changes)
        if not self._handshake_announced:
            _log.info(
                "handshake running",
                period=self.settings.handshake_period.seconds,
                timeout=self.settings.handshake_timeout.seconds,
                nodes=len(self.cluster.nodes),
            )
            self._handshake_announced = True
        if not writes:
            return
        limit = asyncio.Semaphore(16)

        async def write(node: str, annotations: Mapping[str, str], version: str) -> None:
            async with limit:
                try:
                    await self._kube.patch_node_annotations(
                        node, annotations, resource_version=version or None
                    )
                except Conflict:
                    # The node changed since we read it: decide again on the next pass.
                    self.metrics.handshake_patches.labels("conflict").inc()
                except KubeError as exc:
                    self.metrics.handshake_patches.labels("error").inc()
                    _log.warning("handshake patch failed", node=node, error=str(exc))
                else:
                    self.metrics.handshake_patches.labels("ok").inc()

        await asyncio.gather(*(write(w.node, w.annotations, w.resource_version) for w in writes))

    async def handshake_loop(
        self, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    ) -> None:
        await self.nodes_synced.wait()
        while True:
            try:
                await self.handshake_pass()
            except Exception:  # never let one bad pass stop the heartbeat
                _log.exception("handshake pass failed")
            try:
                await self.release_stale_locks()
            except Exception:
                _log.exception("node lock sweep failed")
            await sleep(self.settings.handshake_period.seconds)

    def expire_reservations(self, *, full: bool = True) -> list[str]:
        """Free the devices of filter decisions whose bind never came within
        ``scheduler.reservation_timeout`` (kube-scheduler dropped the pod after filter);
        ``full=False`` looks at the oldest only (every filter call does that)."""
        timeout = self.settings.reservation_timeout.seconds
        expired = self.cluster.expire_reservations(
            self.clock.monotonic(), timeout, self._binding, full=full
        )
        for key in expired:
            _log.info(
                "reservation expired: no bind came, its devices are free again",
                pod=key,
                timeout=timeout,
            )
        return expired

    # ------------------------------------------------------------------ lock sweep

    async def release_stale_locks(self) -> None:
        """Remove node locks nobody else will: their pod is gone, finished, went elsewhere or
        lost its Allocate (``hami.kube.nodelock``). Binds take such locks over anyway; this
        frees a node no bind is waiting for, so no lock outlives its pod. Only locks held
        longer than a healthy allocation takes are looked at."""
        if not self.leading:
            return
        now = self.clock.now()
        for node, lock in list(self._node_locks.items()):
            if held_longer_than(lock, now, self.lock_rules, self.lock_busy_after, ""):
                await self._release_if_stale(node)

    async def _release_if_stale(self, node: str) -> None:
        try:
            current = await self._kube.get_node(node)
        except KubeError:
            return
        value = annotations_of(current).get(keys.NODE_LOCK)
        now = self.clock.now()
        view = judge_value(value, now, self.lock_rules)
        if not view.needs_pod or view.lock is None:
            return  # free, or stale by its value alone: the next bind takes it over
        lock = view.lock
        try:
            holder: Json | None = await self._kube.get_pod(lock.namespace, lock.pod)
        except NotFound:
            holder = None
        except KubeError:
            return
        verdict = judge_holder(lock, holder, node, now, self.lock_rules)
        if not verdict.stale:
            return
        if verdict.fail_holder and not await self._fail_stalled_holder(
            holder or {}, node, verdict.reason
        ):
            return
        version = str(metadata_of(current).get("resourceVersion") or "") or None
        try:
            await self._kube.patch_node_annotations(
                node, {keys.NODE_LOCK: None}, resource_version=version
            )
        except KubeError:
            return  # changed meanwhile (a bind took it): judged again next pass
        _log.info("stale node lock released", node=node, lock=value, reason=verdict.reason)

    # ------------------------------------------------------------------ filter

    def parse(self, pod: Mapping[str, Any]) -> PodRequest | None:
        return parse_pod(pod, self.kinds)

    async def filter(self, body: Any) -> Json:
        """kube-scheduler's ``ExtenderArgs`` -> ``ExtenderFilterResult`` (always a dict)."""
        if not self.leading:
            return {"NodeNames": [], "FailedNodes": {}, "Error": STANDBY}
        started = self.clock.monotonic()
        outcome = "error"
        try:
            result, outcome = await self._filter(lower_keys(body))
            return result
        except Exception as exc:  # answer with the error, never with a 500
            _log.exception("filter failed")
            return {"NodeNames": [], "FailedNodes": {}, "Error": f"hami filter: {exc!r}"}
        finally:
            self.metrics.filter_total.labels(outcome).inc()
            self.metrics.filter_seconds.labels(outcome).observe(self.clock.monotonic() - started)

    async def _filter(self, args: Mapping[str, Any]) -> tuple[Json, str]:
        pod = args.get("pod")
        if not isinstance(pod, Mapping):
            return {"NodeNames": [], "FailedNodes": {}, "Error": "hami filter: no Pod"}, "error"
        names = _node_names(args)
        key = pod_key(pod)
        try:
            request = self.parse(pod)
        except RequestError as exc:
            return {"NodeNames": [], "FailedNodes": {}, "Error": str(exc)}, "error"
        if request is None:
            return _with_nodes(
                args, {"NodeNames": names, "FailedNodes": {}, "Error": ""}, names
            ), "passthrough"
        self._warn_once(pod, request.warnings)
        self.expire_reservations(full=False)
        began = time.perf_counter()
        # kube-scheduler filters only unbound pods, so a record this pod already has is an
        # earlier decision that was never bound (a failed bind, or our restart in between):
        # the pod must not compete with its own stale hold, or on a full cluster it never
        # fits again. No await until the hold is settled, so no other call sees the gap.
        earlier = self.cluster.pods.get(key)
        if earlier is not None:
            self.cluster.release(key)
        decision = self._decide(request, names, key)
        fit = decision.fit
        if decision.node is None or fit is None:
            self.cluster.rollback(key, earlier)
            self.metrics.decision_seconds.observe(time.perf_counter() - began)
            # counted once per no-fit answer, which the cluster reuses while nothing changes
            counts = self.cluster.no_fit.reason_counts(decision.failed)
            for reason, nodes in counts.items():
                for code in reason_codes(reason):
                    self.metrics.node_rejections.labels(code).inc(nodes)
            message = nofit.summary_message(counts)
            _log.debug("no node fits", pod=key, summary=message)
            self._event(pod, "FilteringFailed", message, "Warning")
            return {"NodeNames": [], "FailedNodes": decision.failed, "Error": ""}, "unschedulable"
        # Held in memory only: bind writes the decision with bind-time and bind-phase in
        # one pod write (filter does no API I/O; kube-scheduler calls it one pod at a time).
        meta = metadata_of(pod)
        uid = str(meta.get("uid") or "")
        annotations = self._decision_annotations(pod, decision.node, fit.assignment)
        self.cluster.reserve(
            key,
            uid,
            decision.node,
            fit,
            at=self.clock.monotonic(),
            decision=annotations,
            pod_version=str(meta.get("resourceVersion") or "") or None,
        )
        self.metrics.decision_seconds.observe(time.perf_counter() - began)
        devices = "; ".join(
            f"{word}: {encode_pod_devices(per)}" for word, per in fit.assignment.items()
        )
        _log.debug("pod placed", pod=key, node=decision.node, devices=devices)
        self._event(pod, "FilteringSucceed", f"node {decision.node} chosen, devices {devices}")
        answer = {"NodeNames": [decision.node], "FailedNodes": {}, "Error": ""}
        return _with_nodes(args, answer, [decision.node]), "scheduled"

    def _decide(self, request: PodRequest, names: list[str], key: str) -> Decision:
        """The cluster's decision, trying nodes whose lock is held suspiciously long last:
        their holder may have lost its Allocate, and binds there would wait and fail."""
        now = self.clock.now()
        namespace = key.partition("/")[0]
        # Only the nodes with a lock are looked at (few), not every candidate.
        busy = {
            name
            for name, lock in self._node_locks.items()
            if held_longer_than(lock, now, self.lock_rules, self.lock_busy_after, key)
        }
        if busy:
            busy.intersection_update(names)
        if busy:
            decision = self.cluster.decide(
                request, [n for n in names if n not in busy], namespace=namespace
            )
            if decision.node is not None:
                return decision
        return self.cluster.decide(request, names, namespace=namespace)

    def _decision_annotations(
        self, pod: Mapping[str, Any], node: str, assignment: Mapping[str, Any]
    ) -> dict[str, str | None]:
        existing = annotations_of(pod)
        annotations: dict[str, str | None] = {
            keys.VGPU_NODE: node,
            keys.VGPU_TIME: str(int(self.clock.now().timestamp())),
        }
        for kind in self.kinds:
            per_container = assignment.get(kind.type_word)
            if per_container is not None:
                value = encode_pod_devices(per_container)
                annotations[kind.allocated_key] = value
                annotations[kind.to_allocate_key] = value
            else:
                # A decision made before (a retried pod) may have used this type.
                for stale in (kind.allocated_key, kind.to_allocate_key):
                    if stale in existing:
                        annotations[stale] = None
        for stale in (keys.BIND_PHASE, keys.BIND_TIME):
            if stale in existing:
                annotations[stale] = None
        return annotations

    # ------------------------------------------------------------------ bind

    async def bind(self, body: Any) -> Json:
        """``ExtenderBindingArgs`` -> ``ExtenderBindingResult`` (``{"Error": ...}``)."""
        if not self.leading:
            return {"Error": STANDBY}
        started = self.clock.monotonic()
        args = lower_keys(body)
        namespace = str(args.get("podnamespace") or "default")
        name = str(args.get("podname") or "")
        uid = str(args.get("poduid") or "") or None
        node = str(args.get("node") or "")
        key = f"{namespace}/{name}"
        outcome, reason = "failed", "error"
        try:
            if not name or not node:
                raise BindError("hami bind: PodName and Node are required")
            await self._bind(namespace, name, uid, node)
            outcome, reason = "success", "bound"
            self._event_ref(namespace, name, uid, "BindingSucceed", f"bound to node {node}")
            return {"Error": ""}
        except BindError as exc:
            reason = _bind_reason(str(exc))
            _log.warning("bind failed", pod=key, node=node, error=str(exc))
            self._event_ref(namespace, name, uid, "BindingFailed", str(exc), "Warning")
            return {"Error": str(exc)}
        except Exception as exc:
            _log.exception("bind failed", pod=key, node=node)
            self._event_ref(namespace, name, uid, "BindingFailed", repr(exc), "Warning")
            return {"Error": f"hami bind: {exc!r}"}
        finally:
            self.metrics.bind_total.labels(outcome, reason).inc()
            self.metrics.bind_seconds.labels(outcome).observe(self.clock.monotonic() - started)

    async def _bind(self, namespace: str, name: str, uid: str | None, node: str) -> None:
        key = f"{namespace}/{name}"
        record = self.cluster.pods.get(key)
        if record is None and key not in self.cluster.lapsed:
            record = await self._unplaced(namespace, name, uid, node)
            if record is None:
                return  # not a pod hami places: bound without the lock
        if record is None:
            raise BindError(
                f"hami bind: the decision for pod {key} is older than "
                f"scheduler.decision_timeout ({self.settings.decision_timeout.seconds:g}s) and "
                "no longer holds its devices; the pod will be scheduled again"
            )
        if record.node != node:
            raise BindError(
                f"hami bind: pod {key} was placed on node {record.node} by filter, not {node}"
            )
        wait = self.settings.bind_lock_wait.seconds
        deadline = self.clock.monotonic() + wait
        self._binding.add(key)  # its reservation must not expire while it waits
        written: str | None = None  # the pod's resourceVersion after our write
        try:
            # One bind per node at a time; its turn ends with the Binding (the next one
            # then waits for the node agent to release the lock after Allocate).
            async with self.bind_queue.turn(node, wait):
                try:
                    await self._take_lock(node, namespace, name, deadline)
                    answer = await self._write_bind(namespace, name, uid, record)
                    written = str(metadata_of(answer).get("resourceVersion") or "") or None
                    await self._create_binding(namespace, name, uid, node)
                except BaseException as exc:
                    await self._undo_bind(namespace, name, node, record, written)
                    if isinstance(exc, KubeError):
                        raise BindError(f"hami bind: pod {key} on node {node}: {exc}") from exc
                    raise
        except QueueTimeout as exc:
            await self._undo_bind(namespace, name, node, record, None)
            raise BindError(
                f"hami bind: node {node} is busy: {exc.ahead} bind(s) queued before pod {key} "
                f"did not finish within scheduler.bind_lock_wait ({wait:g}s); each waits for "
                "the node agent to release the node lock after the previous pod's allocation"
            ) from None
        finally:
            self._binding.discard(key)

    async def _unplaced(
        self, namespace: str, name: str, uid: str | None, node: str
    ) -> PodRecord | None:
        """A bind with no record in memory (rare: a restart between filter and bind, or an
        expired reservation). The pod is read once: one that asks for no device hami manages
        is bound here without the lock (None); one with a decision written before counts
        as usual; a device pod without one fails, since nothing was reserved for it."""
        key = f"{namespace}/{name}"
        try:
            pod = await self._kube.get_pod(namespace, name)
        except KubeError as exc:
            raise BindError(f"hami bind: reading pod {key} failed: {exc}") from exc
        try:
            request = self.parse(pod)
        except RequestError as exc:
            raise BindError(f"hami bind: pod {key}: {exc}") from exc
        if request is None:
            await self._create_binding(namespace, name, uid, node)
            return None
        self.cluster.upsert_pod(pod, self.clock.now())  # the watch may not have shown it yet
        record = self.cluster.pods.get(key)
        if record is None or record.reserved:
            raise BindError(
                f"hami bind: no reservation for pod {key}: the scheduler restarted or the "
                "reservation expired after scheduler.reservation_timeout "
                f"({self.settings.reservation_timeout.seconds:g}s); kube-scheduler will "
                "schedule it again"
            )
        return record

    async def _write_bind(
        self, namespace: str, name: str, uid: str | None, record: PodRecord
    ) -> Json:
        """The bind's pod write, only on a pod that is not bound yet: a pod bound meanwhile
        (a Binding whose answer was lost in an API outage went through after all) may
        already run with the decision it had, and overwriting it would hand its devices
        out twice. The write is guarded by the resourceVersion filter saw; after a
        Conflict the pod is read, and written at its new version only while unbound."""
        key = f"{namespace}/{name}"
        patch = self._bind_annotations(record)
        version = record.pod_version
        for _ in range(3):
            if version is None:
                try:
                    pod = await self._kube.get_pod(namespace, name)
                except KubeError as exc:
                    raise BindError(f"hami bind: reading pod {key} failed: {exc}") from exc
                bound = str((pod.get("spec") or {}).get("nodeName") or "")
                current_uid = str(metadata_of(pod).get("uid") or "")
                if bound:
                    raise BindError(
                        f"hami bind: pod {key} is already bound to node {bound}; its decision "
                        "is left as it is"
                    )
                if uid and current_uid and current_uid != uid:
                    raise BindError(f"hami bind: pod {key} was replaced (uid {current_uid})")
                version = str(metadata_of(pod).get("resourceVersion") or "") or None
                if version is None:
                    raise BindError(f"hami bind: pod {key} has no resourceVersion")
            try:
                return await self._kube.patch_pod_annotations(
                    namespace, name, patch, resource_version=version
                )
            except Conflict:
                version = None  # changed since filter saw it: read it and look again
        raise BindError(f"hami bind: pod {key} kept changing; its decision was not written")

    def _bind_annotations(self, record: PodRecord) -> dict[str, str | None]:
        """The one pod write of a bind: the decision (unless written before), bind-time and
        bind-phase allocating (protocol.md section 3), before the Binding."""
        now = str(int(self.clock.now().timestamp()))
        patch: dict[str, str | None] = {}
        if record.decision is not None:
            patch.update(record.decision)
            patch[keys.VGPU_TIME] = now  # the decision's deadline runs from its write
        patch[keys.BIND_TIME] = now
        patch[keys.BIND_PHASE] = str(keys.BindPhase.ALLOCATING)
        return patch

    async def _create_binding(self, namespace: str, name: str, uid: str | None, node: str) -> None:
        try:
            await self._kube.bind_pod(namespace, name, uid, node)
        except KubeError as exc:
            raise BindError(
                f"hami bind: creating the Binding of {namespace}/{name} failed: {exc}"
            ) from exc

    async def _undo_bind(
        self, namespace: str, name: str, node: str, record: PodRecord, written: str | None
    ) -> None:
        """Mark the pod failed, release our lock and drop its reservation (best effort).

        The pod is marked ``bind-phase: failed`` only when this bind wrote it (``written``:
        the resourceVersion our write left), and only if nothing changed it since: a
        Binding that went through although its answer was lost, or a later bind of the
        same pod (kube-scheduler retries while a slow undo still waits for the API
        server), must not be failed by it; the lock then stays too (the node agent
        releases it after that pod's Allocate, or the lock rules take it over). Before our
        write the pod holds nothing of ours.
        """
        key = f"{namespace}/{name}"
        changed = False  # the pod changed since our write
        if written is not None:
            try:
                await self._kube.patch_pod_annotations(
                    namespace,
                    name,
                    {keys.BIND_PHASE: str(keys.BindPhase.FAILED)},
                    resource_version=written,
                )
            except Conflict:
                _log.info("pod changed since this bind wrote it: left as it is", pod=key)
                changed = True
            except KubeError as exc:
                _log.info("pod not marked failed", pod=key, reason=str(exc))
        if not changed:
            with contextlib.suppress(KubeError):
                current = await self._kube.get_node(node)
                meta = metadata_of(current)
                lock = parse_lock(annotations_of(current).get(keys.NODE_LOCK))
                if lock is not None and (lock.namespace, lock.pod) == (namespace, name):
                    await self._kube.patch_node_annotations(
                        node,
                        {keys.NODE_LOCK: None},
                        resource_version=str(meta.get("resourceVersion") or "") or None,
                    )
        if self.cluster.pods.get(key) == record:
            self.cluster.release(key)

    async def _take_lock(self, node: str, namespace: str, name: str, deadline: float) -> None:
        """Set ``hami.io/mutex.lock`` for this pod; the caller has the node's turn
        (``bind_queue``). A conditional write at the resourceVersion the Node watch last
        showed; the Node is read only after a Conflict, when the watch has not yet shown
        our previous lock write, or when it said nothing for ``LOCK_POLL_SECONDS``. While
        another pod holds the lock, wait (until ``deadline``) for the watch to show a
        change: each change wakes this bind alone."""
        wait = self.settings.bind_lock_wait.seconds
        read: Json | None = None  # the Node as just read: newer than the watch's copy
        while True:
            mark = self.bind_queue.generation(node)
            state = self.cluster.nodes.get(node)
            if read is None and (state is None or not state.exists):
                read = await self._read_node(node)
            if read is not None:
                value = annotations_of(read).get(keys.NODE_LOCK)
                version = str(metadata_of(read).get("resourceVersion") or "")
                read = None
            elif node in self._lock_writes:
                # The watch's copy predates our last lock write here: wait for it to catch
                # up (it then shows that lock, held until the node agent's release).
                remaining = max(deadline - self.clock.monotonic(), 0.0)
                if not await self.bind_queue.wait_change(
                    node, mark, min(remaining, LOCK_POLL_SECONDS)
                ):
                    read = await self._read_node(node)
                continue
            else:
                assert state is not None
                value, version = state.lock, state.resource_version
            holder = await self._live_holder(value, node, namespace, name)
            if holder is not None:
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    raise BindError(
                        f"hami bind: node {node} is locked by {_holder_words(holder)} "
                        f"(since {holder.time:%Y-%m-%dT%H:%M:%SZ}) and it was not released "
                        f"within {wait:g}s; the node agent releases it after the pod's "
                        "allocation"
                    )
                if not await self.bind_queue.wait_change(
                    node, mark, min(remaining, LOCK_POLL_SECONDS)
                ):
                    read = await self._read_node(node)  # the watch said nothing: look
                continue
            lock = NodeLock(self.clock.now(), namespace, name).encode()
            try:
                written = await self._kube.patch_node_annotations(
                    node, {keys.NODE_LOCK: lock}, resource_version=version or None
                )
            except Conflict:
                if self.clock.monotonic() > deadline:
                    raise BindError(
                        f"hami bind: node {node} kept changing; lock not taken"
                    ) from None
                read = await self._read_node(node)
                continue
            except KubeError as exc:
                raise BindError(f"hami bind: locking node {node} failed: {exc}") from exc
            version = str(metadata_of(written).get("resourceVersion") or "")
            seen = self.cluster.nodes.get(node)
            if seen is None or (seen.resource_version != version and seen.lock != lock):
                self._lock_writes[node] = (version, lock)  # the watch has not shown it yet
            return

    async def _read_node(self, node: str) -> Json:
        try:
            current = await self._kube.get_node(node)
        except KubeError as exc:
            raise BindError(f"hami bind: reading node {node} failed: {exc}") from exc
        self._lock_writes.pop(node, None)  # what we read is newer than our last write
        return current

    async def _live_holder(
        self, value: str | None, node: str, namespace: str, name: str
    ) -> NodeLock | None:
        """The lock's holder if it blocks us; None when free, ours or stale (one rule:
        ``hami.kube.nodelock``). A holder that lost its Allocate is failed first."""
        now = self.clock.now()
        view = judge_value(value, now, self.lock_rules, me=f"{namespace}/{name}")
        if view.free:
            if view.reason and view.reason != OWN_LOCK:
                _log.info("taking over a node lock", node=node, lock=value, reason=view.reason)
            return None
        lock = view.lock
        assert lock is not None
        if not view.needs_pod:
            return lock  # the legacy owner-less form: held until the lock timeout
        try:
            holder: Json | None = await self._kube.get_pod(lock.namespace, lock.pod)
        except NotFound:
            holder = None
        except KubeError:
            return lock  # cannot tell: treat as held
        verdict = judge_holder(lock, holder, node, now, self.lock_rules)
        if not verdict.stale:
            return lock
        failed = holder is not None and verdict.fail_holder
        if failed and not await self._fail_stalled_holder(holder or {}, node, verdict.reason):
            return lock  # it changed meanwhile (or the write failed): judge again
        # A scheduler that died between locking and binding, or a pod whose Allocate was
        # lost, leaves such a lock; waiting the full lock timeout would stall the node.
        _log.info("taking over a node lock", node=node, lock=value, reason=verdict.reason)
        return None

    async def _fail_stalled_holder(self, holder: Json, node: str, reason: str) -> bool:
        """Mark a lock holder that lost its Allocate ``bind-phase: failed`` (guarded by its
        resourceVersion: a pod that progressed meanwhile is left alone); True when done."""
        meta = metadata_of(holder)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        try:
            await self._kube.patch_pod_annotations(
                namespace,
                name,
                {keys.BIND_PHASE: str(keys.BindPhase.FAILED)},
                resource_version=str(meta.get("resourceVersion") or "") or None,
            )
        except KubeError as exc:
            _log.info("stalled lock holder not failed", pod=f"{namespace}/{name}", error=str(exc))
            return False
        message = (
            f"pod {namespace}/{name} was bound to node {node} but {reason}; marked "
            f"{keys.BIND_PHASE}=failed and its node lock taken over so the node can take other "
            "pods (kubelet never called Allocate for it). Delete and recreate the pod"
        )
        _log.warning("lock holder failed", pod=f"{namespace}/{name}", node=node, reason=reason)
        uid = str(meta.get("uid") or "") or None
        self._event_ref(namespace, name, uid, "AllocationTimedOut", message, "Warning")
        return True

    # ------------------------------------------------------------------ explain

    async def explain(self, namespace: str, name: str) -> Json:
        """Why each node would (not) take a pod, from the current state."""
        pod = await self._kube.get_pod(namespace, name)
        answer = self.explain_pod(pod)
        nodes: dict[str, str] = answer.get("nodes") or {}
        if _waits_outside_hami(pod, nodes):
            # hami's devices fit: kube-scheduler's own reason is the one that matters
            answer["scheduler_message"] = await self._failed_scheduling(pod)
        return answer

    async def _failed_scheduling(self, pod: Mapping[str, Any]) -> str:
        """kube-scheduler's latest FailedScheduling message for the pod ("" if none)."""
        meta = metadata_of(pod)
        namespace = str(meta.get("namespace") or "")
        selector = f"involvedObject.uid={meta.get('uid', '')},reason=FailedScheduling"
        try:
            found, _ = await self._kube.list_all(
                f"/api/v1/namespaces/{namespace}/events", query=(("fieldSelector", selector),)
            )
        except KubeError as exc:  # the node reasons stand on their own
            _log.warning("events not read", pod=pod_key(pod), error=str(exc))
            return ""
        latest = max(found, key=_event_time, default=None)
        return str(latest.get("message") or "") if isinstance(latest, Mapping) else ""

    def explain_pod(self, pod: Mapping[str, Any]) -> Json:
        key = pod_key(pod)
        try:
            request = self.parse(pod)
        except RequestError as exc:
            return {"pod": key, "error": str(exc), "nodes": {}}
        if request is None:
            return {"pod": key, "error": "the pod asks for no device hami manages", "nodes": {}}
        namespace = key.partition("/")[0]
        # a placed pod's own hold is not held against it: explain as if it were not there yet
        # (synchronous, so no filter runs in between)
        own = self.cluster.pods.get(key)
        if own is not None:
            self.cluster.release(key)
        try:
            reasons = self.cluster.explain(request, sorted(self.cluster.nodes), namespace=namespace)
        finally:
            if own is not None:
                self.cluster.rollback(key, own)
        # a reservation (filter chose, bind not yet written) is assigned too
        assigned = annotations_of(pod).get(keys.VGPU_NODE) or (own.node if own else "")
        return {
            "pod": key,
            "error": "",
            "assigned": assigned,
            "nodes": {node: reason or "fits" for node, reason in reasons.items()},
            "quota": quota_view(self.cluster.quotas.status(namespace)),
        }

    # ------------------------------------------------------------------ events

    def _warn_once(self, pod: Mapping[str, Any], warnings: Sequence[str]) -> None:
        """A policy or weights annotation that fell back to the default: one warning Event
        per pod and message (kube-scheduler calls filter again on every retry)."""
        if not warnings:
            return
        uid = str(metadata_of(pod).get("uid") or pod_key(pod))
        for message in warnings:
            if (uid, message) in self._warned:
                continue
            if len(self._warned) >= 4096:  # bounded: a forgotten pod costs no memory
                self._warned.clear()
            self._warned.add((uid, message))
            _log.info("pod annotation not understood", pod=pod_key(pod), warning=message)
            self._event(pod, "PolicyIgnored", message, "Warning")

    _recorder: EventRecorder | None = None

    def event_recorder(self) -> EventRecorder | None:
        """The one Event sender (folds repeats, rate-limits per pod); the role runs its
        task. None when this scheduler emits no Events."""
        if not self.emit_events or self.kube is None:
            return None
        if self._recorder is None:
            self._recorder = EventRecorder(self.kube, registry=self.metrics.registry)
        return self._recorder

    def _event(
        self, pod: Mapping[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None:
        """Queue an Event: O(1), no I/O on the caller's path (``hami.kube.recorder``)."""
        recorder = self.event_recorder()
        if recorder is not None:
            recorder.record(pod, reason, message, type_)

    def _event_ref(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        reason: str,
        message: str,
        type_: str = "Normal",
    ) -> None:
        ref = {"metadata": {"namespace": namespace, "name": name, "uid": uid}}
        self._event(ref, reason, message, type_)

    async def drain(self) -> None:
        """Write pending Events now, folded counts included (shutdown, tests)."""
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        if self._recorder is not None:
            await self._recorder.flush()


def quota_view(rows: Sequence[QuotaStatus]) -> Json:
    """Resource -> used/limit (in MiB or %) for explain; limit None: not limited."""
    return {
        row.resource.name: {
            "used": row.used,
            "limit": row.limit_scaled,
            "unit": row.resource.unit,
            "quota": row.quota,
        }
        for row in rows
    }


def _node_names(args: Mapping[str, Any]) -> list[str]:
    names = args.get("nodenames")
    if isinstance(names, list):
        return [str(n) for n in names]
    nodes = args.get("nodes")
    items = nodes.get("items") if isinstance(nodes, Mapping) else None
    if isinstance(items, list):
        return [str(metadata_of(i).get("name")) for i in items if isinstance(i, Mapping)]
    return []


def _with_nodes(args: Mapping[str, Any], answer: Json, chosen: Sequence[str]) -> Json:
    """With ``nodeCacheCapable: false`` kube-scheduler sends and reads full ``Nodes``."""
    nodes = args.get("nodes")
    if args.get("nodenames") is None and isinstance(nodes, Mapping):
        wanted = set(chosen)
        items = [
            item
            for item in nodes.get("items") or []
            if isinstance(item, Mapping) and metadata_of(item).get("name") in wanted
        ]
        answer["Nodes"] = {**nodes, "items": items}
    return answer


def _bind_reason(message: str) -> str:
    if "is locked by" in message or "is busy" in message:
        return "node_locked"  # waited for the node lock, held or queued for
    if "Binding" in message:
        return "binding"
    if "placed on node" in message:
        return "wrong_node"
    return "error"


def _holder_words(lock: NodeLock) -> str:
    if lock.owner is None:
        return "an older HAMi scheduler (a lock naming no pod)"
    return f"pod {lock.owner}"


def _waits_outside_hami(pod: Mapping[str, Any], nodes: Mapping[str, str]) -> bool:
    spec = pod.get("spec")
    status = pod.get("status")
    unbound = not (isinstance(spec, Mapping) and spec.get("nodeName"))
    pending = not isinstance(status, Mapping) or status.get("phase", "Pending") == "Pending"
    return unbound and pending and bool(nodes) and all(r == "fits" for r in nodes.values())


def _event_time(event: Any) -> str:
    """An Event's latest time as an RFC 3339 string (they sort as text)."""
    if not isinstance(event, Mapping):
        return ""
    series = event.get("series")
    last = series.get("lastObservedTime") if isinstance(series, Mapping) else None
    return str(last or event.get("lastTimestamp") or event.get("eventTime") or "")
