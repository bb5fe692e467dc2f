"""kubelet's ``Allocate`` answered from the pod's annotations (protocol.md sections 4 and 5).

The decisions are pure functions of plain dicts (``choose_pod``, ``plan_allocation``,
``preferred_replicas``); ``Allocator`` does the Kubernetes I/O around them, one call at a
time per node.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from hami import log
from hami.backends.base import (
    AllocationRequest,
    Backend,
    BackendError,
    ContainerAllocation,
    Device,
)
from hami.core.usage import requesting
from hami.kube.nodelock import DEFAULT_ALLOCATION_TIMEOUT, LockRules, judge_holder, judge_value
from hami.kube.objects import annotations_of, metadata_of, pod_containers
from hami.kube.raw import JSON, Conflict, NotFound
from hami.protocol import (
    ContainerDevice,
    ProtocolError,
    decode_pod_devices,
    encode_pod_devices,
    entry_containers,
    first_pending_entry,
    keys,
    parse_lock,
)
from hami.protocol.keys import BindPhase
from hami.protocol.nodelock import DEFAULT_LOCK_TIMEOUT, parse_unix_time

if TYPE_CHECKING:  # the watches' module imports the Kubernetes client; the pure parts do not
    from hami.node.podcache import NodeCache

_log = log.get(__name__)

Pod = Mapping[str, Any]


class AllocateError(Exception):
    """Allocation failed; the message names the pod (when one was found) and the cause."""

    def __init__(self, cause: str, pod: str | None = None) -> None:
        self.cause = cause
        self.pod = pod
        where = f"pod {pod}" if pod else "no pod"
        super().__init__(f"hami: {where}: {cause}")


def pod_ref(pod: Pod) -> str:
    meta = metadata_of(pod)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _bind_time(pod: Pod) -> float:
    stamp = parse_unix_time(annotations_of(pod).get(keys.BIND_TIME))
    # unknown (or absurd) bind time: after every pod that has one
    return float("inf") if stamp is None else stamp.timestamp()


def is_pending_for(pod: Pod, node: str, to_allocate_key: str) -> bool:
    """The pod waits for allocation on this node (bind-phase allocating, vgpu-node = node)."""
    annotations = annotations_of(pod)
    phase = (pod.get("status") or {}).get("phase", "Pending")
    return (
        phase == "Pending"
        and annotations.get(keys.BIND_PHASE) == BindPhase.ALLOCATING
        and annotations.get(keys.VGPU_NODE) == node
        and to_allocate_key in annotations
        and not metadata_of(pod).get("deletionTimestamp")
    )


def has_work(pod: Pod, to_allocate_key: str) -> bool:
    """The value still has an entry for this backend, or is malformed (to be failed). A pod
    whose entries of this type are all done waits only for another type's Allocate."""
    try:
        entries = decode_pod_devices(annotations_of(pod).get(to_allocate_key, ""))
    except ProtocolError:
        return True
    return first_pending_entry(entries) is not None


def is_candidate(pod: Pod, node: str, to_allocate_key: str) -> bool:
    return is_pending_for(pod, node, to_allocate_key) and has_work(pod, to_allocate_key)


def choose_pod(
    node: str, to_allocate_key: str, lock_pod: Pod | None, candidates: Sequence[Pod]
) -> Pod | None:
    """The pod being started: the lock's pod if it is pending here, else the oldest pending
    pod by ``hami.io/bind-time`` (then creation time, then name)."""
    if lock_pod is not None and is_candidate(lock_pod, node, to_allocate_key):
        return lock_pod
    pending = [p for p in candidates if is_candidate(p, node, to_allocate_key)]
    if not pending:
        return None
    return min(
        pending,
        key=lambda p: (
            _bind_time(p),
            str(metadata_of(p).get("creationTimestamp", "")),
            pod_ref(p),
        ),
    )


# What a device uuid may look like: the pod value reaches the container's environment
# (NVIDIA_VISIBLE_DEVICES), where "all", "none" or a list would widen what it sees.
_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}", re.ASCII)
_RESERVED_UUIDS = frozenset({"all", "none", "void"})
MAX_CORES = 100
_FIX = "the decision must come from the HAMi scheduler: delete the pod and create it again"


def check_entry(
    devices: Sequence[ContainerDevice],
    backend: Backend,
    node_devices: Sequence[Device],
    where: str,
) -> None:
    """Refuse a decision this node cannot honestly serve (a forged or foreign annotation):
    every uuid a device of this node and backend, once; 0 <= memory <= the device's
    registered memory; 0 <= cores <= 100. Raises AllocateError naming the value and the fix."""
    registered = {d.uuid: d.memory for d in backend.to_node_devices(node_devices)}
    seen: set[str] = set()
    for device in devices:
        uuid = device.uuid
        if not _UUID.fullmatch(uuid) or uuid.lower() in _RESERVED_UUIDS:
            raise AllocateError(f"{where}: {uuid!r} is not a device uuid; {_FIX}")
        if uuid not in registered:
            known = ", ".join(sorted(registered)) or "none"
            raise AllocateError(
                f"{where}: device {uuid} is not a {backend.type_word} device of this node "
                f"(its devices: {known}); {_FIX}"
            )
        if uuid in seen:
            raise AllocateError(f"{where}: device {uuid} is listed twice; {_FIX}")
        seen.add(uuid)
        if not 0 <= device.memory <= registered[uuid]:
            raise AllocateError(
                f"{where}: memory {device.memory} MiB on device {uuid} is outside 0.."
                f"{registered[uuid]} MiB (the device's registered memory); {_FIX}"
            )
        if not 0 <= device.cores <= MAX_CORES:
            raise AllocateError(
                f"{where}: cores {device.cores} on device {uuid} is outside 0..{MAX_CORES}; {_FIX}"
            )


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    index: int  # the container's position: init containers first, then regular containers
    name: str
    devices: Sequence[ContainerDevice]
    allocation: ContainerAllocation


@dataclass(frozen=True, slots=True)
class AllocationPlan:
    pod: str  # namespace/name
    containers: Sequence[ContainerPlan]
    annotations: Mapping[str, str]  # the pod patch: the erased value, and success when done
    done: bool  # no entry left: bind-phase success, release the node lock


def _env(container: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in container.get("env") or []:
        if isinstance(item, Mapping) and isinstance(item.get("name"), str):
            value = item.get("value")
            out[item["name"]] = value if isinstance(value, str) else ""
    return out


def plan_allocation(
    pod: Pod,
    backend: Backend,
    requested: Sequence[int],
    node_devices: Sequence[Device],
) -> AllocationPlan:
    """What to answer for one Allocate call (one count per container request). Pure.

    Raises AllocateError naming the pod and the cause."""
    ref = pod_ref(pod)
    key = backend.to_allocate_key
    value = annotations_of(pod).get(key)
    if value is None:
        raise AllocateError(f"annotation {key} is missing", ref)
    try:
        entries = decode_pod_devices(value)
    except ProtocolError as exc:
        raise AllocateError(f"annotation {key}: {exc}", ref) from None
    containers, _ = pod_containers(pod)
    positions = _entry_positions(entries, containers, backend, key, ref)
    meta = metadata_of(pod)
    plans: list[ContainerPlan] = []
    # the pod's annotations as the containers answered so far leave them (NVIDIA MIG: the
    # completed reservations), and what of them to write back
    seen = dict(annotations_of(pod))
    node = seen.get(keys.VGPU_NODE) or str((pod.get("spec") or {}).get("nodeName") or "")
    written: dict[str, str] = {}
    for count in requested:
        index = first_pending_entry(entries)
        if index is None:
            raise AllocateError(f"annotation {key} has no devices left to allocate", ref)
        position = positions[index]
        devices = entries[index]
        if len(devices) != count:
            raise AllocateError(
                f"device count mismatch for container entry {index}: kubelet asked for "
                f"{count}, the scheduler assigned {len(devices)} ({key})",
                ref,
            )
        wrong = [d.vendor for d in devices if d.vendor != backend.vendor_word]
        if wrong:
            raise AllocateError(
                f"annotation {key} entry {index} has vendor {wrong[0]!r}, "
                f"expected {backend.vendor_word!r}",
                ref,
            )
        if position >= len(containers):
            raise AllocateError(
                f"annotation {key} entry {index} has no matching container "
                f"(the pod has {len(containers)})",
                ref,
            )
        where = f"annotation {key} entry {index}"
        try:
            devices = backend.decision_devices(devices, node_devices, node, seen)
        except BackendError as exc:
            raise AllocateError(f"{where}: {exc}; {_FIX}", ref) from None
        try:
            check_entry(devices, backend, node_devices, where)
        except AllocateError as exc:
            raise AllocateError(exc.cause, ref) from None
        container = containers[position]
        name = str(container.get("name", ""))
        request = AllocationRequest(
            pod_namespace=str(meta.get("namespace", "")),
            pod_name=str(meta.get("name", "")),
            pod_uid=str(meta.get("uid", "")),
            container_name=name,
            container_index=position,
            devices=list(devices),
            node_devices=list(node_devices),
            container_env=_env(container),
            container_limits=(container.get("resources") or {}).get("limits") or {},
            pod_annotations=dict(seen),
        )
        try:
            allocation = backend.allocate(request)
        except BackendError as exc:
            raise AllocateError(f"container {name}: {exc}", ref) from None
        seen.update(allocation.pod_annotations)
        written.update(allocation.pod_annotations)
        plans.append(ContainerPlan(position, name, list(devices), allocation))
        entries[index] = []
    done = first_pending_entry(entries) is None and not _others_pending(pod, key)
    try:
        # decode accepts some values (an empty uuid) that encode refuses to write back
        annotations = {**written, key: encode_pod_devices(entries)}
    except ProtocolError as exc:
        raise AllocateError(f"annotation {key}: {exc}", ref) from None
    if done:
        annotations[keys.BIND_PHASE] = BindPhase.SUCCESS.value
    return AllocationPlan(ref, plans, annotations, done)


def _entry_positions(
    entries: Sequence[Sequence[ContainerDevice]],
    containers: Sequence[Mapping[str, Any]],
    backend: Backend,
    key: str,
    ref: str,
) -> list[int]:
    """The container each entry is for: entry *i* is container *i*, or, in a value with
    fewer entries than containers (Go HAMi 2.10 leaves out the containers without this
    type: protocol.md §8), the containers that ask for the type, in order."""
    asking = requesting(containers, backend.resources)
    positions = entry_containers(len(entries), asking)
    if positions is None and not any(asking):
        # No container names this backend's resources (its names differ from the pod's):
        # nothing says which containers the entries are for but their order.
        positions = list(range(len(entries)))
    if positions is None:
        raise AllocateError(
            f"annotation {key} has {len(entries)} entries for {len(containers)} containers, "
            f"{sum(asking)} of which ask for {backend.resources.count}; {_FIX}",
            ref,
        )
    return positions


def _others_pending(pod: Pod, key: str) -> bool:
    """Another backend's ``*devices-to-allocate`` value still has entries (a pod using two
    device types is done only when every type is allocated). Malformed values do not block:
    that backend's own Allocate fails the pod."""
    for other, value in annotations_of(pod).items():
        if other == key or not other.endswith("devices-to-allocate"):
            continue
        try:
            if first_pending_entry(decode_pod_devices(value)) is not None:
                return True
        except ProtocolError:
            continue
    return False


def pending_uuids(pod: Pod, backend: Backend) -> list[str] | None:
    """The devices of the pod's next container (what GetPreferredAllocation steers to)."""
    value = annotations_of(pod).get(backend.to_allocate_key)
    if value is None:
        return None
    try:
        entries = decode_pod_devices(value)
    except ProtocolError:
        return None
    index = first_pending_entry(entries)
    return None if index is None else [d.uuid for d in entries[index]]


def preferred_replicas(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    wanted_uuids: Sequence[str] | None,
    uuid_of: Callable[[str], str | None],
) -> list[str]:
    """Replica ids for kubelet: one replica of each device the scheduler chose, then (when
    the choice is unknown or cannot be met) the must-include ids and the first available."""
    chosen = [i for i in must_include if i in available][:size]
    if wanted_uuids:
        covered = {uuid_of(i) for i in chosen}
        for uuid in wanted_uuids:
            if len(chosen) >= size:
                break
            if uuid in covered:
                continue
            replica = next((i for i in available if i not in chosen and uuid_of(i) == uuid), None)
            if replica is not None:
                chosen.append(replica)
                covered.add(uuid)
    for replica in available:
        if len(chosen) >= size:
            break
        if replica not in chosen:
            chosen.append(replica)
    return chosen


# --------------------------------------------------------------------------- I/O


class NodeKube(Protocol):
    """The Kubernetes calls the node agent makes, as plain JSON (``hami.kube.client.Kube``
    provides them; unit tests use an in-memory one). Errors are ``hami.kube.raw``'s:
    ``NotFound`` and ``Conflict`` are told apart, any other ``KubeError`` is a failure."""

    async def get_node(self, name: str) -> JSON: ...

    async def get_pod(self, namespace: str, name: str) -> JSON: ...

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[JSON]: ...

    async def patch_node_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> JSON: ...

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> JSON: ...


class Allocator:
    """Allocate and GetPreferredAllocation for every backend of one node, serialised."""

    def __init__(
        self,
        node: str,
        kube: NodeKube,
        *,
        lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT,
        allocation_timeout: timedelta = DEFAULT_ALLOCATION_TIMEOUT,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        cache: NodeCache | None = None,
    ) -> None:
        self.node = node
        # the Node and its pods from watches: Allocate reads them instead of the API server
        # where that is safe (_find_cached), and the API server otherwise
        self.cache = cache
        # kubelet waits for Allocate without a deadline and a pod whose Allocate fails is
        # Failed for good: the node agent hands a client with a patient retry policy
        # (PATIENT_RETRY), so a short API server outage is waited out, not passed on
        self.kube = kube
        self.lock = asyncio.Lock()
        self.lock_timeout = lock_timeout
        self.rules = LockRules(lock_timeout, allocation_timeout)
        self.now = now
        self.log = _log.bind(role="node", node=node)
        # where each Allocate/GetPreferredAllocation found its pod: the watches or the API
        self.served = {"cache": 0, "api": 0}
        # the lock release after a pod's last container, sent after kubelet has its answer
        self._releasing: asyncio.Task[None] | None = None

    async def settle(self) -> None:
        """Wait for a lock release still in flight (the next call, shutdown, tests)."""
        task, self._releasing = self._releasing, None
        if task is not None:
            await task

    async def _find(self, backend: Backend) -> tuple[Pod | None, Mapping[str, Any]]:
        """The pod from the API server: the Node (its lock), the lock's pod, else the
        pending pods of this node."""
        self.served["api"] += 1
        node = await self.kube.get_node(self.node)
        lock = parse_lock(annotations_of(node).get(keys.NODE_LOCK))
        lock_pod: Pod | None = None
        if lock is not None and lock.owner is not None:  # a legacy lock names no pod
            with contextlib.suppress(NotFound):
                lock_pod = await self.kube.get_pod(lock.namespace, lock.pod)
        if lock_pod is not None and is_candidate(lock_pod, self.node, backend.to_allocate_key):
            return lock_pod, node
        candidates = await self.kube.list_pods(
            field_selector=f"spec.nodeName={self.node},status.phase=Pending"
        )
        # None: the lock's pod was just ruled out; choose_pod would decode it again.
        return choose_pod(self.node, backend.to_allocate_key, None, candidates), node

    def _find_cached(self, backend: Backend) -> tuple[Pod, str] | None:
        """The pod and the lock value from the watches, where they cannot be ambiguous: both
        watches listed and open, the Node's live lock names a pod that waits here for this
        backend, and no other pod does. None: read the API server (``_find``).

        The watches may lag by a few events; what a lag could still get wrong (a decision
        changed since) is caught by the pod write, guarded by the pod's resourceVersion."""
        cache = self.cache
        if cache is None or cache.not_current() is not None or cache.node_object is None:
            return None
        value = annotations_of(cache.node_object).get(keys.NODE_LOCK)
        view = judge_value(value, self.now(), self.rules)
        lock = view.lock
        if value is None or view.free or lock is None or lock.owner is None:
            return None  # no lock, a stale one, or a legacy one: which pod is not certain
        key = backend.to_allocate_key
        pod = cache.pod(lock.namespace, lock.pod)
        if pod is None or not metadata_of(pod).get("resourceVersion"):
            return None
        if not is_candidate(pod, self.node, key):
            return None
        if any(other is not pod and is_candidate(other, self.node, key) for other in cache.pods()):
            return None  # another pod waits too: let the API server's picture decide
        return pod, value

    async def preferred(self, backend: Backend) -> list[str] | None:
        """The uuids the scheduler chose for the next container, None when unknown."""
        async with self.lock:
            cached = self._find_cached(backend)
            if cached is not None:
                self.served["cache"] += 1
                return pending_uuids(cached[0], backend)
            try:
                pod, _ = await self._find(backend)
            except Exception as exc:
                self.log.warning("preferred_allocation_lookup_failed", error=str(exc))
                return None
        return None if pod is None else pending_uuids(pod, backend)

    async def reconcile(self, backend: Backend) -> None:
        """Hand the backend the node's pods, freshly listed, to release what was made for
        pods that are gone (NVIDIA MIG instances), between Allocate calls."""
        async with self.lock:
            await self._reconcile(backend)

    async def _reconcile(self, backend: Backend) -> None:
        if not backend.wants_pod_reconcile():
            return
        try:
            # from the API server, not the watches: what is removed must really be gone
            pods = await self.kube.list_pods(field_selector=f"spec.nodeName={self.node}")
        except Exception as exc:
            self.log.warning(
                "pod_reconcile_skipped",
                backend=backend.type_word,
                error=str(exc),
                hint="nothing is released while the node's pods cannot be listed",
            )
            return
        try:
            await backend.reconcile_pods(pods)
        except Exception as exc:
            self.log.warning("pod_reconcile_failed", backend=backend.type_word, error=str(exc))

    async def allocate(
        self, backend: Backend, requested: Sequence[int], node_devices: Sequence[Device]
    ) -> AllocationPlan:
        async with self.lock:
            await self.settle()  # writes to the Node stay in order
            # what gone pods still hold (a MIG placement) is freed before it is needed
            await self._reconcile(backend)
            cached = self._find_cached(backend)
            plan: AllocationPlan | None = None
            try:
                if cached is not None:
                    plan = await self._allocate_cached(*cached, backend, requested, node_devices)
                if plan is None:
                    plan = await self._allocate(backend, requested, node_devices)
            except AllocateError as exc:
                if exc.pod and backend.vendor_lock:  # that pod was failed: it waits no more
                    await self._release_vendor_lock(backend.vendor_lock, exc.pod)
                raise
            if plan.done and backend.vendor_lock:
                await self._release_vendor_lock(backend.vendor_lock, plan.pod)
            return plan

    async def _allocate_cached(
        self,
        pod: Pod,
        lock_value: str,
        backend: Backend,
        requested: Sequence[int],
        node_devices: Sequence[Device],
    ) -> AllocationPlan | None:
        """Allocate for the pod the watches gave: one pod write guarded by the resourceVersion
        the watch saw, and on the last container one lock release guarded by the lock value,
        sent together (the release does not wait for the pod write's answer). None (nothing
        written) when anything goes otherwise before the writes: the caller reads the API
        server and decides as before, failing the pod only on what it read there. After the
        writes were sent, a pod write that did not land is settled by ``_allocate_named``."""
        ref = pod_ref(pod)
        meta = metadata_of(pod)
        try:
            plan = await _plan(pod, backend, requested, node_devices)
            await _make_host_dirs(plan)
        except Exception as exc:
            self.log.debug("cached_allocation_fell_back", pod=ref, error=str(exc))
            return None
        if plan.done:
            # kubelet need not wait for it: the pod's bind-phase is success from the pod
            # write, so the lock already counts as stale (hami.kube.nodelock) if this is lost
            self._releasing = asyncio.create_task(
                self._release_cached(ref, lock_value), name=f"release-lock[{ref}]"
            )
        answer: Any
        try:
            answer = await self.kube.patch_pod_annotations(
                meta["namespace"], meta["name"], plan.annotations, meta.get("resourceVersion")
            )
        except Exception as exc:
            # An API outage can swallow the answer to a write that landed (its retry then
            # conflicts with it): the pod, read again, shows whether it did. Falling back
            # would find no work left for the pod and fail it.
            landed = await self._landed(meta, plan)
            if landed is None:
                reason = (
                    "cached_pod_outdated"
                    if isinstance(exc, Conflict)
                    else ("cached_allocation_fell_back")
                )
                self.log.debug(reason, pod=ref, error=str(exc))
                if plan.done:
                    return await self._allocate_named(meta, backend, requested, node_devices)
                return None
            self.log.info("allocation write landed although its answer was lost", pod=ref)
            answer = landed
        self.served["cache"] += 1
        self._remember(answer)
        self._allocated(plan, backend, "watch")
        return plan

    async def _allocate_named(
        self,
        meta: Mapping[str, Any],
        backend: Backend,
        requested: Sequence[int],
        node_devices: Sequence[Device],
    ) -> AllocationPlan:
        """The pod write of a last container failed after its lock release was sent: the
        scheduler may already have locked the node for the next pod, which ``_find`` would
        take for this call. So the pod the released lock named is read again and served if
        it still waits here (this call is its: no other pod could be bound while its lock
        held); only a pod that no longer waits (failed, gone) leaves it to ``_find``."""
        await self.settle()  # the release, so _find reads the Node after it
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        try:
            pod: Pod = await self.kube.get_pod(namespace, name)
        except NotFound:
            return await self._allocate(backend, requested, node_devices)
        except Exception as exc:
            raise AllocateError(f"cannot read pod {namespace}/{name}: {exc}") from None
        same = metadata_of(pod).get("uid") == meta.get("uid")
        if not same or not is_candidate(pod, self.node, backend.to_allocate_key):
            return await self._allocate(backend, requested, node_devices)
        self.served["api"] += 1
        plan = await self._write_plan(pod, backend, requested, node_devices)
        if plan.done:
            await self._release_lock(pod_ref(pod))  # ours if the early release missed it
        self._allocated(plan, backend, "api")
        return plan

    async def _landed(self, meta: Mapping[str, Any], plan: AllocationPlan) -> Pod | None:
        """The pod if it carries every annotation ``plan`` writes (our write went through),
        else None (also when it cannot be read)."""
        try:
            current = await self.kube.get_pod(str(meta["namespace"]), str(meta["name"]))
        except Exception:
            return None
        if metadata_of(current).get("uid") != meta.get("uid"):
            return None
        annotations = annotations_of(current)
        for key, value in plan.annotations.items():
            if value is None:
                if key in annotations:
                    return None
            elif annotations.get(key) != value:
                return None
        return current

    async def _release_cached(self, ref: str, lock_value: str) -> None:
        """Release the lock by its value; if it changed meanwhile, read the Node and decide."""
        assert self.cache is not None
        try:
            if not await self.cache.release_lock(lock_value):
                await self._release_lock(ref)
        except Exception as exc:
            self.log.warning("node_lock_release_failed", pod=ref, error=str(exc))

    async def _allocate(
        self, backend: Backend, requested: Sequence[int], node_devices: Sequence[Device]
    ) -> AllocationPlan:
        try:
            pod, node = await self._find(backend)
        except Exception as exc:
            raise AllocateError(f"cannot read the node or its pods: {exc}") from None
        if pod is None:
            await self._release_stale_lock(node)
            raise AllocateError(
                f"no pending pod on node {self.node} with {keys.BIND_PHASE}=allocating and "
                f"{backend.to_allocate_key} (was it scheduled by the HAMi scheduler?)"
            )
        plan = await self._write_plan(pod, backend, requested, node_devices)
        if plan.done:
            await self._release_lock(pod_ref(pod), known=node)
        self._allocated(plan, backend, "api")
        return plan

    async def _write_plan(
        self, pod: Pod, backend: Backend, requested: Sequence[int], node_devices: Sequence[Device]
    ) -> AllocationPlan:
        """Plan the pod's next container from the API server's copy and write it back
        (unguarded: the copy was just read); any failure fails the pod."""
        ref = pod_ref(pod)
        try:
            plan = await _plan(pod, backend, requested, node_devices)
            await _make_host_dirs(plan)
        except AllocateError as exc:
            await self._fail(pod, exc.cause)
            raise
        except OSError as exc:
            await self._fail(pod, f"cannot create host directory: {exc}")
            raise AllocateError(f"cannot create host directory: {exc}", ref) from None
        meta = metadata_of(pod)
        try:
            answer = await self.kube.patch_pod_annotations(
                meta["namespace"], meta["name"], plan.annotations
            )
        except Exception as exc:
            cause = f"cannot write {backend.to_allocate_key}: {exc}"
            await self._fail(pod, cause)
            raise AllocateError(cause, ref) from None
        self._remember(answer)
        return plan

    def _remember(self, answer: Any) -> None:
        """Keep the pod our write produced, so the next container plans from it."""
        if self.cache is not None and isinstance(answer, Mapping) and answer.get("metadata"):
            self.cache.remember(dict(answer))

    def _allocated(self, plan: AllocationPlan, backend: Backend, source: str) -> None:
        self.log.info(
            "allocated",
            pod=plan.pod,
            backend=backend.type_word,
            containers=[c.name for c in plan.containers],
            done=plan.done,
            read_from=source,
        )

    async def _fail(self, pod: Pod, cause: str) -> None:
        ref = pod_ref(pod)
        self.log.warning("allocate_failed", pod=ref, cause=cause)
        meta = metadata_of(pod)
        try:
            await self.kube.patch_pod_annotations(
                meta["namespace"], meta["name"], {keys.BIND_PHASE: BindPhase.FAILED.value}
            )
        except Exception as exc:
            self.log.warning("bind_phase_failed_not_written", pod=ref, error=str(exc))
        await self._release_lock(ref)

    async def _release_lock(
        self, ref: str, attempts: int = 5, known: Mapping[str, Any] | None = None
    ) -> None:
        """Remove the node lock if it names ``ref`` (guarded by resourceVersion).

        ``known`` is a Node read earlier in this call: trying its resourceVersion first saves
        a round trip per pod; a conflict (the node changed since) falls back to a fresh read.
        """
        for _ in range(attempts):
            try:
                node = known if known is not None else await self.kube.get_node(self.node)
                known = None
                value = annotations_of(node).get(keys.NODE_LOCK)
                lock = parse_lock(value)
                if value is None or (lock is not None and f"{lock.namespace}/{lock.pod}" != ref):
                    return
                rv = metadata_of(node).get("resourceVersion")
                await self.kube.patch_node_annotations(self.node, {keys.NODE_LOCK: None}, rv)
                self.log.debug("node_lock_released", pod=ref)
                return
            except Conflict:
                continue
            except Exception as exc:
                self.log.warning("node_lock_release_failed", pod=ref, error=str(exc))
                return
        self.log.warning("node_lock_release_failed", pod=ref, error="kept conflicting")

    async def _release_vendor_lock(self, key: str, ref: str) -> None:
        """Remove Go HAMi's vendor lock (``cambricon.com/dsmlu.lock``) after a pod's last
        container, as the vendor's plug-in does: the value names no pod, and the scheduler
        that took it lets one pod per node wait between bind and allocation."""
        for _ in range(3):
            try:
                node = await self.kube.get_node(self.node)
                if key not in annotations_of(node):
                    return
                rv = metadata_of(node).get("resourceVersion")
                await self.kube.patch_node_annotations(self.node, {key: None}, rv)
                self.log.debug("vendor_node_lock_released", pod=ref, lock=key)
                return
            except Conflict:
                continue
            except Exception as exc:
                self.log.warning("vendor_node_lock_release_failed", pod=ref, error=str(exc))
                return
        self.log.warning("vendor_node_lock_release_failed", pod=ref, error="kept conflicting")

    async def _release_stale_lock(self, node: Mapping[str, Any]) -> None:
        """With no pending pod, release the lock if it is stale (``hami.kube.nodelock``)."""
        value = annotations_of(node).get(keys.NODE_LOCK)
        if value is None:
            return
        now = self.now()
        view = judge_value(value, now, self.rules)
        stale, reason = view.free, view.reason
        if view.needs_pod and view.lock is not None:
            lock = view.lock
            try:
                holder: Pod | None = await self.kube.get_pod(lock.namespace, lock.pod)
            except NotFound:
                holder = None
            except Exception:
                return  # cannot tell: leave it
            verdict = judge_holder(lock, holder, self.node, now, self.rules)
            stale, reason = verdict.stale, verdict.reason
        if stale:
            rv = metadata_of(node).get("resourceVersion")
            with contextlib.suppress(Exception):
                await self.kube.patch_node_annotations(self.node, {keys.NODE_LOCK: None}, rv)
                self.log.info("stale_node_lock_released", lock=value, reason=reason)


async def _plan(
    pod: Pod, backend: Backend, requested: Sequence[int], node_devices: Sequence[Device]
) -> AllocationPlan:
    """``plan_allocation``, in a worker thread for a backend whose allocate blocks on the
    hardware (``allocate_does_io``: NVML making MIG instances)."""
    if backend.allocate_does_io:
        return await asyncio.to_thread(plan_allocation, pod, backend, requested, node_devices)
    return plan_allocation(pod, backend, requested, node_devices)


async def _make_host_dirs(plan: AllocationPlan) -> None:
    """The containers' host directories, in one trip to a worker thread (a trip per
    directory cost more than the directories: ~0.6 ms each on a busy machine)."""
    paths = [path for c in plan.containers for path in c.allocation.host_dirs]
    if paths:
        await asyncio.to_thread(_make_dirs, paths)


def _make_dirs(paths: Sequence[str]) -> None:
    for path in paths:
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o777)
