"""The scheduler role's state and its wiring: watch handlers, filter, and the rooms that
do the rest (``bind``: the bind path and its fence; ``handshake``: the leader's periodic
pass and the stale-lock sweep; ``explain``; ``locks``: node locks as this replica sees them).

The cluster state (``hami.core.cluster``) is pure; the I/O around it goes through
``self.kube`` (``hami.kube.client.Kube``); time comes from the injected ``Clock`` so timing
is testable without sleeping.

Concurrency: the event loop runs one coroutine at a time, and a decision plus its
reservation happen without an ``await`` in between, so concurrent filter calls always see
each other's reservations.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from hami import log
from hami.config import SchedulerConfig, cluster_metric_groups
from hami.core import nofit
from hami.core.cluster import Candidates, Cluster, Decision
from hami.core.defragpolicy import DEFRAG
from hami.core.noderesources import RoomLedger, pod_requests
from hami.core.requests import DeviceKind, PodRequest, RequestError, parse_pod
from hami.kube.client import Kube
from hami.kube.nodelock import LockRules
from hami.kube.objects import annotations_of, metadata_of, pod_key
from hami.kube.recorder import EventRecorder
from hami.protocol import encode_pod_devices, keys
from hami.protocol.mig import MigAllocation, encode_mig_allocations
from hami.scheduler.bind import STANDBY, Binder, BindError
from hami.scheduler.clock import Clock, utcnow
from hami.scheduler.explain import Explainer, quota_view
from hami.scheduler.handshake import Handshake, log_changes
from hami.scheduler.locks import NodeLocks
from hami.scheduler.metrics import SchedulerMetrics
from hami.scheduler.podevents import PodEvents

# A lock whose pod is still unbound this long after its bind window (scheduler.bind_lock_wait)
# cannot belong to a bind in flight: its binder sends no Binding past the window. The slack
# covers clock skew between replicas.
BIND_WINDOW_SLACK = timedelta(seconds=5)

__all__ = ["STANDBY", "BindError", "Clock", "Scheduler", "quota_view", "utcnow"]

_log = log.get(__name__)

Json = dict[str, Any]
_CODE = re.compile(r"^\d+/\d+ (\S+)(?: \(.*\))?$")  # a MIG code says more in ( )


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
        # Free CPU and memory per node, from the watches: only the defrag policy weighs them.
        self.rooms = RoomLedger() if settings.node_policy == DEFRAG else None
        self.metrics = SchedulerMetrics(
            self.cluster, cluster_metric_groups(settings.cluster_metrics)
        )
        self.lock_rules = LockRules(
            timeout=timedelta(seconds=settings.node_lock_timeout.seconds),
            allocation_timeout=timedelta(seconds=settings.allocation_timeout.seconds),
            bind_window=timedelta(seconds=settings.bind_lock_wait.seconds) + BIND_WINDOW_SLACK,
        )
        # A node lock held this long is suspect: filter tries such nodes last.
        busy_after = timedelta(
            seconds=min(settings.bind_lock_wait.seconds, settings.allocation_timeout.seconds) / 2
        )
        self.events = PodEvents(kube, self.metrics.registry, enabled=emit_events)
        self._event, self._event_ref = self.events.event, self.events.event_ref
        self.nodes_synced = asyncio.Event()
        self.pods_synced = asyncio.Event()
        self.locks = NodeLocks(
            self._api, self.lock_rules, self.clock, self._event_ref, busy_after=busy_after
        )
        self.binder = Binder(
            settings=settings,
            cluster=self.cluster,
            kube=self._api,
            clock=self.clock,
            locks=self.locks,
            metrics=self.metrics,
            parse=self.parse,
            event_ref=self._event_ref,
            leading=lambda: self.leading,
        )
        self.handshake = Handshake(
            settings=settings,
            cluster=self.cluster,
            kube=self._api,
            clock=self.clock,
            locks=self.locks,
            metrics=self.metrics,
            leading=lambda: self.leading,
            expire_reservations=self.expire_reservations,
        )
        self.explainer = Explainer(self.cluster, self._api, self.parse)
        self._node_errors: dict[str, tuple[str, ...]] = {}
        self._pod_errors: dict[str, tuple[str, ...]] = {}

    @property
    def ready(self) -> bool:
        return self.nodes_synced.is_set() and self.pods_synced.is_set()

    def _api(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("this scheduler was made without an API client")
        return self.kube

    # ------------------------------------------------------------------ watches

    def on_node(self, kind: str, obj: Json) -> None:
        name = str(metadata_of(obj).get("name") or "")
        if self.rooms is not None:
            if kind == "DELETED":
                self.rooms.drop_node(name)
            else:
                self._rooms_changed(self.rooms.set_node(name, obj))
        if kind == "DELETED":
            self.cluster.delete_node(name)
            self._node_errors.pop(name, None)
            self.locks.forget(name)
            self.binder.queue.changed(name)
            return
        previous = self.cluster.nodes.get(name)
        old_lock = previous.lock if previous is not None else None
        errors, changes = self.cluster.upsert_node(obj, self.clock.now())
        state = self.cluster.nodes.get(name)
        current_errors = tuple(
            f"{t.kind.register_annotation()}: {t.error}"
            for t in (state.types.values() if state else ())
            if t.error
        )
        if current_errors != self._node_errors.get(name, ()):
            for error in errors:
                _log.error("node register value rejected", node=name, error=error)
                self.metrics.annotation_errors.labels("node").inc()
            self._node_errors[name] = current_errors
        log_changes(self.metrics, changes)
        if state is not None and self.locks.node_seen(
            name, state.resource_version, old_lock, state.lock
        ):
            self.binder.queue.changed(name)  # wakes the one bind whose turn it is, if any

    def on_pod(self, kind: str, obj: Json) -> None:
        key = pod_key(obj)
        if self.rooms is not None:
            self._rooms_changed(
                self.rooms.delete_pod(key) if kind == "DELETED" else self.rooms.upsert_pod(key, obj)
            )
        if (
            key not in self.cluster.pods
            and key not in self.cluster.lapsed
            and key not in self._pod_errors
            and not self._names_devices(annotations_of(obj))
        ):
            # Holds nothing, held nothing: most pod events (other pods' status changes)
            # stop here in O(1), without decoding anything.
            return
        if kind == "DELETED":
            self.cluster.delete_pod(key)
            self._pod_errors.pop(key, None)
            self.binder.pod_event(kind, key, obj)
            return
        errors = tuple(self.cluster.upsert_pod(obj, self.clock.now()))
        self.binder.pod_event(kind, key, obj)
        if errors != self._pod_errors.get(key, ()):
            for error in errors:
                _log.error("pod device annotation rejected", pod=key, error=error)
                self.metrics.annotation_errors.labels("pod").inc()
                self._event(obj, "InvalidDeviceAnnotation", error, "Warning")
            if errors:
                self._pod_errors[key] = errors
            else:
                self._pod_errors.pop(key, None)

    def _rooms_changed(self, nodes: Iterable[str]) -> None:
        assert self.rooms is not None
        for name in nodes:
            free = self.rooms.free(name)
            if free is not None:
                self.cluster.set_node_room(name, *free)

    def _names_devices(self, annotations: Mapping[str, str]) -> bool:
        """A decision of some kind is on the pod (a bound pod may lack ``vgpu-node``)."""
        return keys.VGPU_NODE in annotations or any(
            kind.allocated_key in annotations for kind in self.kinds
        )

    def on_quota(self, kind: str, obj: Json) -> None:
        """A ResourceQuota event: its ``limits.`` keys of device memory and cores."""
        meta = metadata_of(obj)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if kind == "DELETED":
            self.cluster.quotas.delete(namespace, name)
            return
        for error in self.cluster.quotas.upsert(obj):
            _log.error("resource quota value ignored", quota=f"{namespace}/{name}", error=error)

    # ------------------------------------------------------------------ leadership

    # Set by hami.scheduler.leader: whether this replica holds the Lease now (checked
    # against the renew deadline on every call). None: a sole replica, always leading.
    lead_check: Callable[[], bool] | None = None

    @property
    def leading(self) -> bool:
        """False on a standby replica: it writes nothing, and its extender answers with an
        error so that kube-scheduler retries."""
        return self.lead_check is None or self.lead_check()

    def leadership_changed(self) -> None:
        """Called by the leader election on every change: a replica that stopped leading
        lets its waiting binds meet the bind fence at once."""
        if not self.leading:
            self.binder.stand_down()

    # ------------------------------------------------------------------ the rooms

    async def handshake_pass(self) -> None:
        await self.handshake.run_pass()

    async def handshake_loop(
        self, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    ) -> None:
        await self.handshake.loop(self.nodes_synced, sleep)

    async def release_stale_locks(self) -> None:
        await self.handshake.release_stale_locks()

    def expire_reservations(self, *, full: bool = True) -> list[str]:
        """Free the devices of filter decisions whose bind never came within
        ``scheduler.reservation_timeout`` (kube-scheduler dropped the pod after filter);
        ``full=False`` looks at the oldest only (every filter call does that)."""
        timeout = self.settings.reservation_timeout.seconds
        expired = self.cluster.expire_reservations(
            self.clock.monotonic(), timeout, self.binder.binding, full=full
        )
        for key in expired:
            _log.info(
                "reservation expired: no bind came, its devices are free again",
                pod=key,
                timeout=timeout,
            )
        return expired

    async def bind(self, body: Any) -> Json:
        """``ExtenderBindingArgs`` -> ``ExtenderBindingResult`` (``{"Error": ...}``)."""
        return await self.binder.bind(lower_keys(body))

    async def explain(self, namespace: str, name: str) -> Json:
        return await self.explainer.explain(namespace, name)

    def explain_pod(self, pod: Mapping[str, Any]) -> Json:
        return self.explainer.explain_pod(pod)

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
            self.binder.passed_through(str(metadata_of(pod).get("uid") or ""))
            strings = names.strings()
            if self.rooms is not None and self.settings.defrag_cpu_pods:
                # routed here by the webhook (defrag_cpu_pods): where it strands least GPU
                chosen = self.cluster.decide_room_only(pod_requests(pod), strings)
                if chosen is not None:
                    strings = [chosen]
            return _with_nodes(
                args, {"NodeNames": strings, "FailedNodes": {}, "Error": ""}, strings
            ), "passthrough"
        self.events.warn_once(pod, request.warnings)
        self.expire_reservations(full=False)
        began = time.perf_counter()
        # kube-scheduler filters only unbound pods, so a record this pod already has is an
        # earlier decision that was never bound (a failed bind, or our restart in between):
        # the pod must not compete with its own stale hold, or on a full cluster it never
        # fits again. No await until the hold is settled, so no other call sees the gap.
        earlier = self.cluster.pods.get(key)
        if earlier is not None and earlier.bound:
            # our watch saw it bound: kube-scheduler's picture is behind (an API outage);
            # its hold is real and stays
            message = f"hami filter: pod {key} is already bound to node {earlier.node}"
            return {"NodeNames": [], "FailedNodes": {}, "Error": message}, "error"
        if earlier is not None:
            self.cluster.release(key)
        decision = self._decide(request, names, key, pod_requests(pod))
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
        annotations = self._decision_annotations(pod, decision.node, fit.assignment, fit.mig)
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
        if self.settings.success_events:
            self._event(pod, "FilteringSucceed", f"node {decision.node} chosen, devices {devices}")
        answer = {"NodeNames": [decision.node], "FailedNodes": {}, "Error": ""}
        return _with_nodes(args, answer, [decision.node]), "scheduled"

    def _decide(
        self, request: PodRequest, names: Candidates, key: str, room: tuple[int, int]
    ) -> Decision:
        """The cluster's decision, trying nodes whose lock is held suspiciously long last:
        their holder may have lost its Allocate, and binds there would wait and fail."""
        namespace = key.partition("/")[0]
        busy = self.locks.busy(names, key)
        if busy:
            decision = self.cluster.decide(
                request, [n for n in names if n not in busy], namespace=namespace, pod_room=room
            )
            if decision.node is not None:
                return decision
        return self.cluster.decide(request, names, namespace=namespace, pod_room=room)

    def _decision_annotations(
        self,
        pod: Mapping[str, Any],
        node: str,
        assignment: Mapping[str, Any],
        mig: Sequence[MigAllocation] = (),
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
                if kind.pod_annotations is not None:  # Go HAMi's extra keys (Cambricon)
                    annotations.update(
                        kind.pod_annotations(per_container, self._index_on(node), existing)
                    )
            else:
                # A decision made before (a retried pod) may have used this type.
                for stale in (kind.allocated_key, kind.to_allocate_key):
                    if stale in existing:
                        annotations[stale] = None
        if mig:  # Go HAMi's MIG reservation (protocol.md section 10)
            annotations[keys.MIG_ALLOCATIONS] = encode_mig_allocations(mig)
        elif keys.MIG_ALLOCATIONS in existing:
            annotations[keys.MIG_ALLOCATIONS] = None
        for stale in (keys.BIND_PHASE, keys.BIND_TIME):
            if stale in existing:
                annotations[stale] = None
        return annotations

    def _index_on(self, node: str) -> Callable[[str], int]:
        """A device's index on ``node`` by uuid, as the cluster read it (0 when unknown)."""
        state = self.cluster.nodes.get(node)
        devices = state.devices if state is not None else {}

        def index_of(uuid: str) -> int:
            device = devices.get(uuid)
            return device.index if device is not None else 0

        return index_of

    # ------------------------------------------------------------------ events

    def event_recorder(self) -> EventRecorder | None:
        """The one Event sender (the role runs its task); None when no Events are sent."""
        return self.events.recorder()

    async def drain(self) -> None:
        """Write pending Events now, folded counts included (shutdown, tests)."""
        await self.events.drain()


def _node_names(args: Mapping[str, Any]) -> Candidates:
    """The node names kube-scheduler sent, not copied: a decision reads only the few it
    needs (``Candidates``; copying 65,000 names cost more than the decision)."""
    names = args.get("nodenames")
    if isinstance(names, list):
        return Candidates(names)
    nodes = args.get("nodes")
    items = nodes.get("items") if isinstance(nodes, Mapping) else None
    if isinstance(items, list):
        return Candidates(
            [str(metadata_of(i).get("name")) for i in items if isinstance(i, Mapping)]
        )
    return Candidates([])


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
