"""The bind path: per-node queue, node lock, the fenced writes, the Binding, undo.

One pod's way, after filter reserved its devices in memory (``hami.scheduler.service``):

1. wait its turn on the node (``BindQueue``: one bind per node works at a time);
2. take the node's ``hami.io/mutex.lock`` (a conditional write; a live holder is waited
   for, a stale one taken over: ``hami.scheduler.locks``), unless every device type the
   pod holds is one Go HAMi binds without it (``DeviceKind.node_lock``); then the vendor
   locks Go takes for its types instead (``DeviceKind.vendor_lock``: Cambricon's
   ``cambricon.com/dsmlu.lock``, ``hami.scheduler.vendorlock``);
3. write the decision, ``bind-time`` and ``bind-phase: allocating`` in one pod write,
   guarded by the resourceVersion filter saw (done first, before the turn);
4. wait until this replica's pod watch shows that write: watch events come in
   resourceVersion order, so every decision written before it, by any replica, is then
   in the picture;
5. check again that the decision fits (``hami.core.fence``) and create the Binding at the
   resourceVersion checked: the API server binds only the pod exactly as checked.

Where the bind holds the node lock and its decision deletes nothing
(``scheduler.decision_in_binding``), steps 3 and 4 give way to this: after the lock, the
check counts every pod bound under an earlier lock. Each such bind landed its Binding
before its lock was released, so it is enough that this replica's picture holds every
holder the Node watch showed since its last check on the node (``NodeLocks.holders``);
otherwise the node's pods are listed from the API server (a consistent read). The Binding
then carries the decision's annotations, which the API server merges into the pod in the
same write as ``spec.nodeName``: one pod write fewer, and a failed bind leaves the pod
untouched.

Every write of steps 2-5 passes ``_fence`` first: it refuses once this replica stops
leading, once the node or its device type went away, once the bind ran past
``scheduler.bind_lock_wait``, and, before the Binding, when the decision no longer fits.
A refusal undoes the bind (the pod is marked ``bind-phase: failed``, our lock released,
the reservation dropped) and answers kube-scheduler with an error, so it schedules the pod
again. Two replicas (a split brain), or this one and another HAMi scheduler, can then not
both bind onto one device more than it holds: the later decision write sees the earlier.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami import log
from hami.config import SchedulerConfig
from hami.core.cluster import Cluster
from hami.core.fence import bind_refusal
from hami.core.podrecord import PodRecord
from hami.core.requests import PodRequest, RequestError
from hami.kube.client import Kube
from hami.kube.objects import annotations_of, metadata_of
from hami.kube.raw import Conflict, KubeError
from hami.protocol import NodeLock, keys, parse_lock
from hami.scheduler.bindqueue import BindQueue, QueueTimeout
from hami.scheduler.clock import Clock
from hami.scheduler.locks import EventRef, NodeLocks, holder_words
from hami.scheduler.metrics import SchedulerMetrics
from hami.scheduler.vendorlock import VendorLockError, VendorLocks

_log = log.get(__name__)

Json = dict[str, Any]
# A bind waiting for a node lock reads the Node itself when the watch said nothing for
# this long (a watch that fell behind must not stall binds until their deadline).
LOCK_POLL_SECONDS = 2.0
# A lock whose pod's allocation has ended is waited on this long for its node agent's
# release (which follows at once) before it is taken over: writing over it first only
# races the release into a 409 Conflict and a read of the Node. A release that never
# comes (the agent died after its pod write) costs the next bind LOCK_POLL_SECONDS.
RELEASE_GRACE_SECONDS = 1.0
# A lock this replica wrote for a pod whose Binding it then completed, and whose pod its
# watch still holds on that node, is judged held without reading the pod for this long
# after the Binding: nothing but the pod's deletion or the end of its allocation could make
# it stale so soon, and the node agent's release comes with the latter. Saves a read per
# pod on a busy node (binpack); a holder deleted meanwhile waits at most this plus
# LOCK_POLL_SECONDS.
OWN_HOLDER_TRUST_SECONDS = 2.0
# Pods filter let through (they ask for no device hami manages): /bind binds only those.
PASSED_MEMORY = 4096
_DIGITS = re.compile(r"^\d+$")
# The Binding is given up this soon: a lock whose pod is still unbound past the bind window
# (scheduler.bind_lock_wait plus 5 s, hami.scheduler.service.BIND_WINDOW_SLACK) may be taken
# over, so no Binding of ours may still be in flight by then.
BINDING_TIMEOUT = 4.0

STANDBY = (
    "hami scheduler replica is on standby (another replica leads); kube-scheduler retries the pod"
)


class BindError(Exception):
    """A bind step failed; the message is what kube-scheduler and the Event show."""


class AlreadyBound(BindError):
    """The pod turned out to be bound already (a Binding whose answer was lost, or another
    bind of the same pod): its decision and its node lock belong to that binding."""

    def __init__(self, message: str, pod: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.pod = pod


class Step(enum.Enum):
    """The writes of a bind, in order; each passes the fence first."""

    LOCK = "node lock"
    DECISION = "decision"
    BINDING = "Binding"


class BindingUnsure(BindError):
    """A Binding carrying the decision got no answer (a timeout, a broken connection): the
    pod may be bound with it, so its lock must not be released by the undo."""


def newer_or_same(version: str, target: str) -> bool:
    """Whether the watch's ``version`` of an object is at or past ``target``. The API
    server's versions are etcd revisions (decimal, one counter for every object); anything
    else is compared for equality only."""
    if _DIGITS.match(version) and _DIGITS.match(target):
        return int(version) >= int(target)
    return version == target


class Binder:
    """The bind path of one scheduler replica; ``bind`` is what the extender's /bind calls."""

    def __init__(
        self,
        *,
        settings: SchedulerConfig,
        cluster: Cluster,
        kube: Callable[[], Kube],
        clock: Clock,
        locks: NodeLocks,
        metrics: SchedulerMetrics,
        parse: Callable[[Mapping[str, Any]], PodRequest | None],
        event_ref: EventRef,
        leading: Callable[[], bool],
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self._kube = kube
        self.clock = clock
        self.locks = locks
        self.metrics = metrics
        self.parse = parse
        self._event_ref = event_ref
        self.leading = leading
        self.queue = BindQueue()  # binds wait their turn per node
        self.binding: set[str] = set()  # pods being bound now: their reservation stays
        # pod key -> (version the bind waits for, the future the watch resolves)
        self._awaited: dict[str, tuple[str, asyncio.Future[bool]]] = {}
        self._versions: dict[str, str] = {}  # pod key (being bound) -> latest version seen
        # decisions written on pods this replica has since reserved again (maybe elsewhere):
        # another replica may still bind them, so the fence counts them too
        self.shadows: dict[str, PodRecord] = {}
        self._passed: OrderedDict[str, None] = OrderedDict()  # uids filter let through
        self.vendor_locks = VendorLocks(kube, clock.now, clock.monotonic, asyncio.sleep)
        self._locked: dict[str, str] = {}  # node -> the lock value this replica last wrote
        # node -> (lock value, monotonic time): our lock whose pod we then bound
        self._bound_under: dict[str, tuple[str, float]] = {}

    # ------------------------------------------------------------------ from the watches

    def pod_event(self, kind: str, key: str, obj: Mapping[str, Any]) -> None:
        """Every pod event the scheduler keeps (after the cluster took it)."""
        if key in self.binding:
            # the latest version seen, for a bind that asks only after the event came
            version = (
                "" if kind == "DELETED" else str(metadata_of(obj).get("resourceVersion") or "")
            )
            self._versions[key] = version
            awaited = self._awaited.get(key)
            if awaited is not None and not awaited[1].done():
                if not version:
                    awaited[1].set_result(False)
                elif newer_or_same(version, awaited[0]):
                    awaited[1].set_result(True)
        current = self.cluster.pods.get(key)
        if kind == "DELETED" or current is None or not current.reserved:
            self.shadows.pop(key, None)
            return
        written, _ = self.cluster.pod_record(obj)
        if written is not None and (written.node, written.held) != (current.node, current.held):
            self.shadows[key] = written
        else:
            self.shadows.pop(key, None)

    def passed_through(self, uid: str) -> None:
        """Filter let this pod through (no hami device): its bind needs no lock."""
        self._passed[uid] = None
        self._passed.move_to_end(uid)
        while len(self._passed) > PASSED_MEMORY:
            self._passed.popitem(last=False)

    def stand_down(self) -> None:
        """This replica stopped leading: wake every bind waiting on a node lock, so each
        meets the fence now instead of after its next lock poll."""
        for node in self.queue.nodes():
            self.queue.changed(node)

    # ------------------------------------------------------------------ the entry

    async def bind(self, body: Mapping[str, Any]) -> Json:
        """``ExtenderBindingArgs`` (keys lower-cased) -> ``ExtenderBindingResult``."""
        if not self.leading():
            return {"Error": STANDBY}
        started = self.clock.monotonic()
        namespace = str(body.get("podnamespace") or "default")
        name = str(body.get("podname") or "")
        uid = str(body.get("poduid") or "") or None
        node = str(body.get("node") or "")
        key = f"{namespace}/{name}"
        outcome, reason = "failed", "error"
        try:
            if not name or not node:
                raise BindError("hami bind: PodName and Node are required")
            await self._bind(namespace, name, uid, node)
            outcome, reason = "success", "bound"
            if self.settings.success_events:
                self._event_ref(
                    namespace, name, uid, "BindingSucceed", f"bound to node {node}", "Normal"
                )
            return {"Error": ""}
        except BindError as exc:
            reason = bind_reason(str(exc))
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
        self.binding.add(key)  # its reservation must not expire while it waits
        written: str | None = None  # the pod's resourceVersion after our write
        taken: dict[str, str] = {}  # vendor lock -> the value this bind wrote
        carried = self._rides_binding(record)
        try:
            self._fence(Step.DECISION, key, record, deadline)
            if not carried:
                # The decision is written first, outside the node's turn: its write and
                # the pod watch catching up with it overlap the wait for the turn and the
                # lock, instead of adding two round trips to each pod's serial lock cycle.
                # Node agents read only bound pods, so a decision on a pod not yet bound
                # is seen by no Allocate (as with Go HAMi, whose filter writes it).
                answer = await self._write_decision(namespace, name, uid, record)
                written = str(metadata_of(answer).get("resourceVersion") or "") or None
            # One bind per node at a time; its turn ends with the Binding (the next one
            # then waits for the node agent to release the lock after Allocate).
            async with self.queue.turn(node, wait):
                watched = False  # the lock was written at the version the Node watch showed
                if self._needs_lock(record):
                    watched = await self._take_lock(node, namespace, name, record, deadline)
                for lock_key in self._vendor_locks(record):
                    taken[lock_key] = await self._take_vendor_lock(
                        node, key, lock_key, record, deadline
                    )
                if carried:
                    await self._bind_carrying(namespace, name, uid, record, deadline, watched)
                else:
                    await self._bind_checked(namespace, name, uid, record, written, deadline)
                locked = self._locked.pop(node, None)
                if locked is not None:
                    self._trust_holder(node, locked)
        except AlreadyBound as exc:
            # what the pod holds is what its annotations say; nothing of it is ours to
            # undo (releasing its lock would let another pod allocate beside it)
            self.cluster.upsert_pod(exc.pod, self.clock.now())
            raise
        except BaseException as exc:
            await self.undo(
                namespace, name, node, record, written, unsure=isinstance(exc, BindingUnsure)
            )
            for lock_key, value in taken.items():
                await self.vendor_locks.release(node, lock_key, value)
            if isinstance(exc, QueueTimeout):
                raise BindError(
                    f"hami bind: node {node} is busy: {exc.ahead} bind(s) queued before pod "
                    f"{key} did not finish within scheduler.bind_lock_wait ({wait:g}s); each "
                    "waits for the node agent to release the node lock after the previous "
                    "pod's allocation"
                ) from None
            if isinstance(exc, KubeError):
                raise BindError(f"hami bind: pod {key} on node {node}: {exc}") from exc
            raise
        finally:
            self.binding.discard(key)
            self._versions.pop(key, None)
            if self._locked.get(node, "").endswith(f",{namespace},{name}"):
                del self._locked[node]  # a failed bind's (the next bind's may be there)

    # ------------------------------------------------------------------ the fence

    def _fence(
        self,
        step: Step,
        key: str,
        record: PodRecord,
        deadline: float,
        *,
        fit: bool = False,
        listed: Sequence[PodRecord] = (),
    ) -> None:
        """The one place that decides whether this bind may still make its next write."""
        node = record.node
        if not self.leading():
            raise BindError(
                f"hami bind: this scheduler replica stopped leading before the {step.value} "
                f"write of pod {key}; nothing more is written, kube-scheduler retries the pod"
            )
        if step is not Step.LOCK and self.clock.monotonic() > deadline:
            # (the lock loop has its own deadline, whose error names the lock's holder)
            raise BindError(
                f"hami bind: pod {key} on node {node} was not bound within "
                f"scheduler.bind_lock_wait ({self.settings.bind_lock_wait.seconds:g}s); "
                "kube-scheduler retries the pod"
            )
        refusal = bind_refusal(
            self.cluster, key, record, fit=fit, shadows=[*self.shadows.values(), *listed]
        )
        if refusal is not None:
            raise BindError(
                f"hami bind: pod {key} not bound to node {node} (before the {step.value} "
                f"write): {refusal}; kube-scheduler schedules it again"
            )

    async def _bind_checked(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        record: PodRecord,
        version: str | None,
        deadline: float,
    ) -> None:
        """Steps 5 and 6 (docs/scheduler.md): once the watch shows the pod at
        ``version``, check the fit and bind exactly that version of the pod."""
        key = f"{namespace}/{name}"
        for _ in range(3):
            if version is None:
                raise BindError(f"hami bind: pod {key} has no resourceVersion")
            await self._seen(key, version, deadline)
            self._fence(Step.BINDING, key, record, deadline, fit=True)
            try:
                await self._send_binding(namespace, name, uid, record.node, version)
                return
            except Conflict as exc:
                version = await self._still_ours(namespace, name, uid, record, version, exc)
            except KubeError as exc:
                raise BindError(f"hami bind: creating the Binding of {key} failed: {exc}") from exc
        raise BindError(f"hami bind: pod {key} kept changing; it was not bound")

    def _rides_binding(self, record: PodRecord) -> bool:
        """Whether the Binding carries this bind's decision (no pod write before it): only
        under the node lock alone (the lock orders every bind of the node, so a read after
        it sees each earlier one), and only when the decision deletes no key (a Binding
        adds and overwrites annotations, never removes one)."""
        if not self.settings.decision_in_binding or record.decision is None:
            return False
        if record.pod_version is None or not self._needs_lock(record):
            return False
        if self._vendor_locks(record):
            return False
        # a None is a key to delete (bind-time and bind-phase are written over anyway)
        overwritten = (keys.BIND_TIME, keys.BIND_PHASE)
        return all(v is not None or k in overwritten for k, v in record.decision.items())

    async def _bind_carrying(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        record: PodRecord,
        deadline: float,
        watched: bool,
    ) -> None:
        """With the node lock held: make sure every pod bound under an earlier lock is
        counted (in this replica's picture already, or listed from the API server), check
        the fit, and create the Binding with the decision's annotations at the pod's
        version filter saw (after a Conflict, at a newer one while the pod is unbound and
        carries no other decision). ``watched``: the lock was written at the version the
        Node watch showed, so the watch showed every lock before ours."""
        key = f"{namespace}/{name}"
        node = record.node
        annotations = {k: v for k, v in self._bind_annotations(record).items() if v is not None}
        listed = [] if watched and self._holders_seen(node) else await self._bound_on(node)
        version = record.pod_version
        for _ in range(3):
            self._fence(Step.BINDING, key, record, deadline, fit=True, listed=listed)
            self.locks.checked(node, key)
            try:
                await self._send_binding(namespace, name, uid, node, version, annotations)
                return
            except Conflict as exc:
                version = await self._still_bare(namespace, name, uid, version, exc)
            except KubeError as exc:
                raise BindingUnsure(
                    f"hami bind: creating the Binding of {key} failed: {exc}"
                ) from exc
        raise BindError(f"hami bind: pod {key} kept changing; it was not bound")

    async def _send_binding(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        node: str,
        version: str | None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """The Binding, only of the pod at ``version`` (409 otherwise), given up after
        ``BINDING_TIMEOUT`` so none is in flight past the bind's window."""
        await self._kube().bind_pod(
            namespace,
            name,
            uid,
            node,
            resource_version=version,
            annotations=annotations,
            request_timeout=BINDING_TIMEOUT,
        )

    def _holders_seen(self, node: str) -> bool:
        """Whether this replica's picture holds every pod that held ``node``'s lock since
        its last check there, bound there or reserved by this replica: then every bind
        under those locks is counted (a Binding lands before its lock is released, and a
        pod of ours whose Binding the watch has not shown is still counted by its
        reservation), and the list can be skipped."""
        history = self.locks.holders.get(node)
        if history is None:
            return False
        for holder in history:
            held = self.cluster.pods.get(holder)
            if held is None or held.node != node:
                return False  # gone, failed, or not shown yet: the API server's list says
            if not (held.bound or held.reserved):
                # a decision written but not yet seen bound: its binder may have written
                # another one since (Go HAMi's filter does), which the list would show
                return False
        return True

    async def _bound_on(self, node: str) -> list[PodRecord]:
        """The decisions of the pods bound to ``node`` as the API server has them now (a
        consistent read, made with the node lock held) that this replica's picture does
        not hold yet: binds that held the lock before ours, which our pod watch may not
        have shown."""
        try:
            pods = await self._kube().list_pods(field_selector=f"spec.nodeName={node}")
        except KubeError as exc:
            raise BindError(
                f"hami bind: listing the pods bound to node {node} failed: {exc}"
            ) from exc
        unseen: list[PodRecord] = []
        for pod in pods:
            written, _errors = self.cluster.pod_record(pod)
            if written is None or written.node != node:
                continue
            known = self.cluster.pods.get(written.key)
            if known is not None and (known.node, known.held) == (written.node, written.held):
                continue
            if written.whole:
                # held whole because its value cannot be read: the fence counts that only
                # from the watch's picture, so wait for the watch rather than guess
                raise BindError(
                    f"hami bind: pod {written.key} on node {node} carries a decision this "
                    "replica cannot read and has not seen yet; kube-scheduler retries"
                )
            unseen.append(written)
        return unseen

    async def _still_bare(
        self, namespace: str, name: str, uid: str | None, tried: str | None, conflict: KubeError
    ) -> str:
        """After a Conflict on a Binding carrying the decision: the pod's new version if it
        is unbound and carries no decision; otherwise a ``BindError``."""
        pod, version = await self._unbound_after(namespace, name, uid, tried, conflict)
        written, _errors = self.cluster.pod_record(pod)
        if written is not None or keys.BIND_PHASE in annotations_of(pod):
            # written meanwhile (another scheduler): a Binding cannot delete its keys
            raise BindError(
                f"hami bind: pod {namespace}/{name} was given a decision meanwhile; not bound"
            )
        return version

    async def _still_ours(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        record: PodRecord,
        tried: str,
        conflict: KubeError,
    ) -> str:
        """After a Binding conflict: the pod's new version if it is unbound and still
        carries this decision; otherwise a ``BindError``."""
        pod, version = await self._unbound_after(namespace, name, uid, tried, conflict)
        now, _ = self.cluster.pod_record(pod)
        if now is None or (now.node, now.held) != (record.node, record.held):
            raise BindError(f"hami bind: pod {namespace}/{name}'s decision was rewritten meanwhile")
        return version

    async def _unbound_after(
        self, namespace: str, name: str, uid: str | None, tried: str | None, conflict: KubeError
    ) -> tuple[Json, str]:
        """After a Binding conflict: the pod read again and its version, when it is unbound,
        the same pod (uid) and at a newer version; otherwise ``AlreadyBound`` or a
        ``BindError``."""
        key = f"{namespace}/{name}"
        try:
            pod = await self._kube().get_pod(namespace, name)
        except KubeError as exc:
            raise BindError(f"hami bind: reading pod {key} failed: {exc}") from exc
        meta = metadata_of(pod)
        bound = str((pod.get("spec") or {}).get("nodeName") or "")
        version = str(meta.get("resourceVersion") or "")
        if bound:
            raise AlreadyBound(f"hami bind: pod {key} is already bound to node {bound}", pod)
        if not version or version == tried or (uid and str(meta.get("uid") or "") != uid):
            # not a newer version: the precondition that failed is another one (the uid)
            raise BindError(f"hami bind: creating the Binding of {key} failed: {conflict}")
        return pod, version

    async def _seen(self, key: str, version: str, deadline: float) -> None:
        """Wait until the pod watch shows ``key`` at ``version`` or later."""
        if key in self._awaited:
            raise BindError(f"hami bind: pod {key} is being bound already")
        latest = self._versions.get(key)
        if latest == "":
            raise BindError(f"hami bind: pod {key} was deleted while being bound")
        if latest is not None and newer_or_same(latest, version):
            return  # the watch showed it before this bind asked
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._awaited[key] = (version, future)
        try:
            async with asyncio.timeout(max(deadline - self.clock.monotonic(), 0.0)):
                alive = await future
        except TimeoutError:
            raise BindError(
                f"hami bind: the pod watch did not show pod {key}'s decision before the bind's "
                f"deadline (scheduler.bind_lock_wait); kube-scheduler retries the pod"
            ) from None
        finally:
            self._awaited.pop(key, None)
        if not alive:
            raise BindError(f"hami bind: pod {key} was deleted while being bound")

    # ------------------------------------------------------------------ pod writes

    async def _unplaced(
        self, namespace: str, name: str, uid: str | None, node: str
    ) -> PodRecord | None:
        """A bind with no record in memory (rare: a restart between filter and bind, an
        expired reservation, or a pod that asks for no hami device). The pod is read once:
        one that asks for no device is bound here without the lock (None) if it is this
        scheduler's and its filter let it through; one with a decision written before
        counts as usual; a device pod without one fails, since nothing was reserved."""
        key = f"{namespace}/{name}"
        try:
            pod = await self._kube().get_pod(namespace, name)
        except KubeError as exc:
            raise BindError(f"hami bind: reading pod {key} failed: {exc}") from exc
        try:
            request = self.parse(pod)
        except RequestError as exc:
            raise BindError(f"hami bind: pod {key}: {exc}") from exc
        if request is None:
            self._check_passthrough(pod, key)
            if not self.leading():
                raise BindError(STANDBY)
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

    def _check_passthrough(self, pod: Mapping[str, Any], key: str) -> None:
        """A pod without hami devices is bound only if it names this scheduler and this
        replica's filter saw it: /bind is no general-purpose binder."""
        wanted = self.settings.scheduler_name
        named = str((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")
        if named != wanted:
            raise BindError(
                f"hami bind: pod {key} asks for no hami device and names scheduler {named!r}, "
                f"not {wanted!r} (scheduler.scheduler_name); it is not bound here"
            )
        uid = str(metadata_of(pod).get("uid") or "")
        if uid not in self._passed:
            raise BindError(
                f"hami bind: pod {key} asks for no hami device and this scheduler's filter "
                "did not pass it (a restart in between, or a bind sent directly); "
                "kube-scheduler retries it"
            )

    async def _write_decision(
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
                    pod = await self._kube().get_pod(namespace, name)
                except KubeError as exc:
                    raise BindError(f"hami bind: reading pod {key} failed: {exc}") from exc
                bound = str((pod.get("spec") or {}).get("nodeName") or "")
                current_uid = str(metadata_of(pod).get("uid") or "")
                if bound:
                    raise AlreadyBound(
                        f"hami bind: pod {key} is already bound to node {bound}; its decision "
                        "is left as it is",
                        pod,
                    )
                if uid and current_uid and current_uid != uid:
                    raise BindError(f"hami bind: pod {key} was replaced (uid {current_uid})")
                version = str(metadata_of(pod).get("resourceVersion") or "") or None
                if version is None:
                    raise BindError(f"hami bind: pod {key} has no resourceVersion")
            try:
                return await self._kube().patch_pod_annotations(
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
            await self._kube().bind_pod(namespace, name, uid, node)
        except KubeError as exc:
            raise BindError(
                f"hami bind: creating the Binding of {namespace}/{name} failed: {exc}"
            ) from exc

    async def undo(
        self,
        namespace: str,
        name: str,
        node: str,
        record: PodRecord,
        written: str | None,
        *,
        unsure: bool = False,
    ) -> None:
        """Mark the pod failed, release our lock and drop its reservation (best effort;
        these writes only give back, so they pass no fence).

        The pod is marked ``bind-phase: failed`` only when this bind wrote it (``written``:
        the resourceVersion our write left), and only if nothing changed it since: a
        Binding that went through although its answer was lost, or a later bind of the
        same pod (kube-scheduler retries while a slow undo still waits for the API
        server), must not be failed by it; the lock then stays too (the node agent
        releases it after that pod's Allocate, or the lock rules take it over). Before our
        write the pod holds nothing of ours. ``unsure``: a Binding carrying the decision got
        no answer; the pod is read, and the lock stays unless it is seen unbound.
        """
        key = f"{namespace}/{name}"
        kube = self._kube()
        changed = False  # the pod changed since our write
        if unsure:
            try:
                pod = await kube.get_pod(namespace, name)
                changed = bool((pod.get("spec") or {}).get("nodeName"))
            except KubeError as exc:
                _log.info("pod not read after a Binding without answer", pod=key, error=str(exc))
                changed = True  # it may be bound: its lock stays (the lock rules judge it)
        if written is not None:
            try:
                await kube.patch_pod_annotations(
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
                current = await kube.get_node(node)
                meta = metadata_of(current)
                lock = parse_lock(annotations_of(current).get(keys.NODE_LOCK))
                if lock is not None and (lock.namespace, lock.pod) == (namespace, name):
                    await kube.patch_node_annotations(
                        node,
                        {keys.NODE_LOCK: None},
                        resource_version=str(meta.get("resourceVersion") or "") or None,
                    )
        if self.cluster.pods.get(key) == record:
            self.cluster.release(key)

    # ------------------------------------------------------------------ the node lock

    def _needs_lock(self, record: PodRecord) -> bool:
        """Whether the pod's bind takes the node lock: unless every device type it holds is
        one whose node plug-in never releases the lock (``DeviceKind.node_lock``)."""
        words = record.words
        kinds = self.cluster.kinds
        return not words or any(w not in kinds or kinds[w].node_lock for w in words)

    def _vendor_locks(self, record: PodRecord) -> list[str]:
        """The vendor locks Go HAMi takes for the types the pod holds, in Go's order."""
        words = record.words
        kinds = self.cluster.kinds
        return sorted({kinds[w].vendor_lock for w in words if w in kinds} - {""})

    async def _take_vendor_lock(
        self, node: str, key: str, lock_key: str, record: PodRecord, deadline: float
    ) -> str:
        try:
            return await self.vendor_locks.take(
                node, lock_key, deadline, lambda: self._fence(Step.LOCK, key, record, deadline)
            )
        except VendorLockError as exc:
            raise BindError(f"hami bind: pod {key}: {exc}") from None

    async def _take_lock(
        self, node: str, namespace: str, name: str, record: PodRecord, deadline: float
    ) -> bool:
        """Set ``hami.io/mutex.lock`` for this pod; the caller has the node's turn
        (``queue``). A conditional write at the resourceVersion the Node watch last
        showed; the Node is read only after a Conflict, when the watch has not yet shown
        our previous lock write, or when it said nothing for ``LOCK_POLL_SECONDS``. While
        another pod holds the lock, wait (until ``deadline``) for the watch to show a
        change: each change wakes this bind alone. Every write passes the fence. Returns
        whether the lock was written at the version the watch showed (not one read)."""
        key = f"{namespace}/{name}"
        wait = self.settings.bind_lock_wait.seconds
        read: Json | None = None  # the Node as just read: newer than the watch's copy
        while True:
            self._fence(Step.LOCK, key, record, deadline)
            mark = self.queue.generation(node)
            state = self.cluster.nodes.get(node)
            if read is None and (state is None or not state.exists):
                read = await self._read_node(node)
            if read is not None:
                value = annotations_of(read).get(keys.NODE_LOCK)
                version = str(metadata_of(read).get("resourceVersion") or "")
                read = None
                watched = False
            elif node in self.locks.writes:
                # The watch's copy predates our last lock write here: wait for it to catch
                # up (it then shows that lock, held until the node agent's release).
                remaining = max(deadline - self.clock.monotonic(), 0.0)
                if not await self.queue.wait_change(node, mark, min(remaining, LOCK_POLL_SECONDS)):
                    read = await self._read_node(node)
                continue
            else:
                assert state is not None
                value, version = state.lock, state.resource_version
                watched = True
            holder = self._own_fresh_holder(node, value) or await self.locks.live_holder(
                value, node, namespace, name, release_grace=RELEASE_GRACE_SECONDS
            )
            if holder is not None:
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    raise BindError(
                        f"hami bind: node {node} is locked by {holder_words(holder)} "
                        f"(since {holder.time:%Y-%m-%dT%H:%M:%SZ}) and it was not released "
                        f"within {wait:g}s; the node agent releases it after the pod's "
                        "allocation"
                    )
                if not await self.queue.wait_change(node, mark, min(remaining, LOCK_POLL_SECONDS)):
                    read = await self._read_node(node)  # the watch said nothing: look
                continue
            self._fence(Step.LOCK, key, record, deadline)
            lock = NodeLock(self.clock.now(), namespace, name).encode()
            try:
                written = await self._kube().patch_node_annotations(
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
            self._locked[node] = lock
            seen = self.cluster.nodes.get(node)
            self.locks.wrote(
                node, version, lock, (seen.resource_version, seen.lock) if seen else ("", None)
            )
            return watched

    def _trust_holder(self, node: str, value: str) -> None:
        """Our lock ``value`` on ``node`` now holds a pod we bound (``_own_fresh_holder``)."""
        now = self.clock.monotonic()
        if len(self._bound_under) >= 1024:  # keep only the fresh ones (a busy node's)
            for stale in [
                n
                for n, (_, at) in self._bound_under.items()
                if now - at >= OWN_HOLDER_TRUST_SECONDS
            ]:
                del self._bound_under[stale]
        self._bound_under[node] = (value, now)

    def _own_fresh_holder(self, node: str, value: str | None) -> NodeLock | None:
        """The lock's holder, judged held without a read, when it is the lock this replica
        wrote for a pod it bound less than ``OWN_HOLDER_TRUST_SECONDS`` ago and its pod
        watch still holds that pod on the node; None: judge it the usual way."""
        mine = self._bound_under.get(node)
        if mine is None or value is None or mine[0] != value:
            return None
        if self.clock.monotonic() - mine[1] >= OWN_HOLDER_TRUST_SECONDS:
            del self._bound_under[node]
            return None
        lock = parse_lock(value)
        if lock is None or lock.owner is None:
            return None
        held = self.cluster.pods.get(lock.owner)
        return lock if held is not None and held.node == node else None

    async def _read_node(self, node: str) -> Json:
        try:
            current = await self._kube().get_node(node)
        except KubeError as exc:
            raise BindError(f"hami bind: reading node {node} failed: {exc}") from exc
        self.locks.writes.pop(node, None)  # what we read is newer than our last write
        return current


def bind_reason(message: str) -> str:
    """The ``hami_bind`` reason label of a failed bind's message."""
    if "is locked by" in message or "is busy" in message:
        return "node_locked"  # waited for the node lock, held or queued for
    if "stopped leading" in message or "on standby" in message:
        return "standby"
    if "not bound to node" in message:
        return "refused"  # the fence: node gone, type unavailable, no longer fits
    if "Binding" in message:
        return "binding"
    if "placed on node" in message:
        return "wrong_node"
    return "error"
