"""Every node's reason when no node takes a pod, cheaply (``Cluster.decide``'s no-fit answer).

kube-scheduler asks again for an unschedulable pod on every cluster change and after each
back-off, and wants one reason per node, not the device-level detail. So, above a few
dozen candidates, a node that its per-type summary (``TypeState``: free devices, idle
devices, largest free memory, largest free cores) already rules out gets a reason code
from that summary in a few comparisons, with the codes of ``hami.core.fit``:

=====================================  ==============================================
the node or type is unknown            ``node unregistered`` (as the detailed path)
the type is unavailable                its reason (as the detailed path)
more devices asked than the node has   ``NodeInsufficientDevice: ...`` (as detailed)
fewer free devices than asked          ``NodeInsufficientDevice``
no free device has the memory          ``CardInsufficientMemory``
no free device has the cores           ``CardInsufficientCore``
whole devices asked, too few idle      ``ExclusiveDeviceAllocateConflict``
=====================================  ==============================================

Nodes with equal summaries give equal summary reasons, so the reasons are worked out
once per group of such nodes (``Summaries``: a few dozen groups, not 65,000 nodes), and
the per-node work is dictionary look-ups done in C. A node the summaries allow (it was
fitted in detail and failed, or is over the quota) gets the detailed reason. Small
candidate sets get the detailed reason for every node: there it is cheap, and the device
counts help whoever reads the Event. ``hami explain`` always uses the detailed path
(``Cluster.explain``).

Answers are kept for identical questions: the key is the request's shape, the
namespace's quota limits and a sample of the candidate names (a few entries at most);
a hit is used only when the candidate list equals the one the answer was for
(``Answer.names``, compared in C), so building and hashing a key of every name is not
paid by every call, and a look-alike list never gets another list's answer. The
cluster's generation is bumped on every change of a node or of a pod's hold, and each bump names
its node: an answer is reused as is while the generation stays the same, and after
changes only the changed nodes are looked at again (and, when the namespace has a quota,
the nodes answered in detail: their reason can be the quota, which any of its pods
changes). When one of them now fits, the question is decided afresh.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hami.core.fit import (
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
    EXCLUSIVE_CONFLICT,
    NODE_INSUFFICIENT_DEVICE,
    NODE_UNREGISTERED,
)
from hami.core.nameindex import MISSING, NameIndex
from hami.core.requests import PodRequest

# Up to this many candidates every node gets the detailed reason (about 20 us a node).
DETAIL_NODES = 64
CACHE_ENTRIES = 16
CHANGE_LOG = 4096  # node changes remembered for bringing answers up to date
MAX_RECHECK = 1024  # more changed nodes than this: answer afresh

Need = tuple[str, int, int, int, bool]  # type, count, memory (0: relative), cores, exclusive


class TypeSummary(Protocol):
    """What this module reads of ``hami.core.cluster.TypeState``."""

    @property
    def available(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def devices(self) -> Sequence[object]: ...
    @property
    def free_devices(self) -> int: ...
    @property
    def idle_devices(self) -> int: ...
    @property
    def max_free_memory(self) -> int: ...
    @property
    def max_free_cores(self) -> int: ...


class NodeSummary(Protocol):
    """What this module reads of ``hami.core.cluster.NodeState``."""

    @property
    def exists(self) -> bool: ...
    @property
    def types(self) -> Mapping[str, TypeSummary]: ...


def summary_reason(node: NodeSummary | None, needs: Sequence[Need]) -> str | None:
    """Why the node's summaries rule it out (the first need, in container order, that
    they rule out), or None when they do not."""
    if node is None or not node.exists:
        return NODE_UNREGISTERED
    types = node.types
    for word, count, memory, cores, exclusive in needs:
        state = types.get(word)
        if state is None:
            return NODE_UNREGISTERED
        if not state.available:
            return state.reason or "unavailable"  # what the type's view says (TypeView)
        if count > len(state.devices):
            return (
                f"{NODE_INSUFFICIENT_DEVICE}: {count} {word} devices asked, "
                f"node has {len(state.devices)}"
            )
        if state.free_devices < count:
            return NODE_INSUFFICIENT_DEVICE
        if state.max_free_memory < memory:
            return CARD_INSUFFICIENT_MEMORY
        if state.max_free_cores < cores:
            return CARD_INSUFFICIENT_CORE
        if exclusive and state.idle_devices < count:
            return EXCLUSIVE_CONFLICT
    return None


def reasons(
    nodes: Mapping[str, NodeSummary],
    names: Iterable[str],
    needs: Sequence[Need],
    detail: Callable[[list[str]], Mapping[str, str]],
) -> tuple[dict[str, str], list[str]]:
    """Every name's reason: the summary's where it rules the node out, else ``detail``'s
    (called once, with the names the summaries allow); and those names."""
    answer: dict[str, str] = {}
    allowed: list[str] = []
    get = nodes.get
    for name in names:
        why = summary_reason(get(name), needs)
        if why is None:
            allowed.append(name)
            answer[name] = ""  # keeps the candidates' order; filled in below
        else:
            answer[name] = why
    if allowed:
        answer.update(detail(allowed))
    return answer, allowed


def request_shape(request: PodRequest, device_policy: str) -> Hashable:
    """Everything of the request a decision reads (not the pod's name or warnings)."""
    return (
        request.containers,
        request.init_count,
        tuple(sorted(request.selectors.items())),
        request.node_policy,
        device_policy,
        request.weights,
    )


@dataclass(slots=True)
class Answer:
    """A no-fit answer and what it was computed from."""

    generation: int  # the cluster's generation when it was last brought up to date
    failed: dict[str, str]  # node -> reason: shared, callers must not change it
    detailed: tuple[str, ...]  # nodes whose reason came from the detailed path
    # The candidate names it answers, in order (None: every node, or the key holds them):
    # the key holds only a sample of them, so a hit is checked against these.
    names: list[str] | None = None


class NoFitCache:
    """The latest no-fit answers, and a log of which node each generation changed.

    An answer of an older generation is brought up to date by rechecking only the nodes
    changed since (the log says which); see ``Cluster.decide``.
    """

    def __init__(self, entries: int = CACHE_ENTRIES, changes: int = CHANGE_LOG) -> None:
        self.entries = entries
        self._answers: OrderedDict[Hashable, Answer] = OrderedDict()
        self._log: deque[tuple[int, str]] = deque(maxlen=changes)
        self._counts: deque[tuple[Mapping[str, str], Counter[str]]] = deque(maxlen=entries)

    def changed(self, generation: int, node: str) -> None:
        """The cluster moved to ``generation`` by a change of ``node``."""
        self._log.append((generation, node))

    def changed_since(self, generation: int) -> set[str] | None:
        """Nodes changed after ``generation``; None when the log no longer reaches back."""
        names: set[str] = set()
        for changed_at, node in reversed(self._log):
            if changed_at <= generation:
                return names
            names.add(node)
        first = self._log[0][0] if self._log else generation + 1
        return names if first == generation + 1 else None

    def get(self, key: Hashable) -> Answer | None:
        answer = self._answers.get(key)
        if answer is not None:
            self._answers.move_to_end(key)
        return answer

    def put(self, key: Hashable, answer: Answer) -> None:
        self._answers[key] = answer
        self._answers.move_to_end(key)
        while len(self._answers) > self.entries:
            self._answers.popitem(last=False)

    def reason_counts(self, failed: Mapping[str, str]) -> Counter[str]:
        """How many nodes give each reason in ``failed``: counted once per answer (a
        repeated no-fit's metrics and message cost nothing per node)."""
        for answer, counts in self._counts:
            if answer is failed:
                return counts
        counts = Counter(failed.values())
        self._counts.append((failed, counts))
        return counts


def summary_message(counts: Mapping[str, int]) -> str:
    """``0/3 nodes are available: 2 handshake timed out, 1 CardInsufficientMemory``."""
    parts = [f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda i: (-i[1], i[0]))]
    return f"0/{sum(counts.values())} nodes are available: " + "; ".join(parts)


def candidates_key(candidates: Collection[str] | None) -> Hashable:
    """The candidate set's identity: None (every node) or its names in order."""
    return None if candidates is None else tuple(candidates)


SAMPLES = 8  # names of a candidate list in its cache key (the rest is compared on a hit)


def sampled_key(names: Sequence[object]) -> Hashable:
    """A candidate list's key in O(1): its length and a few names spread over it. Two
    lists may share it, so an answer found by it is used only when its names are equal
    (``Answer.names``): hashing or copying every name of every call is what this avoids."""
    count = len(names)
    picked = range(0, count, max(1, -(-count // SAMPLES)))
    return (count, *(_as_str(names[i]) for i in picked), _as_str(names[-1]) if count else None)


def _as_str(value: object) -> str:
    return value if type(value) is str else str(value)


# ---------------------------------------------------------------------------- summaries


@dataclass(frozen=True, slots=True)
class TypeSnapshot:
    """A ``TypeSummary`` as it was: what ``summary_reason`` reads of one type."""

    available: bool
    reason: str | None
    devices: range  # only its length is read
    free_devices: int
    idle_devices: int
    max_free_memory: int
    max_free_cores: int


@dataclass(frozen=True, slots=True, eq=False)
class NodeSnapshot:
    """A ``NodeSummary`` as it was."""

    exists: bool
    types: Mapping[str, TypeSnapshot]


def summary_key(node: NodeSummary) -> Hashable:
    """What ``summary_reason`` reads of ``node``, as a key: equal keys, equal reasons."""
    types = node.types
    if len(types) == 1:  # the usual node: one flat tuple (every node is keyed at a start)
        for word, t in types.items():
            return (
                node.exists,
                word,
                t.available,
                t.reason,
                len(t.devices),
                t.free_devices,
                t.idle_devices,
                t.max_free_memory,
                t.max_free_cores,
            )
    return (
        node.exists,
        tuple(
            sorted(
                (
                    word,
                    t.available,
                    t.reason,
                    len(t.devices),
                    t.free_devices,
                    t.idle_devices,
                    t.max_free_memory,
                    t.max_free_cores,
                )
                for word, t in node.types.items()
            )
        ),
    )


def snapshot(node: NodeSummary) -> NodeSnapshot:
    """``node``'s summary as it is now, kept apart from the node."""
    types = {
        word: TypeSnapshot(
            t.available,
            t.reason,
            range(len(t.devices)),
            t.free_devices,
            t.idle_devices,
            t.max_free_memory,
            t.max_free_cores,
        )
        for word, t in node.types.items()
    }
    return NodeSnapshot(node.exists, types)


class Summaries:
    """Nodes grouped by what ``summary_reason`` reads of them (few groups: node shapes
    times fill levels), so that a question is answered once per group, not per node.

    The cluster names every node it changes (``changed``, the same calls that bump its
    generation) and ``sync`` regroups those before any use.
    """

    def __init__(self) -> None:
        self._dirty: set[str] = set()
        self._of = NameIndex()  # node -> group
        self._ids: dict[Hashable, int] = {}  # snapshot key -> group
        self._snapshots: dict[int, NodeSnapshot] = {}  # group -> its summary
        self._keys: dict[int, Hashable] = {}
        self._counts: dict[int, int] = {}  # group -> its nodes (live groups only)
        self._next = 0

    def changed(self, name: str) -> None:
        self._dirty.add(name)

    def pending(self) -> int:
        """Nodes changed since the last ``sync``."""
        return len(self._dirty)

    def sync(self, nodes: Mapping[str, NodeSummary]) -> None:
        """Regroup the nodes changed since the last call."""
        for name in self._dirty:
            old = self._of.get(name)
            if old is not None:
                left = self._counts[old] - 1
                if left:
                    self._counts[old] = left
                else:  # forget empty groups: fill levels come and go
                    del self._counts[old], self._snapshots[old]
                    del self._ids[self._keys.pop(old)]
            node = nodes.get(name)
            if node is None:
                self._of.pop(name)
                continue
            key = summary_key(node)
            group = self._ids.get(key)
            if group is None:
                group = self._ids[key] = self._next
                self._next += 1
                self._keys[group], self._snapshots[group] = key, snapshot(node)
                self._counts[group] = 0
            self._of.set(name, group)
            self._counts[group] += 1
        self._dirty.clear()

    def prepare(self) -> None:
        """Make the next ``reasons`` cheap: the node names' index, built (after ``sync``)."""
        self._of.prepare()

    def may_fit_anywhere(self, needs: Sequence[Need]) -> bool:
        """Whether the summaries of any known node allow ``needs`` (after ``sync``)."""
        return any(summary_reason(s, needs) is None for s in self._snapshots.values())

    def reasons(
        self,
        names: Collection[str],
        needs: Sequence[Need],
        detail: Callable[[list[str]], Mapping[str, str]],
    ) -> tuple[dict[str, str], list[str]]:
        """``reasons`` (the same answer) with one ``summary_reason`` per group: the
        per-name work is array operations and C loops (after ``sync``): each name's
        group (``NameIndex.lookup``), then its group's reason."""
        groups = self._of.lookup(names)
        ordered = np.sort(groups)  # the distinct groups (np.unique imports numpy.ma at first use)
        present = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
        why: dict[int, str | None] = {MISSING: NODE_UNREGISTERED}
        for group in present.tolist():
            if group != MISSING:
                why[group] = summary_reason(self._snapshots[group], needs)
        texts = np.array([why[group] for group in present.tolist()], dtype=object)
        per_name = texts[np.searchsorted(present, groups)].tolist()
        answer: dict[str, str] = dict(zip(names, per_name, strict=True))
        allowed: list[str] = []
        if any(reason is None for reason in why.values()):
            allowed = [name for name in names if answer[name] is None]  # in order, repeats kept
            for name in allowed:
                answer[name] = ""
            answer.update(detail(allowed))
        return answer, allowed
