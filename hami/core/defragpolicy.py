"""The ``defrag`` node policy's decision (``hami.core.defrag`` has the measure).

Pure. ``Cluster.decide`` hands over the nodes its summaries allow, in binpack order;
each is reduced to its ``NodeKey`` (kept per node until the node changes), the pod's
cheapest placement is worked out once per distinct key, and the cheapest node wins.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hami.core import defrag
from hami.core.defragcolumns import AskColumns, NodeColumns
from hami.core.fit import NodeFit, TypeView, device_reason, fit_pod
from hami.core.requests import DeviceRequest, PodRequest, device_policy_of
from hami.core.usage import DeviceState

DEFRAG = "defrag"
# Weights of the two terms besides the fragment (both in core percent, as it is): cores
# the node's free CPU and memory cannot feed (``defrag.starved``), and cores taken from a
# device model the recent pods' type selectors need more than others (``pressure``).
# Chosen on the openb trace (docs/performance.md, Placement quality); 0 turns one off.
STARVED_WEIGHT = 2.0
PRESSURE_WEIGHT = 2.0
MAX_ANSWERS = 500_000  # cached answers (each a few hundred bytes) before starting over
MAX_OPTIONS = 20_000  # node states with their placements kept (a few KiB each)
# per request, device states with their placements kept across generations (~1 KiB each)
MAX_PLACEMENTS = 50_000
# rows of per-request columns (``AskColumns``, ~40 bytes each) kept before starting over
MAX_CELLS = 1_000_000
MAX_PREFILLED = 16  # latest distinct requests whose rows ``prefill`` fills ahead


class NodeLike(Protocol):
    """What the policy reads of a node (``hami.core.cluster.NodeState``)."""

    name: str
    views: dict[str, TypeView]
    devices: dict[str, DeviceState]
    utilisation: float


@dataclass(frozen=True, slots=True)
class Choice:
    node: str
    fit: NodeFit
    cost: float  # the fragment's increase


# A per-decision answer for one node key: (cost, the device key to take, the device
# model the pressure term charges) or None (no fit); the device key is None where the
# node's own fit decides the devices.
_Answer = tuple[float, defrag.DeviceKey | None, str] | None
_MISSING: _Answer = (0.0, None, "")  # not an answer: absent from the cache
# A placement to weigh on a node state (``DefragPolicy._options``): the device key to
# take, the model charged, the devices after it, their masks, the shapes met on them.
_Candidate = tuple[defrag.DeviceKey | None, str, tuple[defrag.DeviceKey, ...], list[int], int]
# The fragment before the pod and the placements to weigh, or None: no fit on the node.
_Options = tuple[float, list[_Candidate]] | None
_NO_OPTIONS: _Options = (0.0, [])  # not options: absent from the cache
# A node state's placements of a pod (``DefragPolicy._placements``), or None: no fit.
_Placements = list[tuple[defrag.DeviceKey | None, str, tuple[defrag.DeviceKey, ...]]] | None
_NO_PLACEMENTS: _Placements = []  # not placements: absent from the cache
# Per request: the options per node key number (this generation), the placements per
# device state (any generation).
_Kept = tuple[dict[int, _Options], dict[tuple[defrag.DeviceKey, ...], _Placements]]
# A node weighed for a pod: (cost, -utilisation, name, the device key to take).
_Ranked = tuple[float, float, str, defrag.DeviceKey | None]
# Per node: (epoch of the key numbers, its key, the key's number, its free cores, its free CPU
# and memory or None, the cores they starve).
_Entry = tuple[int, defrag.NodeKey, int, int, tuple[int, int] | None, float]


class DefragPolicy:
    def __init__(self) -> None:
        self.shapes = defrag.ShapeWindow()
        self.fragment = defrag.FragmentCache(self.shapes)
        # free (CPU millicores, memory MiB) per node, where known
        self.room: dict[str, tuple[int, int]] = {}
        # node -> (epoch of the key numbers, its key, the key's number, its free cores, its free
        # CPU and memory or None, the cores they starve)
        self._keys: dict[str, _Entry] = {}
        # node keys numbered (per generation): answers are looked up by small ints, not
        # by hashing a tuple of device tuples each time
        self._key_ids: dict[defrag.NodeKey, int] = {}
        self.free_by_model: dict[str, int] = {}
        self._free_of: dict[str, dict[str, int]] = {}
        # what is asked -> (node key number, CPU and memory covered after the pod; one int) ->
        # answer, for one window generation
        self._answers: dict[Hashable, dict[int, _Answer]] = {}
        # what is asked -> node key number -> the placements to weigh there (``_options``)
        self._options_of: dict[Hashable, dict[int, _Options]] = {}
        # what is asked -> a node's devices -> the pod's placements there (any generation)
        self._placements_of: dict[Hashable, dict[tuple[defrag.DeviceKey, ...], _Placements]] = {}
        self._answers_generation = -1
        self._epoch = 0  # one more each time the key numbers start over
        self._prefilled = -1  # the epoch whose rows ``prefill`` has filled
        # per node, what a decision reads of it, as arrays: its node columns, and per
        # request what is asked -> its columns for that request
        self.columns = NodeColumns()
        self._tables: dict[Hashable, AskColumns] = {}
        self.filled = 0  # rows of per-request columns filled (a count)
        # device models by number (the per-request columns keep the number)
        self._model_ids: dict[str, int] = {}
        self._models: list[str] = []
        # what is asked -> (request, device policy, the single share) of the latest
        # cacheable requests weighed, oldest first (``prefill``)
        self._recent: dict[Hashable, tuple[PodRequest, str, DeviceRequest | None]] = {}
        # models with free cores -> (weight, the models each window shape takes), for
        # ``pressure``; per window generation
        self._accepted: dict[tuple[str, ...], list[tuple[float, tuple[str, ...]]]] = {}
        self._accepted_generation = -1

    def forget(self, node: str) -> None:
        """``node`` changed: its key is worked out again when next needed."""
        self._stale(node)
        self._count_free(node, None)

    def _stale(self, node: str) -> None:
        """Drop what was worked out for ``node``: its key and its columns' rows."""
        self._keys.pop(node, None)
        self.columns.changed(node)

    def _count_free(self, node: str, key: defrag.NodeKey | None) -> None:
        """Keep the free cores per device model (of the nodes' latest keys)."""
        old = self._free_of.pop(node, None)
        if old is not None:
            for model, cores in old.items():
                self.free_by_model[model] -= cores
        if key is not None:
            mine: dict[str, int] = {}
            for device in key[0]:
                mine[device[0]] = mine.get(device[0], 0) + device[3]
            for model, cores in mine.items():
                self.free_by_model[model] = self.free_by_model.get(model, 0) + cores
            self._free_of[node] = mine

    def set_room(self, node: str, free_cpu: int, free_memory: int) -> None:
        self.room[node] = (free_cpu, free_memory)
        self._stale(node)

    def drop_node(self, node: str) -> None:
        self.room.pop(node, None)
        self._stale(node)
        self.columns.remove(node)
        self._count_free(node, None)

    def node_key(self, node: NodeLike) -> defrag.NodeKey:
        return self._node_entry(node)[1]

    def _node_entry(self, node: NodeLike) -> _Entry:
        if self._answers_generation != self.shapes.generation:
            self._new_generation()
        known = self._keys.get(node.name)
        if known is not None and known[0] == self._epoch:
            return known
        room = self.room.get(node.name)
        covered = (
            self.shapes.covered(*room) if room is not None else self.shapes.covered(None, None)
        )
        if known is not None:
            # an entry of an earlier generation: the node has not changed since
            # (``_stale``), only what its room covers may have
            key = (known[1][0], *covered)
        else:
            key = defrag.node_key(
                (
                    defrag.device_key(word, device)
                    for word, view in node.views.items()
                    if view.unavailable is None
                    for device in view.devices
                ),
                covered,
            )
        number = self._key_ids.setdefault(key, len(self._key_ids))
        free = sum(d[3] for d in key[0])
        starved_before = (
            0.0 if room is None else defrag.starved(free, room[0], room[1], self.shapes)
        )
        entry = (self._epoch, key, number, free, room, starved_before)
        self._keys[node.name] = entry
        self._count_free(node.name, key)
        return entry

    def _new_generation(self) -> None:
        """The window's weights changed: every cached answer and key number is stale."""
        self._answers.clear()
        self._options_of.clear()
        self._tables.clear()
        self.columns.all_changed()
        self._key_ids.clear()  # the entries' numbers are stale: their epoch is old
        self._answers_generation = self.shapes.generation
        self._epoch += 1

    def pressure(self) -> dict[str, float]:
        """Per device model: the recent demand that may use it, each shape's share
        spread over the free cores of the models it accepts, per free core, relative to
        the whole (1.0: as loaded as the cluster on average)."""
        free = {m: c for m, c in self.free_by_model.items() if c > 0}
        total = sum(free.values())
        if not total:
            return {}
        present = tuple(free)
        if self._accepted_generation != self.shapes.generation:
            self._accepted.clear()
            self._accepted_generation = self.shapes.generation
        accepted = self._accepted.get(present)
        if accepted is None:
            # which of these models each shape takes: fixed for the window's weights, and
            # ~0.1 ms of type selector checks per decision when worked out every time
            accepted = self._accepted[present] = [
                (weight, tuple(m for m in present if shape.type_ok(m)))
                for shape, weight in self.shapes.weights
            ]
        load = dict.fromkeys(free, 0.0)
        for weight, models in accepted:
            supply = sum(free[m] for m in models)
            for m in models:
                load[m] += weight / supply
        return {m: value * total for m, value in load.items()}

    def choose(
        self,
        names: Collection[str],
        nodes: Mapping[str, NodeLike],
        request: PodRequest,
        device_policy: str,
        pod_room: tuple[int, int],
        rejects: Callable[[NodeFit], bool],
    ) -> tuple[Choice | None, int]:
        """The cheapest placement on the named nodes (those not in ``nodes`` are skipped),
        and how many nodes were looked at."""
        shape = defrag.shape_of(request, *pod_room)
        if shape is not None:
            self.shapes.observe(shape)
        self._check_generation()
        share = _single_share(request)
        best, looked = self._scan(names, nodes, request, device_policy, share, pod_room)
        if best is None:
            return None, looked
        fit = _realise(nodes[best[2]], request, device_policy, share, best[3])
        if fit is not None and not rejects(fit):
            return Choice(best[2], fit, best[0]), looked
        # the cheapest is turned down (a namespace quota): the others, cheapest first
        every: list[_Ranked] = []
        self._scan(names, nodes, request, device_policy, share, pod_room, every)
        for cost, _util, name, pick in sorted(e for e in every if e[2] != best[2]):
            fit = _realise(nodes[name], request, device_policy, share, pick)
            if fit is not None and not rejects(fit):
                return Choice(name, fit, cost), looked
        return None, looked

    def costs(
        self,
        names: Collection[str],
        nodes: Mapping[str, NodeLike],
        request: PodRequest,
        device_policy: str,
        pod_room: tuple[int, int],
    ) -> dict[str, float]:
        """Every named node's cost for the pod (what ``choose`` minimises; lower strands
        less), for the nodes where it fits; the pod's shape is not observed here."""
        self._check_generation()
        every: list[_Ranked] = []
        share = _single_share(request)
        self._scan(names, nodes, request, device_policy, share, pod_room, every)
        return {name: cost for cost, _util, name, _pick in every}

    def _check_generation(self) -> None:
        if (
            self._answers_generation != self.shapes.generation
            or len(self._key_ids) > MAX_ANSWERS
            or sum(len(a) for a in self._answers.values()) > MAX_ANSWERS
        ):
            self._new_generation()

    def choose_room_only(
        self, names: Collection[str], nodes: Mapping[str, NodeLike], pod_room: tuple[int, int]
    ) -> tuple[str | None, int]:
        """For a pod that asks for no device: the node where its CPU and memory strand
        the least GPU (ties: the node with the least free GPU, then the name)."""
        cpu, memory = pod_room
        cpu_steps, memory_steps = self.shapes.cpu_steps, self.shapes.memory_steps
        best: tuple[float, float, str] | None = None
        looked = 0
        for name in names:
            node = nodes.get(name)
            room = self.room.get(name)
            if node is None or room is None:
                continue
            looked += 1
            if room[0] < cpu or room[1] < memory:
                continue
            key = self.node_key(node)
            after = (
                key[0],
                bisect_right(cpu_steps, room[0] - cpu),
                bisect_right(memory_steps, room[1] - memory),
            )
            free = sum(d[3] for d in key[0])
            cost = self.fragment(after) - self.fragment(key)
            cost += self._starving(free, 0, room, pod_room)
            # ties: the node with the least free GPU (its CPU is missed the least)
            entry = (cost, float(free), name)
            if best is None or entry < best:
                best = entry
        return (None if best is None else best[2]), looked

    def _starving(
        self, free: int, taken: int, room: tuple[int, int], pod_room: tuple[int, int]
    ) -> float:
        """The weighted increase in cores the node's CPU and memory cannot feed when a pod
        takes ``taken`` of its ``free`` cores and ``pod_room`` of its ``room``."""
        if not STARVED_WEIGHT:
            return 0.0
        shapes = self.shapes
        after = defrag.starved(
            max(0, free - taken), room[0] - pod_room[0], room[1] - pod_room[1], shapes
        )
        return STARVED_WEIGHT * (after - defrag.starved(free, room[0], room[1], shapes))

    def _scan(
        self,
        names: Iterable[str],
        nodes: Mapping[str, NodeLike],
        request: PodRequest,
        device_policy: str,
        share: DeviceRequest | None,
        pod_room: tuple[int, int],
        every: list[_Ranked] | None = None,
    ) -> tuple[_Ranked | None, int]:
        """The cheapest node among ``names`` as (cost, -utilisation, name, device key to
        take), and how many nodes were looked at; with ``every``, each node where the pod
        fits is added to it. Nodes in the same state after the pod share one answer
        (``_answers``), unless devices are picked by uuid or link scores.

        The hot path of a decision: the named nodes' slots, then every cost from the
        columns in a few array operations. Python runs per node only for a node changed
        since it was last weighed for this request (``_fill``) and for a node the pod
        leaves too little room for some shape's pod (the answer for its room steps, most
        often a look-up)."""
        cacheable = _cacheable(request, device_policy)
        columns = self.columns
        answers: dict[int, _Answer] = {}
        options: dict[int, _Options] = {}
        placements: dict[tuple[defrag.DeviceKey, ...], _Placements] = {}
        found: AskColumns | None = None
        if cacheable:
            asked = _asked(request, device_policy)
            self._bound_caches()
            answers, (options, placements) = self._kept_for(asked)
            found = self._table(asked, make_room=True)
            self._remember(asked, request, device_policy, share)
        # else: the nodes' own answers, in columns for this pod only
        table = found if found is not None else AskColumns(columns.capacity)
        taken = _cores_of(request)
        # the pressure term per device model: constant through one decision, from the
        # free cores counted before this decision's nodes are worked out
        press = self.pressure() if PRESSURE_WEIGHT else {}
        scale = PRESSURE_WEIGHT * taken
        listed = names if isinstance(names, list) else list(names)
        slot_of = columns.slot_of
        slots = np.array([slot_of.get(name, -1) for name in listed], dtype=np.int64)
        if not len(slots):
            return None, 0
        if slots.min() < 0:
            for i in np.flatnonzero(slots < 0).tolist():
                if listed[i] in nodes:
                    slots[i] = columns.add(listed[i])
        table.grow(columns.capacity)
        known = slots.clip(0)
        stale = np.flatnonzero((table.built[known] != columns.stamp[known]) | (slots < 0))
        if len(stale):
            absent: list[int] = []
            for i in stale.tolist():
                slot = int(slots[i])
                if slot < 0:
                    absent.append(i)  # not a node the policy may weigh
                    continue
                if table.built[slot] == columns.stamp[slot]:
                    continue  # the same name twice
                node = nodes.get(listed[i])
                if node is None:
                    absent.append(i)
                    continue
                if not cacheable:
                    answers, options, placements = {}, {}, {}  # the node's own
                self._fill(
                    slot,
                    node,
                    request,
                    device_policy,
                    share,
                    taken,
                    table,
                    answers,
                    (options, placements),
                )
            if absent:
                slots = np.delete(slots, absent)
        looked = len(slots)
        cost = table.cost[slots]
        model = table.model[slots]
        cpu, memory = pod_room
        shapes = self.shapes
        cpu_left = columns.cpu[slots] - cpu
        memory_left = columns.memory[slots] - memory
        # kube-scheduler's NodeResourcesFit would not offer a node short of the pod's room
        fits = ~np.isnan(cost) & (cpu_left >= 0) & (memory_left >= 0)
        cpu_steps, memory_steps = shapes.cpu_steps, shapes.memory_steps
        cpu_top = cpu_steps[-1] if cpu_steps else 0
        memory_top = memory_steps[-1] if memory_steps else 0
        # the pod leaves too little for some shape's pod: the answer for the room steps
        tight = np.flatnonzero(fits & ((cpu_left < cpu_top) | (memory_left < memory_top)))
        picks: dict[int, defrag.DeviceKey | None] = {}
        if len(tight):
            memos = (
                columns.number[slots[tight]] << 16
                | np.searchsorted(cpu_steps, cpu_left[tight], side="right") << 8
                | np.searchsorted(memory_steps, memory_left[tight], side="right")
            )
            name_of = columns.name_of
            for i, memo in zip(tight.tolist(), memos.tolist(), strict=True):
                if not cacheable:
                    answers, options, placements = {}, {}, {}  # the node's own
                answer = answers.get(memo, _MISSING)
                if answer is _MISSING:
                    node = nodes[name_of[slots[i]] or ""]
                    answer = self._answer_for(
                        node, request, device_policy, share, memo, (options, placements)
                    )
                    if cacheable:
                        answers[memo] = answer
                if answer is None:
                    fits[i] = False
                else:
                    cost[i] = answer[0]
                    model[i] = self._model_id(answer[2])
                    picks[i] = answer[1]
        if STARVED_WEIGHT:
            # the cores its CPU and memory can no longer feed (``_starving``; 0 where its
            # room is unknown, whose columns say no free core left and none starved)
            left = table.left[slots]
            usable = left.copy()
            if shapes.cpu_per_core > 0:
                np.minimum(usable, cpu_left / shapes.cpu_per_core, out=usable)
            if shapes.memory_per_core > 0:
                np.minimum(usable, memory_left / shapes.memory_per_core, out=usable)
            np.maximum(usable, 0.0, out=usable)
            cost += STARVED_WEIGHT * (left - usable - columns.starved_before[slots])
        if press:
            per_model = np.array(
                [scale * (press[m] - 1.0) if m in press else 0.0 for m in self._models]
            )
            cost += per_model[model]
        where = np.flatnonzero(fits)
        if not len(where):
            return None, looked
        name_of, neg_util, pick_of = columns.name_of, columns.neg_util, table.pick

        def ranked(i: int) -> _Ranked:
            slot = int(slots[i])
            pick = picks[i] if i in picks else pick_of[slot]
            return (float(cost[i]), float(neg_util[slot]), name_of[slot] or "", pick)

        if every is not None:
            every.extend(ranked(i) for i in where.tolist())
        # the least cost; ties: the most used node, then the name
        costs = cost[where]
        tied = [ranked(i) for i in where[costs == costs.min()].tolist()]
        return min(tied, key=lambda entry: entry[:3]), looked

    def _table(self, asked: Hashable, *, make_room: bool) -> AskColumns | None:
        """The columns of what is asked, made if missing; past ``MAX_CELLS`` every
        request's columns are dropped first (``make_room``), else None."""
        found = self._tables.get(asked)
        if found is None:
            if (len(self._tables) + 1) * self.columns.capacity > MAX_CELLS:
                if not make_room:
                    return None
                self._tables.clear()  # memory: rows are filled again when needed
            found = self._tables[asked] = AskColumns(self.columns.capacity)
        return found

    def _kept_for(self, asked: Hashable) -> tuple[dict[int, _Answer], _Kept]:
        """The answers, node-state options and placements kept for what is asked."""
        return self._answers.setdefault(asked, {}), (
            self._options_of.setdefault(asked, {}),
            self._placements_of.setdefault(asked, {}),
        )

    def _remember(
        self, asked: Hashable, request: PodRequest, device_policy: str, share: DeviceRequest | None
    ) -> None:
        """Keep the latest requests weighed (``prefill`` fills their rows ahead)."""
        recent = self._recent
        recent.pop(asked, None)
        recent[asked] = (request, device_policy, share)
        if len(recent) > MAX_PREFILLED:
            del recent[next(iter(recent))]

    def prefill(self, nodes: Mapping[str, NodeLike], rows: int) -> bool:
        """Fill up to ``rows`` stale rows of the requests weighed lately, for the nodes in
        ``nodes``; True while some are left. After a change of weights every row is
        stale, and the decisions that follow would fill them on the request path (the
        next few hundred at 5,000 nodes); the scheduler role calls this while idle. Once
        a pass finds nothing left, it does nothing until the weights change again (a
        node that changes is filled again by the next decision that weighs it). It
        keeps within the caches' bounds rather than start them over: it creates no
        request's columns past ``MAX_CELLS`` and stops while the answers are past half
        of ``MAX_ANSWERS``."""
        if self._answers_generation != self.shapes.generation:
            self._new_generation()
        if self._prefilled == self._epoch:
            return False
        self._bound_caches()
        columns = self.columns
        name_of = columns.name_of
        for asked, (request, device_policy, share) in list(self._recent.items()):
            if sum(len(a) for a in self._answers.values()) > MAX_ANSWERS // 2:
                break  # more would start every cache over (``_check_generation``)
            table = self._table(asked, make_room=False)
            if table is None:
                continue  # no room: its first decision fills its rows
            table.grow(columns.capacity)
            stale = np.flatnonzero((table.built != columns.stamp) & columns.live)
            if not len(stale):
                continue
            answers, kept = self._kept_for(asked)
            taken = _cores_of(request)
            for slot in stale.tolist():
                node = nodes.get(name_of[slot] or "")
                if node is None:
                    continue  # not a node decisions weigh now
                if rows <= 0:
                    return True
                self._fill(slot, node, request, device_policy, share, taken, table, answers, kept)
                rows -= 1
        self._prefilled = self._epoch
        return False

    def _bound_caches(self) -> None:
        """Memory: the node states' options and placements are worked out again when
        needed once there are too many."""
        if sum(len(o) for o in self._options_of.values()) > MAX_OPTIONS:
            self._options_of.clear()
        if sum(len(p) for p in self._placements_of.values()) > MAX_PLACEMENTS:
            self._placements_of.clear()

    def _fill(
        self,
        slot: int,
        node: NodeLike,
        request: PodRequest,
        device_policy: str,
        share: DeviceRequest | None,
        taken: int,
        table: AskColumns,
        answers: dict[int, _Answer],
        kept: _Kept,
    ) -> None:
        """Fill ``node``'s row of the columns for this request (``AskColumns``), and its
        node columns where stale."""
        self.filled += 1
        entry = self._keys.get(node.name)
        if entry is None or entry[0] != self._epoch:
            entry = self._node_entry(node)
        _generation, _key, number, free, room, starved_before = entry
        columns = self.columns
        if not columns.is_built(slot):
            columns.fill(slot, number, free, room, starved_before, -node.utilisation)
        shapes = self.shapes
        memo = number << 16 | len(shapes.cpu_steps) << 8 | len(shapes.memory_steps)
        answer = answers.get(memo, _MISSING)
        if answer is _MISSING:
            answer = answers[memo] = self._answer_for(
                node, request, device_policy, share, memo, kept
            )
        if answer is None:
            table.cost[slot] = np.nan
            table.pick[slot] = None
        else:
            table.cost[slot] = answer[0]
            table.model[slot] = self._model_id(answer[2])
            table.pick[slot] = answer[1]
        table.left[slot] = (free - taken if free > taken else 0) if room is not None else 0
        table.built[slot] = columns.stamp[slot]

    def _model_id(self, model: str) -> int:
        found = self._model_ids.get(model)
        if found is None:
            found = self._model_ids[model] = len(self._models)
            self._models.append(model)
        return found

    def _answer_for(
        self,
        node: NodeLike,
        request: PodRequest,
        device_policy: str,
        share: DeviceRequest | None,
        memo: int,
        kept: _Kept,
    ) -> _Answer:
        """``_answer`` for the node state and room steps ``memo`` packs."""
        entry = self._keys.get(node.name)
        if entry is None or entry[0] != self._epoch:
            entry = self._node_entry(node)
        return self._answer(
            node,
            request,
            device_policy,
            share,
            entry[1],
            (memo >> 8 & 255, memo & 255),
            kept,
            memo >> 16,
        )

    def _answer(
        self,
        node: NodeLike,
        request: PodRequest,
        device_policy: str,
        share: DeviceRequest | None,
        key: defrag.NodeKey,
        after_room: tuple[int, int],
        kept: _Kept,
        number: int,
    ) -> _Answer:
        """The pod's cheapest placement on a node in state ``key`` whose CPU and memory,
        after the pod, cover ``after_room`` steps. The placements to weigh (``_options``)
        do not depend on the room, so they are worked out once per node state and only
        the sum is taken again for each room."""
        options, placements = kept
        found = options.get(number, _NO_OPTIONS)
        if found is _NO_OPTIONS:
            found = options[number] = self._options(
                node, request, device_policy, share, key, placements
            )
        if found is None:
            return None
        before, candidates = found
        fragment = self.fragment
        room = fragment.room_mask(*after_room)
        best: _Answer = None
        for pick, model, devices, masks, met in candidates:
            cost = fragment.value(devices, masks, met & room) - before
            if best is None or cost < best[0]:
                best = (cost, pick, model)
        return best

    def _options(
        self,
        node: NodeLike,
        request: PodRequest,
        device_policy: str,
        share: DeviceRequest | None,
        key: defrag.NodeKey,
        placements: dict[tuple[defrag.DeviceKey, ...], _Placements],
    ) -> _Options:
        """The fragment before the pod, and each placement to weigh: (the device key to
        take, the model charged, the node's devices after it, their masks, the shapes met
        on them before the room is asked); None when the pod fits nowhere on the node.
        The placements themselves do not depend on the window's weights: they are kept
        per device state across generations (``placements``), only the masks are new."""
        found = placements.get(key[0], _NO_PLACEMENTS)
        if found is _NO_PLACEMENTS:
            found = placements[key[0]] = self._placements(
                node, request, device_policy, share, key[0]
            )
        if found is None:
            return None
        parts = self.fragment.parts
        return self.fragment(key), [
            (pick, model, devices, *parts(devices)) for pick, model, devices in found
        ]

    def _placements(
        self,
        node: NodeLike,
        request: PodRequest,
        device_policy: str,
        share: DeviceRequest | None,
        devices_now: tuple[defrag.DeviceKey, ...],
    ) -> _Placements:
        """Each placement of the pod on the node: (the device key to take, the model
        charged, the node's devices after it); None when it fits nowhere there."""
        if share is not None:
            view = node.views.get(share.type_word)
            if view is None or view.unavailable is not None:
                return None
            selectors = request.selectors_for(share.type_word)
            found: list[tuple[defrag.DeviceKey | None, str, tuple[defrag.DeviceKey, ...]]] = []
            seen: set[defrag.DeviceKey] = set()
            for device in view.devices:
                dkey = defrag.device_key(share.type_word, device)
                if dkey is None or dkey in seen:
                    continue
                seen.add(dkey)
                if device_reason(device, share, selectors, None) is not None:
                    continue
                after = defrag.taken(dkey, share.memory_on(device.total_memory), share.cores)
                found.append((dkey, dkey[0], _replace_all(devices_now, [(dkey, after)])))
            # in device key order, not the node's device order: nodes in the same state
            # share these, and the first of equally cheap placements is taken
            found.sort(key=lambda placement: placement[0] or ())
            return found or None
        result = fit_pod(node.views, request, device_policy)
        if not isinstance(result, NodeFit):
            return None
        replaced: list[tuple[defrag.DeviceKey, defrag.DeviceKey]] = []
        for uuid, use in result.usage.items():
            held = node.devices.get(uuid)
            if held is None:
                continue
            dkey = defrag.device_key(_word_of(node.views, held), held)
            if dkey is None:
                continue
            replaced.append((dkey, defrag.taken(dkey, use.memory, use.cores)))
        model = devices_now[0][0] if devices_now else ""
        return [(None, model, _replace_all(devices_now, replaced))]


def _replace_all(
    devices: tuple[defrag.DeviceKey, ...],
    pairs: Iterable[tuple[defrag.DeviceKey, defrag.DeviceKey]],
) -> tuple[defrag.DeviceKey, ...]:
    changed = list(devices)
    for old, new in pairs:
        changed[changed.index(old)] = new
    return tuple(sorted(changed))


def _word_of(views: Mapping[str, TypeView], device: DeviceState) -> str:
    for word, view in views.items():
        if device in view.devices:
            return word
    return ""


def _single_share(request: PodRequest) -> DeviceRequest | None:
    """The request of a pod that asks for one share of one device in one container (the
    common case, where the policy picks the device too); None otherwise."""
    found = [item for container in request.containers for item in container]
    if len(found) != 1 or len(request.containers) - request.init_count != 1:
        return None
    item = found[0]
    if item.count != 1 or item.cores >= 100:
        return None
    selectors = request.selectors_for(item.type_word)
    if selectors.numa_bind:
        return None
    return item


def _asked(request: PodRequest, device_policy: str) -> Hashable:
    """What an answer depends on besides the node's state."""
    return (
        request.containers,
        request.init_count,
        tuple(sorted(request.selectors.items())),
        request.weights,
        device_policy,
    )


def _cores_of(request: PodRequest) -> int:
    return sum(i.count * min(i.cores, 100) for c in request.containers for i in c)


def _cacheable(request: PodRequest, device_policy: str) -> bool:
    """Whether nodes in the same state get the same answer: not when devices are picked
    by uuid or by link scores."""
    if device_policy_of(device_policy).topology:
        return False
    return not any(s.use_uuids or s.nouse_uuids for s in request.selectors.values())


def _realise(
    node: NodeLike,
    request: PodRequest,
    device_policy: str,
    share: DeviceRequest | None,
    pick: defrag.DeviceKey | None,
) -> NodeFit | None:
    if share is not None and pick is not None:
        view = node.views[share.type_word]
        selectors = request.selectors_for(share.type_word)
        for device in view.devices:
            if (
                defrag.device_key(share.type_word, device) == pick
                and device_reason(device, share, selectors, None) is None
            ):
                only = {share.type_word: TypeView([device], None, view.pair_scores)}
                result = fit_pod(only, request, device_policy)
                return result if isinstance(result, NodeFit) else None
        return None
    result = fit_pod(node.views, request, device_policy)
    return result if isinstance(result, NodeFit) else None
