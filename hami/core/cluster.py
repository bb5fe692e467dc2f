"""The scheduler's picture of the cluster: devices per node, usage per device, decisions.

Pure and synchronous: the scheduler role feeds it Node and Pod objects (plain JSON) from
its watches and passes the time in; nothing here reads a clock or does I/O.

Usage is kept incrementally. Each pod that holds devices has one record (node, and per
device uuid what it holds); adding, changing or removing a record adjusts the node's
per-uuid totals, the device counters and the node's summaries, so a decision never scans
pods. A node's *summary* per device type (free devices, idle devices, largest free memory,
largest free cores) rules a node out in a few comparisons; nodes are kept in two sorted
lists by current utilisation (one per node policy), so a decision walks nodes in policy
order and stops after the first few that fit (see ``decide``).
"""

from __future__ import annotations

import bisect
import hashlib
import sys
from collections.abc import (
    Callable,
    Collection,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    Set,
)
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from types import MappingProxyType
from typing import Any, TypeVar

from hami.core import defrag, migfit, nofit, topology
from hami.core.defragpolicy import DEFRAG, DefragPolicy
from hami.core.fit import BINPACK, NodeFit, NodeMiss, PairScores, TypeView, fit_pod
from hami.core.podrecord import (
    NOTHING_MIG,
    NOTHING_WHOLE,
    PodRecord,
    Reservation,
    assignment_values,
    held_of,
    values_of,
)
from hami.core.quota import Quotas
from hami.core.requests import (
    DeviceKind,
    DeviceRequest,
    NodeReader,
    PodRequest,
    parse_quantity,
)
from hami.core.usage import DeviceState, Use, pod_usage, requesting
from hami.protocol import (
    ContainerDevice,
    NodeDevice,
    ProtocolError,
    decode_node_devices,
    decode_pod_devices,
    entry_containers,
    handshake,
    keys,
)
from hami.protocol.objects import annotations_of, metadata_of, pod_containers, pod_key
from hami.protocol.stamps import parse_unix_seconds

FINISHED_PHASES = ("Succeeded", "Failed")
# NodeState.whole_uuids of the nodes where no pod's decision is unreadable
_NO_UUIDS: frozenset[str] = frozenset()
# The empty mapping every NodeState and TypeState shares until it has entries (``_own``).
_EMPTY: Mapping[Any, Any] = MappingProxyType({})
K = TypeVar("K")
V = TypeVar("V")
DEFAULT_WINDOW = 4
# A Reported value marks its agent as one that heartbeats for this many handshake timeouts
# from its own time (120 s by default): longer than the timeout, so such an agent that goes
# silent keeps the §2 table, and longer than kube-controller-manager's node grace period
# (40-50 s), so a dead node is tainted NotReady before the allocatable rule takes it back.
REPORTED_WINDOW = 2
# An unbound decision counts this long after its vgpu-time: well above what a bind can take
# (bind_lock_wait 20 s, kube-scheduler's extender timeout 30 s), so a pod being bound right
# now never loses its hold, yet a bind that failed with the API server down frees the devices.
DEFAULT_DECISION_TIMEOUT = timedelta(seconds=90)
# A vgpu-time this far ahead of our clock is not one we wrote: the deadline runs from when
# the decision was first seen instead (protocol.md §2 "Far-off timestamps").
FUTURE_SLACK = timedelta(minutes=5)
# A walk this long without enough fits asks whether any node's summary allows the request.
PRECHECK_AFTER = 256
# A long candidate list (Cluster._member): a name is looked for this far either side of
# where it was; this many names per call are looked for along the whole list before it
# is read whole; at most this many names remembered where they moved to.
NEAR = 2048
SCANS = 4
MOVED_HINTS = 65536


@dataclass(slots=True, eq=False)
class TypeState:
    """One device type on one node."""

    kind: DeviceKind
    # A digest of the register value, or (no register value) of what the backend's
    # devices_from_node read from the Node as text: the devices are read again only when
    # it changes. A digest, not the text: ~500 bytes a node kept for one comparison.
    register_digest: bytes | None = None
    # False: the devices were read from the Node by the backend (kubelet capacity), not
    # from a register value; no heartbeat is kept for them, as Go HAMi keeps none.
    heartbeat: bool = True
    handshake_value: str | None = None  # the first of ``handshakes`` (this project's key first)
    handshakes: dict[str, str] = field(default_factory=dict)  # every heartbeat key present
    devices: list[DeviceState] = field(default_factory=list)
    error: str | None = None  # the register value does not parse
    kubelet_reason: str | None = None  # kubelet allocates none of the count resource
    kubelet_advertises: bool = False  # status.allocatable has the count resource above 0
    # The newest heartbeat since the register value changed: a Reported value's own time,
    # never later than when it was first seen (``_note_reported``); None: none.
    reported_at: datetime | None = None
    # key -> Reported value judged (this and the next: ``_EMPTY`` until there is one)
    reported_seen: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    score_value: str | None = None  # hami.io/node-{type}-score as last seen
    # read from it ({}: none, unread)
    pair_scores: PairScores = field(default_factory=lambda: _EMPTY)
    score_error: str | None = None  # why score_value does not read
    offers: frozenset[str] | None = None  # the kind's node_offers as last read; None: no rule
    available: bool = False
    reason: str | None = handshake.NODE_UNREGISTERED  # why unavailable
    view: TypeView = field(default_factory=lambda: TypeView(()))
    # summary, recomputed when usage or devices change
    free_devices: int = 0
    idle_devices: int = 0
    max_free_memory: int = 0
    max_free_cores: int = 0

    def summarise(self) -> None:
        free = idle = max_memory = max_cores = 0
        for device in self.devices:
            if not device.healthy or device.used >= device.count or device.exclusive_held:
                continue
            free += 1
            if device.used == 0:
                idle += 1
            max_memory = max(max_memory, device.free_memory)
            max_cores = max(max_cores, device.free_cores)
        self.free_devices, self.idle_devices = free, idle
        self.max_free_memory, self.max_free_cores = max_memory, max_cores

    def refresh_view(self) -> None:
        unavailable = None if self.available else (self.reason or "unavailable")
        self.view = TypeView(self.devices, unavailable, self.pair_scores, self.offers)


@dataclass(slots=True, eq=False)
class NodeState:
    name: str
    resource_version: str = ""
    lock: str | None = None  # hami.io/mutex.lock as last seen
    types: dict[str, TypeState] = field(default_factory=dict)
    views: dict[str, TypeView] = field(default_factory=dict)
    usage: dict[str, Use] = field(default_factory=dict)  # uuid -> held by all pods
    devices: dict[str, DeviceState] = field(default_factory=dict)  # uuid -> device
    exists: bool = True  # False: only pods name it (the Node is not known)
    utilisation: float = 0.0  # mean device utilisation, for the policy order
    order_key: float | None = None  # the utilisation it is indexed under, None: not indexed
    # Holds of pods whose decision cannot be read (PodRecord.whole): (type, named ids) ->
    # how many records hold it, and the uuids they make full (``_whole_uuids``).
    # Shared empty mappings until a node has one (``_own``): nearly no node ever does, and
    # an empty dict per node is 64 bytes x 65,000.
    whole: Mapping[tuple[str, frozenset[str]], int] = field(default_factory=lambda: _EMPTY)
    # (one shared empty set for the nodes with none: nearly all)
    whole_uuids: Set[str] = field(default_factory=lambda: _NO_UUIDS)
    # uuid -> MIG reservations
    mig: Mapping[str, migfit.MigHold] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, slots=True)
class HandshakeWrite:
    node: str
    resource_version: str
    annotations: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class AvailabilityChange:
    node: str
    type_word: str
    available: bool
    reason: str | None


@dataclass(slots=True)
class Decision:
    node: str | None
    fit: NodeFit | None = None
    score: float = 0.0
    failed: dict[str, str] = field(default_factory=dict)  # node -> reason (when no fit)
    evaluated: int = 0  # nodes fitted in detail


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """One device for metrics and explain."""

    node: str
    type_word: str
    device: DeviceState
    available: bool


class Candidates(Collection[str]):
    """A decision's candidate node names as the caller got them (a filter call's freshly
    decoded list), read only as far as the decision needs.

    Copying, converting or hashing every name costs more than deciding at tens of
    thousands of nodes, so that happens once, only on the paths that read every name
    (no fit, a short list, a busy node), via ``strings``; elements that are not strings
    (a malformed body) count as ``str()`` of them, as they always did.
    """

    __slots__ = ("_set", "_strings", "compared", "positions", "raw", "same", "scans")

    def __init__(self, raw: Collection[Any]) -> None:
        self.raw = raw
        self._strings: list[str] | None = None
        self._set: Collection[str] | None = None
        # whether raw equals ``compared`` (the cluster's remembered list when it looked)
        self.compared: list[str] | None = None
        self.same = False
        self.positions: dict[str, int] | None = None  # read whole in this call: where
        self.scans = 0  # names looked for along the whole list in this call

    def __len__(self) -> int:
        return len(self.raw)

    def __iter__(self) -> Iterator[str]:
        return iter(self.strings())

    def __contains__(self, name: object) -> bool:
        return name in self.as_set()

    def strings(self) -> list[str]:
        """Every name as a string, in order (the list itself when it holds only strings)."""
        if self._strings is None:
            raw = self.raw
            if isinstance(raw, list) and raw and set(map(type, raw)) == {str}:
                self._strings = raw
            else:
                self._strings = [n if type(n) is str else str(n) for n in raw]
        return self._strings

    def as_set(self) -> Collection[str]:
        if self._set is None:
            raw = self.raw
            if isinstance(raw, set | frozenset) and all(type(n) is str for n in raw):
                self._set = raw
            else:
                self._set = set(self.strings())
        return self._set

    def sequence(self) -> Sequence[Any] | None:
        """The names as an indexable list (positions mean something), else None."""
        raw = self.raw
        return raw if isinstance(raw, list | tuple) else None


class Cluster:
    def __init__(
        self,
        kinds: Sequence[DeviceKind],
        *,
        handshake_timeout: timedelta = timedelta(seconds=60),
        node_policy: str = BINPACK,
        device_policy: str = "spread",
        decision_timeout: timedelta = DEFAULT_DECISION_TIMEOUT,
    ) -> None:
        self.kinds = {kind.type_word: kind for kind in kinds}
        self.handshake_timeout = handshake_timeout
        self.decision_timeout = decision_timeout
        self.node_policy = node_policy
        self.device_policy = device_policy
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, PodRecord] = {}
        # Reservations (filter's holds not yet written on their pod): key -> reserved_at,
        # in the order they were made, so the oldest are checked first.
        self.reservations: dict[str, float] = {}
        self.quotas = Quotas(kinds)  # namespace quotas, charged by every record (_apply)
        # Unbound decisions past their deadline: known, not counted (see expire_decisions).
        self.lapsed: dict[str, PodRecord] = {}
        self._clock: datetime | None = None  # the latest time passed in
        self._asc: list[tuple[float, str]] = []  # (utilisation, name): spread order
        self._desc: list[tuple[float, str]] = []  # (-utilisation, name): binpack order
        self._indexed: dict[str, NodeState] = {}  # the nodes in those lists
        # Bumped on every change a decision reads (nodes, views, records): no-fit answers
        # are reused while it stays the same (hami.core.nofit).
        self.generation = 0
        self.no_fit = nofit.NoFitCache()
        self.summaries = nofit.Summaries()  # nodes grouped by summary (no-fit answers)
        # The latest long candidate list that had to be read whole, and where each of
        # its names was: a later list with a name at the same place holds it (checked
        # in O(1)), which is what spares reading every name of every call.
        self._seen_names: list[str] = []
        self._seen_at: dict[str, int] = {}
        self._moved: dict[str, int] = {}  # names found elsewhere in later lists
        # Nodes and pod keys whose state changed since a reader (the metrics cache) took
        # them; None until a reader installs a set, so nothing piles up unread.
        self.changed_nodes: set[str] | None = None
        self.changed_pods: set[str] | None = None
        # The ``defrag`` node policy's workload window, cached node states and the
        # nodes' free CPU and memory (``set_node_room``).
        self.defrag = DefragPolicy()

    # ------------------------------------------------------------------ nodes

    def upsert_node(
        self, obj: Mapping[str, Any], now: datetime
    ) -> tuple[list[str], list[AvailabilityChange]]:
        """Take a Node's annotations. Returns (new register errors, availability changes)."""
        if self._clock is None:
            self.expire_decisions(now)  # pods listed before any time was known
        self._clock = now
        meta = metadata_of(obj)
        # Interned (as pod records' node names are): one string per node name, not one per pod.
        name = sys.intern(str(meta.get("name") or ""))
        annotations = annotations_of(obj)
        node = self.nodes.get(name)
        if node is None:
            node = self.nodes[name] = NodeState(name)
        node.exists = True
        node.resource_version = str(meta.get("resourceVersion") or "")
        node.lock = annotations.get(keys.NODE_LOCK)
        capacity, allocatable = _resources(obj, "capacity"), _resources(obj, "allocatable")
        errors: list[str] = []
        devices_changed = False
        for word, kind in self.kinds.items():
            register = annotations.get(kind.register_annotation())
            read = None
            if register is None and kind.devices_from_node is not None:
                read = _read_node(kind.devices_from_node, obj)
                register = None if read is None else read[0]
            shakes = {k: annotations[k] for k in kind.heartbeat_keys() if k in annotations}
            state = node.types.get(word)
            if state is None:
                if register is None and not shakes:
                    continue
                state = node.types[word] = TypeState(kind)
            state.handshakes = shakes
            state.handshake_value = next(iter(shakes.values()), None)
            resource = kind.resources.count
            state.kubelet_reason = _kubelet_says_no(resource, capacity, allocatable)
            state.kubelet_advertises = (_count(allocatable.get(resource)) or 0) > 0
            if kind.node_offers is not None:
                offers = kind.node_offers(annotations)
                if offers != state.offers:  # e.g. hami-vnpu-core changed: the view is redone
                    state.offers = offers
                    devices_changed = True
            score = annotations.get(topology.score_key(word))
            if score != state.score_value:  # topology-aware's link scores
                state.score_value = score
                state.pair_scores, state.score_error = topology.read_pair_scores(score)
                devices_changed = True
            digest = None if register is None else _digest(register)
            if digest != state.register_digest:
                state.register_digest = digest
                state.heartbeat = read is None
                state.reported_at = None  # a Reported seen before it no longer counts
                error = self._load_register(node, state, read if read is not None else register)
                devices_changed = True
                if error:
                    # The key goes with the error so the log names node, key and reason.
                    errors.append(f"{kind.register_annotation()}: {error}")
            _note_reported(state, shakes, now)
        changes = self._decide_safely(node, now, write=False)[1]
        if devices_changed or changes:
            self._node_changed(node)
        return errors, changes

    def group_summaries(self) -> None:
        """Group the nodes changed since the last grouping by summary, as the first no-fit
        answer would (every node after a start: ~0.35 s at 65,000 nodes); the scheduler
        role calls it once the initial lists are in, so no request pays for it."""
        self.summaries.sync(self.nodes)
        self.summaries.prepare()

    def prefill_defrag(self, rows: int) -> bool:
        """Fill up to ``rows`` of the ``defrag`` policy's stale rows ahead of decisions
        (``DefragPolicy.prefill``, over the nodes decisions weigh); True while some are
        left."""
        return self.defrag.prefill(self._indexed, rows)

    def set_node_room(self, name: str, free_cpu_milli: int, free_memory_mib: int) -> None:
        """The node's CPU and memory not requested by its pods (what the ``defrag``
        policy weighs besides devices; unknown nodes count as having room)."""
        self.defrag.set_room(name, free_cpu_milli, free_memory_mib)

    def decide_room_only(
        self, pod_room: tuple[int, int], candidates: Collection[str] | None = None
    ) -> str | None:
        """Under the ``defrag`` policy, the node for a pod that asks for no device: where
        its CPU and memory strand the least GPU. Only nodes with devices and a known
        room (``set_node_room``) are weighed; None: none of them takes it."""
        names, indexed = self._schedulable(_candidates(candidates))
        return self.defrag.choose_room_only(names, indexed, pod_room)[0]

    def weigh(
        self,
        request: PodRequest,
        candidates: Collection[str] | None = None,
        pod_room: tuple[int, int] = (0, 0),
        *,
        observe: bool = True,
    ) -> dict[str, float]:
        """The ``defrag`` policy's cost of placing ``request`` on each candidate where it
        fits (lower strands less GPU; absent: no fit, or not schedulable), for a caller
        that scores nodes another scheduler chooses between. With ``observe`` the pod's
        shape joins the policy's workload window, as a decision's does."""
        if observe:
            shape = defrag.shape_of(request, *pod_room)
            if shape is not None:
                self.defrag.shapes.observe(shape)
        names, indexed = self._schedulable(_candidates(candidates))
        device_policy = request.device_policy or self.device_policy
        return self.defrag.costs(names, indexed, request, device_policy, pod_room)

    def _load_register(
        self, node: NodeState, state: TypeState, read: _Read | str | None = None
    ) -> str | None:
        """The type's devices from the backend's reading or the register value (text)."""
        for device in state.devices:
            node.devices.pop(device.uuid, None)
        state.devices = []
        state.error = None
        if isinstance(read, tuple):
            _source, devices, state.error = read
            state.devices = [_device_state(d) for d in devices]
            state.devices.sort(key=lambda d: d.index)
        elif read is not None:
            try:
                decoded = decode_node_devices(read)
            except ProtocolError as exc:
                state.error = str(exc)
            else:
                state.devices = [_device_state(d) for d in decoded]
                state.devices.sort(key=lambda d: d.index)
        for device in state.devices:
            node.devices[device.uuid] = device
        if node.whole or node.whole_uuids:
            node.whole_uuids = _whole_uuids(node)  # which devices a claim names may change
        for device in state.devices:
            device.set_use(node.usage.get(device.uuid), whole=device.uuid in node.whole_uuids)
        migfit.attach(node.mig, state.devices)
        state.summarise()
        return state.error

    def delete_node(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        if self.changed_nodes is not None:
            self.changed_nodes.add(name)
        self._changed(name)
        self._unindex(node)
        self.defrag.drop_node(name)
        if any(record.node == name for record in self.pods.values()):
            # Pods still name it: keep their usage, forget the devices.
            node.exists = False
            node.types.clear()
            node.views.clear()
            node.devices.clear()
            node.whole_uuids = _NO_UUIDS
            node.resource_version = ""
            node.lock = None
        else:
            del self.nodes[name]

    def refresh(self, now: datetime) -> tuple[list[HandshakeWrite], list[AvailabilityChange]]:
        """The handshake pass: availability of every node and type, and what to write.

        It also lapses unbound decisions past their deadline (``expire_decisions``).
        """
        self.expire_decisions(now)
        writes: list[HandshakeWrite] = []
        changes: list[AvailabilityChange] = []
        for node in self.nodes.values():
            if not node.exists:
                continue
            annotations, node_changes = self._decide_safely(node, now, write=True)
            if annotations:
                writes.append(HandshakeWrite(node.name, node.resource_version, annotations))
            if node_changes:
                changes.extend(node_changes)
                self._node_changed(node)
        return writes, changes

    def _decide_safely(
        self, node: NodeState, now: datetime, *, write: bool
    ) -> tuple[dict[str, str], list[AvailabilityChange]]:
        """``_decide_availability``, but a failure costs only this node, never the pass.

        Nothing should raise here (every value is parsed totally); if something still does,
        the node's types turn unavailable with the error as their reason, which the
        scheduler logs and the filter shows, and the other nodes are decided as usual.
        """
        try:
            return self._decide_availability(node, now, write=write)
        except Exception as exc:
            reason = f"scheduler error deciding this node's availability: {exc!r}"
            changes: list[AvailabilityChange] = []
            for word, state in node.types.items():
                if state.available:
                    changes.append(AvailabilityChange(node.name, word, False, reason))
                state.available, state.reason = False, reason
                state.refresh_view()
                node.views[word] = state.view
                self._changed(node.name)
            return {}, changes

    def _decide_availability(
        self, node: NodeState, now: datetime, *, write: bool
    ) -> tuple[dict[str, str], list[AvailabilityChange]]:
        writes: dict[str, str] = {}
        changes: list[AvailabilityChange] = []
        for word, state in node.types.items():
            if state.heartbeat:
                available, reason, stamps = self._decide_keys(state, now)
            else:  # read by the backend from the Node (capacity): there while it is read
                available, reason, stamps = True, None, {}
            if reason == handshake.HANDSHAKE_TIMED_OUT and self._not_heartbeating(state, now):
                available, reason = True, None
            if state.kubelet_reason is not None:
                # protocol.md §2 "kubelet's word wins when it says no": the device plugin is
                # gone (or every device unhealthy) well before the handshake times out.
                available, reason = False, state.kubelet_reason
            if available and state.register_digest is None:
                available, reason = False, handshake.NODE_UNREGISTERED
            if available and state.error is not None:
                available, reason = False, state.error
            if write:
                writes.update(stamps)
            if available != state.available or reason != state.reason:
                if available != state.available:
                    changes.append(AvailabilityChange(node.name, word, available, reason))
                state.available, state.reason = available, reason
                state.refresh_view()
                node.views[word] = state.view
                self._changed(node.name)
            elif node.views.get(word) is not state.view:
                state.refresh_view()
                node.views[word] = state.view
                self._changed(node.name)
        return writes, changes

    def _not_heartbeating(self, state: TypeState, now: datetime) -> bool:
        """protocol.md §2 "Agents that never heartbeat", judged by the age of the type's
        newest Reported: an agent that stopped writing it (a Go HAMi plugin upgraded from
        <= 2.7 to >= 2.8) or an old stamp it left keep the type while kubelet advertises it.
        A Reported counts for ``REPORTED_WINDOW`` handshake timeouts: an agent that
        heartbeats and goes silent is still dropped when its stamp expires, and stays out
        until its last Reported is that old (then a dead node is NotReady and tainted)."""
        if not state.kubelet_advertises:
            return False
        at = state.reported_at
        # Subtract, never add: a stamp near year 1 or 9999 cannot overflow this.
        return at is None or _utc(now) - at > self.handshake_timeout * REPORTED_WINDOW

    def _decide_keys(
        self, state: TypeState, now: datetime
    ) -> tuple[bool, str | None, dict[str, str]]:
        """protocol.md §2 over each heartbeat key of a type: available when any key says so
        (this project's key's reason first when none does); ``Requesting_`` goes to the keys
        found, or to every key of the type when none is there yet."""
        has_register = state.register_digest is not None
        found = state.handshakes or dict.fromkeys(state.kind.heartbeat_keys())
        decisions = [
            (
                key,
                handshake.decide(
                    value, has_register=has_register, now=now, timeout=self.handshake_timeout
                ),
            )
            for key, value in found.items()
        ]
        stamps = {key: d.write for key, d in decisions if d.write is not None}
        if any(d.available for _key, d in decisions):
            return True, None, stamps
        return False, decisions[0][1].reason, stamps

    def _changed(self, node: str) -> None:
        """Something a decision reads changed on ``node`` (hami.core.nofit)."""
        self.generation += 1
        self.no_fit.changed(self.generation, node)
        self.summaries.changed(node)
        self.defrag.forget(node)

    def _node_changed(self, node: NodeState) -> None:
        self._changed(node.name)
        if self.changed_nodes is not None:
            self.changed_nodes.add(node.name)
        for word, state in node.types.items():
            state.summarise()
            state.refresh_view()
            node.views[word] = state.view
        total = 0.0
        count = 0
        for state in node.types.values():
            for device in state.devices:
                total += device.utilisation()
                count += 1
        node.utilisation = total / count if count else 0.0
        self._reindex(node)

    def _reindex(self, node: NodeState) -> None:
        schedulable = node.exists and any(
            state.available and state.free_devices for state in node.types.values()
        )
        key = node.utilisation if schedulable else None
        if key == node.order_key:
            return
        self._unindex(node)
        if key is not None:
            bisect.insort(self._asc, (key, node.name))
            bisect.insort(self._desc, (-key, node.name))
            node.order_key = key
            self._indexed[node.name] = node

    def _unindex(self, node: NodeState) -> None:
        if node.order_key is None:
            return
        for items, entry in (
            (self._asc, (node.order_key, node.name)),
            (self._desc, (-node.order_key, node.name)),
        ):
            position = bisect.bisect_left(items, entry)
            if position < len(items) and items[position] == entry:
                del items[position]
        node.order_key = None
        self._indexed.pop(node.name, None)

    # ------------------------------------------------------------------ pods

    def pod_record(
        self, obj: Mapping[str, Any], previous: PodRecord | None = None, key: str | None = None
    ) -> tuple[PodRecord | None, list[str]]:
        """What a pod holds according to its annotations, and any decode errors.

        A value that cannot be decoded fails closed (never frees room): the type keeps
        what ``previous`` (the pod's last record) held of it, or, when no readable value
        came before, the devices the pod's annotations still name are held entirely, and
        every device of the type on the node when they name none (``PodRecord.whole``).
        Each error says what was counted instead.
        """
        meta = metadata_of(obj)
        annotations = annotations_of(obj)
        status = obj.get("status") or {}
        spec = obj.get("spec") or {}
        bound_to = spec.get("nodeName")
        # kubelet runs the pod where it is bound even if vgpu-node is missing
        node = annotations.get(keys.VGPU_NODE) or (bound_to if isinstance(bound_to, str) else "")
        if not node or status.get("phase") in FINISHED_PHASES:
            return None, []
        node = sys.intern(node)  # shared with the NodeState's name: one copy per node
        bound = bool(bound_to)
        if (
            annotations.get(keys.BIND_PHASE) == keys.BindPhase.FAILED
            and status.get("phase") != "Running"
        ):
            # Its bind or its Allocate failed (or it lost its Allocate and was failed):
            # kubelet admits a pod all or nothing, so it will not start with these devices.
            # A pod that runs all the same counts: kubelet's word wins over the annotation.
            return None, []
        uid = str(meta.get("uid") or "")
        last = previous if _same_decision(previous, node, uid) else None
        specs, init_count = pod_containers(obj)
        usage: dict[str, Use] = {}
        types: dict[str, str] = {}
        assignment: dict[str, Sequence[Sequence[ContainerDevice]]] = {}
        values: list[tuple[str, str]] = []  # the readable values, as text (PodRecord.values)
        whole: dict[str, frozenset[str]] = {}
        errors: list[str] = []
        for kind in self.kinds.values():
            word = kind.type_word
            value = annotations.get(kind.allocated_key)
            if not value:
                continue
            try:
                containers = decode_pod_devices(value)
            except ProtocolError as exc:
                kept = _kept_hold(last, word)
                if kept:
                    for uuid, use in kept.items():
                        usage.setdefault(uuid, Use()).add(use)
                        types[uuid] = word
                    if last is not None:
                        for last_word, text in last.value_pairs():
                            if last_word == word:
                                assignment[word] = decode_pod_devices(text)
                                values.append((word, text))
                    counted = f"what its last readable value held ({', '.join(sorted(kept))})"
                else:
                    named = _named_devices(
                        value,
                        annotations.get(kind.to_allocate_key),
                        requesting(specs, kind.resources),
                    )
                    whole[word] = frozenset(named)
                    counted = _whole_text(named, word, node)
                until = "until the pod is deleted or its value is fixed"
                if not bound:
                    until += " (an unbound decision: at most until scheduler.decision_timeout)"
                errors.append(
                    f"{kind.allocated_key}: {exc}; counted as holding {counted} {until}; {_FIX}"
                )
                continue
            # Go HAMi's values may lack the entries of containers without this type.
            positions = entry_containers(len(containers), requesting(specs, kind.resources))
            assignment[word] = containers
            values.append((word, value))
            for uuid, use in pod_usage(containers, init_count, positions).items():
                usage.setdefault(uuid, Use()).add(use)
                types[uuid] = word
        if not usage and not whole:
            return None, errors
        mig, mig_error = migfit.pod_mig(
            annotations.get(keys.MIG_ALLOCATIONS), assignment, last.mig if last else None
        )
        if mig_error:
            errors.append(f"{keys.MIG_ALLOCATIONS}: {mig_error}")
        # only an unbound decision's deadline reads it: a bound pod keeps no copy
        stamp = None if bound else annotations.get(keys.VGPU_TIME)
        held = held_of(usage, types)
        record = PodRecord(
            pod_key(obj) if key is None else key,  # upsert_pod's: the key of Cluster.pods
            uid,
            node,
            held,
            bound,
            stamp,
            values=values_of(values, held),
            whole=whole or NOTHING_WHOLE,
            mig=mig or NOTHING_MIG,
        )
        return record, errors

    def upsert_pod(self, obj: Mapping[str, Any], now: datetime | None = None) -> list[str]:
        """Take a Pod's state; returns decode errors of its device annotations.

        ``now`` (default: the latest time passed to any method) judges an unbound
        decision's deadline at once, so a re-listed decision whose bind failed long ago
        never counts, not even until the next pass.
        """
        if now is not None:
            self._clock = now
        key = pod_key(obj)  # one string, the record's key too (not interned: half a
        # million pods would each add an entry to the interpreter's table of interned strings)
        current = self.pods.get(key)
        if current is not None:
            key = current.key  # the string the record and Cluster.pods already hold
        last = current if current is not None and not current.reserved else self.lapsed.get(key)
        record, errors = self.pod_record(obj, last, key)
        if current is not None and current.reserved and _keeps_reservation(obj, record, current):
            return errors
        if record is None or record.bound:
            self._set_record(key, record)
            return errors
        record = self._with_deadline(key, record)
        if not self._past_deadline(record):
            self._set_record(key, record)
            return errors
        if current is not None and current.reserved:
            # The same hold from an old decision (bind stamps its write now): an event
            # from before bind's write, the reservation stands.
            return errors
        self._set_record(key, None)
        self.lapsed[key] = record
        return errors

    def _with_deadline(self, key: str, record: PodRecord) -> PodRecord:
        """``record`` with the start of its deadline: kept from the same decision seen
        before, else its vgpu-time, else (unreadable or absurd) the time it is seen."""
        previous = self.pods.get(key) or self.lapsed.get(key)
        if (
            previous is not None
            and previous.since is not None
            and not previous.reserved
            and previous.stamp == record.stamp
            and _same_hold(previous, record)
        ):
            return replace(record, since=previous.since)
        stamp = parse_unix_seconds(record.stamp)
        clock = self._clock
        if stamp is not None and (clock is None or stamp - clock <= FUTURE_SLACK):
            return replace(record, since=stamp)
        return replace(record, since=clock)

    def _past_deadline(self, record: PodRecord) -> bool:
        if record.bound or record.since is None or self._clock is None:
            return False
        # Subtract, never add: no stamp can overflow this.
        return self._clock - record.since > self.decision_timeout

    def expire_decisions(self, now: datetime) -> list[str]:
        """Stop counting unbound decisions older than ``decision_timeout``; their keys.

        A pod that is bound always counts. A decision whose bind failed, or that was never
        bound (the API server was down, kube-scheduler gave up), holds nothing after its
        deadline; if the pod is bound later after all, its next event counts it again.
        """
        self._clock = now
        expired: list[str] = []
        for key, record in list(self.pods.items()):
            if record.bound or record.reserved:
                continue  # a reservation has its own deadline (expire_reservations)
            if record.since is None or record.since - now > FUTURE_SLACK:
                # A decision seen before any time was: its deadline starts now.
                self.pods[key] = replace(record, since=now)
            elif self._past_deadline(record):
                self._set_record(key, None)
                self.lapsed[key] = record
                expired.append(key)
        return expired

    def delete_pod(self, key: str) -> None:
        self._set_record(key, None)

    def set_hold(
        self, key: str, node: str, usage: Mapping[str, Use], types: Mapping[str, str]
    ) -> None:
        """What ``key`` holds on ``node`` (device uuid -> use; ``types``: uuid -> type word)
        when another allocator placed it (the DRA mode's allocated ResourceClaims): counted
        as a bound pod's hold. Empty ``usage`` drops it."""
        record = None
        if usage:
            record = PodRecord(sys.intern(key), "", sys.intern(node), held_of(usage, types), True)
        self._set_record(sys.intern(key), record)

    def _set_record(self, key: str, record: PodRecord | None) -> None:
        self.lapsed.pop(key, None)
        self.reservations.pop(key, None)
        if record is not None and record.reserved:
            self.reservations[key] = record.reserved_at  # (re-)inserted last: oldest first
        if self.changed_pods is not None:
            self.changed_pods.add(key)
        old = self.pods.get(key)
        if old is not None and record is not None and _same_hold(old, record):
            if not _identical(old, record):
                self.pods[key] = record  # the same hold; its bookkeeping may differ
            # else the old record stays: a relist then leaves no new objects behind for
            # the collector to walk (the old one is frozen: hami.scheduler.heap)
            return
        if old is not None:
            del self.pods[key]
            self._apply(old, -1)
        if record is not None:
            self.pods[key] = record
            self._apply(record, 1)

    def _apply(self, record: PodRecord, sign: int) -> None:
        self._changed(record.node)
        usage = record.usage
        self.quotas.hold(record.key, usage, record.types, sign)
        node = self.nodes.get(record.node)
        if node is None:
            node = self.nodes[record.node] = NodeState(record.node, exists=False)
        for uuid, use in usage.items():
            total = node.usage.setdefault(uuid, Use())
            total.add(use, sign)
            if total.is_zero():
                del node.usage[uuid]
                total = Use()
            device = node.devices.get(uuid)
            if device is not None:
                device.set_use(total, whole=uuid in node.whole_uuids)
        if record.whole:
            whole = node.whole = _own(node.whole)
            for claim in record.whole.items():
                count = whole.get(claim, 0) + sign
                if count > 0:
                    whole[claim] = count
                else:
                    whole.pop(claim, None)
            held = _whole_uuids(node)
            for uuid in held ^ node.whole_uuids:
                device = node.devices.get(uuid)
                if device is not None:
                    device.set_use(node.usage.get(uuid), whole=uuid in held)
            node.whole_uuids = held
        if record.mig:
            node.mig = _own(node.mig)
            migfit.apply_hold(node.mig, record.mig, usage, sign, node.devices)
        if not node.exists and not node.usage and not node.whole and not node.mig:
            self._unindex(node)
            del self.nodes[record.node]
            return
        self._node_changed(node)

    # ------------------------------------------------------------------ decisions

    def reserve(
        self,
        key: str,
        uid: str,
        node: str,
        fit: NodeFit,
        *,
        at: float = 0.0,
        decision: Mapping[str, str | None] | None = None,
        pod_version: str | None = None,
    ) -> PodRecord | None:
        """Hold ``fit`` for the pod at once; returns the record it replaced.

        ``at`` is the scheduler's monotonic time (``expire_reservations`` measures from
        it); ``decision`` the annotations bind will write. Until the pod's watch events
        show that decision, they do not undo the hold (``upsert_pod``).
        """
        previous = self.pods.get(key)
        held = held_of(fit.usage, fit_types(fit))
        record = PodRecord(
            key,
            uid,
            node,
            held,
            reservation=Reservation(at, decision, pod_version),
            values=assignment_values(fit.assignment, held),
            mig=migfit.fit_mig(fit.mig) or NOTHING_MIG,
        )
        self._set_record(key, record)
        return previous

    def expire_reservations(
        self, now: float, timeout: float, keep: Collection[str] = (), *, full: bool = True
    ) -> list[str]:
        """Release reservations made more than ``timeout`` before ``now`` (monotonic
        seconds) whose bind never came; returns their keys. ``keep``: pods being bound now.
        With ``full=False`` only the oldest are looked at, up to the first one still in
        time (cheap enough for every filter call)."""
        expired: list[str] = []
        for key, at in list(self.reservations.items()):
            if now - at <= timeout:
                if full:
                    continue
                break
            if key in keep:
                continue
            self._set_record(key, None)
            expired.append(key)
        return expired

    def rollback(self, key: str, previous: PodRecord | None) -> None:
        """Undo ``reserve``: the pod holds what it held before."""
        self._set_record(key, previous)

    def release(self, key: str) -> None:
        self._set_record(key, None)

    def decide(
        self,
        request: PodRequest,
        candidates: Collection[str] | None = None,
        *,
        window: int = DEFAULT_WINDOW,
        namespace: str | None = None,
        pod_room: tuple[int, int] = (0, 0),
    ) -> Decision:
        """Choose a node and devices for ``request`` among ``candidates`` (None: all).

        Nodes are visited in node-policy order of their current utilisation (binpack: most
        used first, spread: least used first; ties by name); each is ruled out by its
        summary or fitted in detail. The first ``window`` nodes that fit are scored with
        the pod's own request added, and the best of them wins (ties by name). When none
        fits, every candidate gets its reason.

        With ``namespace``, a fit must also fit that namespace's quota (``hami.core.quota``):
        a pod that cannot fit it anywhere is refused before any node is fitted.

        The candidates are read only as far as the answer needs (``Candidates``): a
        placement costs the nodes visited, not the length of the list.

        Under the ``defrag`` node policy (``hami.core.defragpolicy``) every candidate the
        summaries allow is weighed instead, by the GPU capacity the placement would
        strand; ``pod_room`` is the pod's CPU millicores and memory MiB requests.
        """
        cands = _candidates(candidates)
        if namespace is not None:
            over = self.quotas.precheck(namespace, request)
            if over is not None:
                names = self.nodes.keys() if cands is None else cands.strings()
                return Decision(None, failed=dict.fromkeys(names, over))
        no_fit_key = self._no_fit_key(request, cands, namespace)
        known = self._known_no_fit(request, cands, namespace, no_fit_key)
        if known is not None:
            return Decision(None, failed=known)  # asked before, and still nothing fits
        node_policy = request.node_policy or self.node_policy
        device_policy = request.device_policy or self.device_policy
        needs = _needs(request)
        if node_policy == DEFRAG:
            if not self._may_fit_anywhere(needs):
                # no node's summary allows it: nothing to weigh
                failed = self._no_fit(request, cands, needs, namespace, no_fit_key)
                return Decision(None, failed=failed, evaluated=0)
            weighed, indexed = self._schedulable(cands)
            choice, looked = self.defrag.choose(
                weighed,
                indexed,
                request,
                device_policy,
                pod_room,
                lambda fit: self._quota_miss(namespace, fit) is not None,
            )
            if choice is not None:
                return Decision(choice.node, choice.fit, -choice.cost, evaluated=looked)
            failed = self._no_fit(request, cands, needs, namespace, no_fit_key)
            return Decision(None, failed=failed, evaluated=looked)
        binpack = node_policy == BINPACK
        found: list[tuple[float, str, NodeFit]] = []
        evaluated = 0
        for name, node in self._walk(cands, binpack, needs):
            evaluated += 1
            result = fit_pod(node.views, request, device_policy)
            if isinstance(result, NodeFit) and not self._quota_miss(namespace, result):
                count = len(node.devices) or 1
                score = node.utilisation + result.utilisation_delta / count
                found.append((-score if binpack else score, name, result))
                if len(found) >= window:
                    break
        if found:
            key, name, fit = min(found, key=lambda item: (item[0], item[1]))
            return Decision(name, fit, -key if binpack else key, evaluated=evaluated)
        failed = self._no_fit(request, cands, needs, namespace, no_fit_key)
        return Decision(None, failed=failed, evaluated=evaluated)

    def _no_fit(
        self,
        request: PodRequest,
        cands: Candidates | None,
        needs: tuple[Need, ...],
        namespace: str | None,
        key: Hashable,
    ) -> dict[str, str]:
        """Every candidate's reason when none fits (``hami.core.nofit``): shared, not to
        be changed, and kept for the same question (``key``)."""
        names: Collection[str] = self.nodes.keys() if cands is None else cands.strings()
        failed: dict[str, str]
        if len(names) <= nofit.DETAIL_NODES:
            failed = self.explain(request, names, namespace=namespace)
            detailed: Sequence[str] = list(failed)
        else:
            self.summaries.sync(self.nodes)
            failed, detailed = self.summaries.reasons(
                names, needs, lambda allowed: self.explain(request, allowed, namespace=namespace)
            )
        kept = None
        if cands is not None and cands.sequence() is not None:
            # the key holds a sample of the names; these tell a hit from a look-alike
            seen = self._seen_names
            kept = seen if cands.compared is seen and cands.same else list(cands.strings())
        self.no_fit.put(key, nofit.Answer(self.generation, failed, tuple(detailed), kept))
        return failed

    def _known_no_fit(
        self,
        request: PodRequest,
        cands: Candidates | None,
        namespace: str | None,
        key: Hashable,
    ) -> dict[str, str] | None:
        """The answer to the same question asked before, brought up to date by looking
        again only at the nodes changed since (and, under a quota, those answered in
        detail); None when there is none, or one of them fits now (then the question is
        decided afresh)."""
        answer = self.no_fit.get(key)
        if answer is None:
            return None
        if answer.names is not None and (cands is None or not self._same(cands, answer.names)):
            return None  # another list with the same sampled key
        if answer.generation == self.generation:
            return answer.failed
        changed = None if cands is None else self.no_fit.changed_since(answer.generation)
        if changed is None or len(changed) > nofit.MAX_RECHECK:
            return None  # every node is a candidate (new ones too), or too much changed
        old = answer.failed
        again = [name for name in changed if name in old]
        if namespace is not None and any(
            r.limit is not None for r in self.quotas.status(namespace)
        ):
            # a detailed reason can also be the namespace's quota, which any pod changes
            again.extend(name for name in answer.detailed if name not in changed)
        needs = _needs(request)
        # as when it was computed: by the length of the list (repeats count), not the answer
        asked = answer.names if answer.names is not None else old
        summaries = len(asked) > nofit.DETAIL_NODES
        update: dict[str, str] = {}
        detailed: list[str] = []
        for name in again:
            why = nofit.summary_reason(self.nodes.get(name), needs) if summaries else None
            if why is None:
                why = self.explain(request, [name], namespace=namespace)[name]
                if not why:
                    return None  # it fits now
                detailed.append(name)
            update[name] = why
        failed = old if all(old[n] == why for n, why in update.items()) else {**old, **update}
        self.no_fit.put(key, nofit.Answer(self.generation, failed, tuple(detailed), answer.names))
        return failed

    def _no_fit_key(
        self, request: PodRequest, cands: Candidates | None, namespace: str | None
    ) -> Hashable:
        """What a no-fit answer depends on besides the generation (O(1) in the number of
        candidates: a sample of them, the rest is compared on a hit)."""
        limits = None
        if namespace is not None:
            limits = tuple((r.resource.name, r.limit) for r in self.quotas.status(namespace))
        shape = nofit.request_shape(request, request.device_policy or self.device_policy)
        if cands is None:
            names: Hashable = None
        else:
            sequence = cands.sequence()
            names = nofit.sampled_key(sequence) if sequence is not None else tuple(cands.strings())
        return (shape, limits, names)

    def _quota_miss(self, namespace: str | None, fit: NodeFit) -> str | None:
        """Why ``fit`` would take the namespace over its quota, or None."""
        if namespace is None:
            return None
        return self.quotas.exceeded_by_hold(namespace, fit.usage, fit_types(fit))

    def _walk(
        self, cands: Candidates | None, binpack: bool, needs: tuple[Need, ...]
    ) -> Iterator[tuple[str, NodeState]]:
        """The candidates their summaries do not rule out, in policy order.

        A short list (under an eighth of the indexed nodes) is a set, walked along the
        index for a while and then sorted; a long one is walked along the index, and
        only the nodes the summaries allow are looked up in it (``_member``). Either
        stops early when no node's summary allows the request (``_may_fit_anywhere``):
        a pod that fits nowhere does not walk every node.
        """
        index = self._desc if binpack else self._asc
        nodes = self.nodes
        if cands is not None and len(cands) * 8 < len(index):
            yield from self._walk_few(cands, index, binpack, needs)
            return
        member = None if cands is None else self._member(cands)
        for step, (_key, name) in enumerate(index):
            if step == PRECHECK_AFTER and not self._may_fit_anywhere(needs):
                return
            node = nodes[name]
            if _may_fit(node, needs) and (member is None or member(name)):
                yield name, node

    def _schedulable(
        self, cands: Candidates | None
    ) -> tuple[Collection[str], dict[str, NodeState]]:
        """The candidates' names (None: every indexed node; a name repeated in the list
        is weighed again, with the same result) and the nodes a policy that weighs them
        all may use: only indexed ones (schedulable, some device free)."""
        names = self._indexed.keys() if cands is None else cands.strings()
        return names, self._indexed

    def _walk_few(
        self,
        cands: Candidates,
        index: list[tuple[float, str]],
        binpack: bool,
        needs: tuple[Need, ...],
    ) -> Iterator[tuple[str, NodeState]]:
        wanted = cands.as_set()
        nodes = self.nodes
        # Walking the index finds the first candidates at once when they are spread
        # over it; past a few times the list's length, sorting the rest costs less.
        budget = 4 * len(wanted) + 64
        last: tuple[float, str] | None = None
        for step, entry in enumerate(index):
            if step == budget:
                break
            if step == PRECHECK_AFTER and not self._may_fit_anywhere(needs):
                return
            name = entry[1]
            if name in wanted:
                node = nodes[name]
                if _may_fit(node, needs):
                    yield name, node
            last = entry
        else:
            return
        rest: list[tuple[float, str]] = []
        for name in wanted:
            known = nodes.get(name)
            if known is not None and known.order_key is not None:
                entry = (-known.order_key if binpack else known.order_key, name)
                if last is None or entry > last:
                    rest.append(entry)
        rest.sort()
        for _key, name in rest:
            node = nodes[name]
            if _may_fit(node, needs):
                yield name, node

    def _member(self, cands: Candidates) -> Callable[[str], bool]:
        """Whether a name is in a long candidate list, exactly, mostly in O(1).

        Only the nodes the summaries allow are asked about, a few per call. A name found
        where an earlier list had it, or near there (kube-scheduler's parallel filter
        shuffles its list a little), is in this one; that needs no other name. Else the
        list is compared with the one read whole last time (stops at the first
        difference), a few names are looked for along it (C, ~1 ms each at 65,000
        names), and past those the list is read whole once and remembered.
        """
        sequence = cands.sequence()
        if sequence is None:
            return cands.as_set().__contains__
        size = len(sequence)
        if len(self._moved) > MOVED_HINTS:
            self._moved.clear()
        moved = self._moved

        def member(name: str) -> bool:
            at = moved.get(name)
            if at is None:
                at = self._seen_at.get(name)
            if at is not None:
                if at < size and sequence[at] == name:
                    return True
                try:
                    found = sequence.index(name, max(0, at - NEAR), at + NEAR)
                except ValueError:
                    pass
                else:
                    moved[name] = found
                    return True
            if cands.positions is not None:
                return name in cands.positions
            if self._seen_names and self._same(cands, self._seen_names):
                return name in self._seen_at  # the list read whole before: complete
            if cands.scans < SCANS:
                cands.scans += 1
                try:
                    found = cands.strings().index(name)
                except ValueError:
                    return False
                moved[name] = found
                return True
            self._remember(cands)
            return name in self._seen_at

        return member

    def _same(self, cands: Candidates, names: list[str]) -> bool:
        """Whether the candidates are ``names``, element by element (compared in C, once
        per list and call)."""
        if cands.compared is names:
            return cands.same
        sequence = cands.sequence()
        if sequence is None:
            return cands.strings() == names
        same = (sequence if isinstance(sequence, list) else list(sequence)) == names
        cands.compared, cands.same = names, same
        return same

    def _remember(self, cands: Candidates) -> None:
        """Read a long list whole, once: where each name is, for this call and the next."""
        names = cands.strings()
        self._seen_names = list(names)
        self._seen_at = cands.positions = dict(zip(names, range(len(names)), strict=True))
        self._moved.clear()  # in place: a walk under way holds it
        cands.compared, cands.same = self._seen_names, True

    def _may_fit_anywhere(self, needs: tuple[Need, ...]) -> bool:
        self.summaries.sync(self.nodes)
        return self.summaries.may_fit_anywhere(needs)

    def explain(
        self, request: PodRequest, names: Iterable[str], *, namespace: str | None = None
    ) -> dict[str, str]:
        """Every node's reason for not taking the pod ("" when it would fit); with
        ``namespace``, a node whose fit is over that namespace's quota says so."""
        device_policy = request.device_policy or self.device_policy
        reasons: dict[str, str] = {}
        for name in names:
            node = self.nodes.get(name)
            if node is None or not node.exists:
                reasons[name] = handshake.NODE_UNREGISTERED
                continue
            result = fit_pod(node.views, request, device_policy, explain=True)
            if isinstance(result, NodeMiss):
                reasons[name] = result.reason
            else:
                reasons[name] = self._quota_miss(namespace, result) or ""
        return reasons

    # ------------------------------------------------------------------ views

    def rows(self) -> Iterator[DeviceRow]:
        for node in self.nodes.values():
            for word, state in node.types.items():
                for device in state.devices:
                    yield DeviceRow(node.name, word, device, state.available)

    def availability(self) -> Iterator[tuple[str, str, bool]]:
        for node in self.nodes.values():
            for word, state in node.types.items():
                yield node.name, word, state.available

    def usage_snapshot(self) -> dict[str, dict[str, tuple[int, int, int]]]:
        """node -> uuid -> (slots, memory, cores): for comparisons in tests and tools."""
        return {
            name: {uuid: (u.slots, u.memory, u.cores) for uuid, u in sorted(node.usage.items())}
            for name, node in sorted(self.nodes.items())
            if node.usage
        }


def fit_types(fit: NodeFit) -> dict[str, str]:
    """uuid -> device type of the devices a fit assigns."""
    return {
        device.uuid: word
        for word, per_container in fit.assignment.items()
        for devices in per_container
        for device in devices
    }


def _keeps_reservation(
    obj: Mapping[str, Any], record: PodRecord | None, reservation: PodRecord
) -> bool:
    """A watch event of a pod holding a reservation leaves it in place while the pod is
    unbound, alive and does not show the decision bind writes (it shows none, an older
    one, or one a failed bind left): the event predates that write."""
    spec = obj.get("spec")
    status = obj.get("status")
    if isinstance(spec, Mapping) and spec.get("nodeName"):
        return False  # bound: its annotations are the truth
    if isinstance(status, Mapping) and status.get("phase") in FINISHED_PHASES:
        return False
    if metadata_of(obj).get("deletionTimestamp"):
        return False
    return record is None or not _same_hold(record, reservation)


def _same_hold(a: PodRecord, b: PodRecord) -> bool:
    """The two records hold the same devices (their bookkeeping may differ)."""
    return a.node == b.node and a.held == b.held and a.whole == b.whole and a.mig == b.mig


# What an operator does about an unreadable decision value (pod_record).
_FIX = (
    "fix: write back the value as the scheduler wrote it (protocol.md §3: "
    "uuid,vendor,MiB,cores: per device, ; after each container) or delete the pod"
)


# every field of a record, bookkeeping included, as one tuple
_RECORD_FIELDS = attrgetter(*(f.name for f in fields(PodRecord)))


def _identical(a: PodRecord, b: PodRecord) -> bool:
    """Every field equal, bookkeeping included: either record will do."""
    return bool(_RECORD_FIELDS(a) == _RECORD_FIELDS(b))


def _same_decision(previous: PodRecord | None, node: str, uid: str) -> bool:
    """``previous`` is this pod's record of the same placement: its hold may stand in for a
    value that went bad (a reservation is filter's, not what the pod was written)."""
    return (
        previous is not None
        and not previous.reserved
        and previous.node == node
        and previous.uid == uid
    )


def _kept_hold(last: PodRecord | None, word: str) -> dict[str, Use]:
    """What ``last`` held of type ``word`` (from a readable value), per uuid."""
    if last is None:
        return {}
    return {h[0]: Use(h[2], h[3], h[4]) for h in last.holds() if h[1] == word}


def _named_devices(bad: str, to_allocate: str | None, asking: Sequence[bool]) -> set[str]:
    """The devices a pod holds of a type whose allocated value does not decode, as far as
    its annotations say so for certain; empty when they do not (then it holds them all).

    A source must be complete, as one that is not would free the devices it leaves out:
    the bad value when its shape is intact (it ends with ';' and every piece has the four
    fields of a device; a value cut short, or two devices run together, lose ids), or the
    to-allocate value while none of its entries is erased yet (the node agent empties each
    container's entry at its Allocate). Given one, every id either names is held: more is
    safe, and garbage among them makes the claim the whole type (``_whole_uuids``)."""
    pieces = [piece for entry in bad.split(";") for piece in entry.split(":") if piece]
    # a piece without a comma names no device (the grammar skips it); no device has an
    # empty id (such a device is never chosen)
    named = {piece.split(",", 1)[0].strip() for piece in pieces if "," in piece} - {""}
    complete = bad.endswith(";") and all(piece.count(",") == 3 for piece in pieces)
    if to_allocate and any(asking):
        try:
            entries = decode_pod_devices(to_allocate)
        except ProtocolError:
            entries = []
        named.update(device.uuid for devices in entries for device in devices)
        # None (the value is not this pod's): no entry is known to be whole
        positions = entry_containers(len(entries), asking) or []
        filled = {p for p, devices in zip(positions, entries, strict=False) if devices}
        complete = complete or all(p in filled for p, asks in enumerate(asking) if asks)
    return named if complete else set()


def _whole_text(named: Collection[str], word: str, node: str) -> str:
    if not named:
        return f"every {word} device of node {node} fully (which of them it holds cannot be read)"
    ids = ", ".join(sorted(named))
    return (
        f"{ids} fully (every {word} device of node {node} if any of those is not registered there)"
    )


def _whole_uuids(node: NodeState) -> set[str]:
    """The devices held entirely by pods whose value cannot be read: the ids a claim names
    when all of them are registered devices of its type on the node, else every device
    of that type there (the claim names none, or garbage: the safe side is all of them)."""
    held: set[str] = set()
    for word, named in node.whole:
        state = node.types.get(word)
        if state is None or not state.devices:
            continue
        registered = {device.uuid for device in state.devices}
        held.update(named if named and named <= registered else registered)
    return held


def _own(mapping: Mapping[K, V]) -> dict[K, V]:
    """``mapping`` to change in place: a dict of its own in place of the shared ``_EMPTY``."""
    return mapping if isinstance(mapping, dict) else dict(mapping)


def _digest(text: str) -> bytes:
    """A fingerprint of a register value: equal texts, equal digests; a collision of two
    different values is as unlikely as one of 128-bit BLAKE2b."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _device_state(device: NodeDevice) -> DeviceState:
    """A registered device; one whose id no pod value can name (empty, or with a separator:
    Go HAMi accepts both) is kept for the record but never chosen."""
    state = DeviceState.from_node_device(device)
    if not device.uuid or any(ch in device.uuid for ch in ",:;"):
        state.healthy = False
    return state


def _utc(now: datetime) -> datetime:
    """``now`` comparable with parsed stamps (which are UTC): a naive time is UTC."""
    return now if now.tzinfo is not None else now.replace(tzinfo=UTC)


def _note_reported(state: TypeState, shakes: Mapping[str, str], now: datetime) -> None:
    """Take the heartbeat of each Reported value not judged before: its own time (the
    writer's clock, so never later than ``now``, when it is first seen; unreadable: now).
    A value judged before (an old stamp still on the Node after the register value
    changed) is not a new heartbeat."""
    for key, value in shakes.items():
        shake = handshake.parse_handshake(value)
        if shake.state is not handshake.HandshakeState.REPORTED:
            continue
        if state.reported_seen.get(key) == value:
            continue
        state.reported_seen = _own(state.reported_seen)
        state.reported_seen[key] = value
        stamp = handshake.reported_time(value)
        at = _utc(now) if stamp is None or stamp > _utc(now) else stamp
        if state.reported_at is None or at > state.reported_at:
            state.reported_at = at


_Read = tuple[str, list[NodeDevice], str | None]  # (source text, devices, error)


def _read_node(reader: NodeReader, obj: Mapping[str, Any]) -> _Read | None:
    """A backend's own reading of a Node (``DeviceKind.devices_from_node``); None when it
    finds none of its devices. Its text stands for the register value (compared on every
    Node update), and a reader's failure is the type's error, never the watch's."""
    try:
        devices = reader(obj)
    except ProtocolError as exc:
        return f"unreadable: {exc}", [], str(exc)
    except Exception as exc:  # a plug-in's bug costs its type on this node only
        return f"failed: {exc!r}", [], f"reading the node's devices failed: {exc!r}"
    if devices is None:
        return None
    return repr(devices), list(devices), None


def _resources(obj: Mapping[str, Any], field_name: str) -> Mapping[str, Any]:
    """``status.capacity`` or ``status.allocatable`` of a Node; {} when absent or not a map."""
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return {}
    resources = status.get(field_name)
    return resources if isinstance(resources, Mapping) else {}


def _count(value: Any) -> int | None:
    """A count resource's quantity, or None when it is not a readable whole number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return parse_quantity(value)
    except (ValueError, ArithmeticError):
        return None


def _kubelet_says_no(
    resource: str, capacity: Mapping[str, Any], allocatable: Mapping[str, Any]
) -> str | None:
    """The reason a type is off when kubelet has the resource but allocates none of it.

    Only a clear "no" counts: the resource in capacity (a readable number) and absent from
    allocatable, or allocatable at 0 (or below). Anything unreadable leaves the decision to
    the handshake.
    """
    if _count(capacity.get(resource)) is None:
        return None
    if resource in allocatable:
        count = _count(allocatable[resource])
        if count is None or count > 0:
            return None
    return (
        f"kubelet reports 0 allocatable {resource}: the node agent's device plugin is not "
        "registered with kubelet (agent stopped?) or every device is unhealthy"
    )


Need = tuple[str, int, int, int, bool]  # type, count, memory (0: relative), cores, exclusive


def _candidates(candidates: Collection[str] | None) -> Candidates | None:
    if candidates is None or isinstance(candidates, Candidates):
        return candidates
    return Candidates(candidates)


def _needs(request: PodRequest) -> tuple[Need, ...]:
    seen: dict[Need, None] = {}
    for container in request.containers:
        for item in container:
            seen.setdefault(_need(item), None)
    return tuple(seen)


def _need(item: DeviceRequest) -> Need:
    memory = item.memory if item.memory_percentage is None else 0
    return (item.type_word, item.count, memory, item.cores, item.cores >= 100)


def _may_fit(node: NodeState, needs: tuple[Need, ...]) -> bool:
    """A fast test that is False only when the node certainly cannot fit."""
    types = node.types
    for word, count, memory, cores, exclusive in needs:
        state = types.get(word)
        if (
            state is None
            or not state.available
            or state.free_devices < count
            or state.max_free_memory < memory
            or state.max_free_cores < cores
            or (exclusive and state.idle_devices < count)
        ):
            return False
    return True
