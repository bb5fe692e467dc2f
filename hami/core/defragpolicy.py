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

from hami.core import defrag
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
MAX_QUESTIONS = 256  # distinct (request, pod CPU and memory) with per-node costs kept
MAX_RECORDS = 200_000  # per-node records (``_Record``, ~150 bytes each) before starting over


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
# A node weighed for a pod: (cost, -utilisation, name, the device key to take).
_Ranked = tuple[float, float, str, defrag.DeviceKey | None]
# Per node: (window generation, its key, the key's number, its free cores, its free CPU
# and memory or None, the cores those starve).
_Entry = tuple[int, defrag.NodeKey, int, int, tuple[int, int] | None, float]
# What a decision reads of a node for what is asked, kept until the node changes
# (``_stale``) or the window's weights do: (its key's number, its free CPU and memory
# (infinite where unknown), the free cores the pod leaves, the cores its CPU and memory
# starve now (0 where unknown), -utilisation, the answer when the pod leaves every
# shape's pod room; then the largest pod CPU and memory for which the pod also starves
# no core, and the cost for such a pod). With it a node's cost for a pod of any CPU and
# memory is a few operations (``_scan``), and for most pods a look-up. Last, the least
# cost any pod can have there but the pressure term (the cost of a pod of no CPU and
# memory: less room never lowers the fragment, and the pod's CPU and memory only starve
# more), and the device model the pressure term charges on it (None: more than one model
# on the node): a node whose least cost is above the best found so far is passed over.
_Record = tuple[
    int, float, float, int, float, float, _Answer, float, float, float, float, str | None
]
# A node is passed over only when its least cost is above the best by more than this
# (the two are worked out by different arithmetic; costs are core percent, ~1-1000).
_PRUNE_MARGIN = 1e-6
_UNKNOWN_ROOM = float("inf")
# A node's cost for a pod but the pressure term (None: no fit), the device key to take,
# the model the pressure term charges, -utilisation.
_Cost = tuple[float | None, defrag.DeviceKey | None, str, float]
_NO_COST: _Cost = (None, None, "", 0.0)


class DefragPolicy:
    def __init__(self) -> None:
        self.shapes = defrag.ShapeWindow()
        self.fragment = defrag.FragmentCache(self.shapes)
        # free (CPU millicores, memory MiB) per node, where known
        self.room: dict[str, tuple[int, int]] = {}
        # node -> (window generation, its key, the key's number, its free cores, its free
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
        self._answers_generation = -1
        # what is asked -> node -> its record (``_Record``)
        self._records: dict[Hashable, dict[str, _Record]] = {}
        # (what is asked, the pod's CPU and memory) -> node -> its cost but the pressure
        # term, the device key, the model, where the pod does not leave the node roomy
        # (a Deployment's replicas ask the same again and again)
        self._quick: dict[Hashable, dict[str, _Cost]] = {}
        self._quick_size = 0
        self.passed_over = 0  # nodes a decision passed over by their least cost (a count)
        # models with free cores -> (weight, the models each window shape takes), for
        # ``pressure``; per window generation
        self._accepted: dict[tuple[str, ...], list[tuple[float, tuple[str, ...]]]] = {}
        self._accepted_generation = -1

    def forget(self, node: str) -> None:
        """``node`` changed: its key is worked out again when next needed."""
        self._stale(node)
        self._count_free(node, None)

    def _stale(self, node: str) -> None:
        """Drop what was worked out for ``node``: its key and its per-question results."""
        self._keys.pop(node, None)
        for records in self._records.values():
            records.pop(node, None)
        for results in self._quick.values():
            results.pop(node, None)

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
        self._count_free(node, None)

    def node_key(self, node: NodeLike) -> defrag.NodeKey:
        return self._node_entry(node)[1]

    def _node_entry(self, node: NodeLike) -> _Entry:
        generation = self.shapes.generation
        known = self._keys.get(node.name)
        if known is not None and known[0] == generation:
            return known
        if self._answers_generation != generation:
            self._new_generation()
        room = self.room.get(node.name)
        covered = (
            self.shapes.covered(*room) if room is not None else self.shapes.covered(None, None)
        )
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
        entry = (generation, key, number, free, room, starved_before)
        self._keys[node.name] = entry
        self._count_free(node.name, key)
        return entry

    def _new_generation(self) -> None:
        """The window's weights changed: every cached answer and key number is stale."""
        self._answers.clear()
        self._options_of.clear()
        self._records.clear()
        self._quick.clear()
        self._quick_size = 0
        self._key_ids.clear()
        self._keys.clear()  # their key numbers are gone too
        self._answers_generation = self.shapes.generation

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

        The hot loop of a decision: one pass, and per node one look-up of its cost for this
        question (request and pod size) since it last changed, else its cost worked out
        inline from its record for the request (``_Record``)."""
        cacheable = _cacheable(request, device_policy)
        answers: dict[int, _Answer] = {}
        options: dict[int, _Options] = {}
        records: dict[str, _Record] = {}
        quick: dict[str, _Cost] = {}
        if cacheable:
            asked = _asked(request, device_policy)
            answers = self._answers.setdefault(asked, {})
            if sum(len(o) for o in self._options_of.values()) > MAX_OPTIONS:
                self._options_of.clear()  # memory: they are worked out again when needed
            options = self._options_of.setdefault(asked, {})
            if sum(len(r) for r in self._records.values()) > MAX_RECORDS:
                self._records.clear()
            records = self._records.setdefault(asked, {})
            question = (asked, pod_room)
            found = self._quick.get(question)
            if found is None:
                if len(self._quick) >= MAX_QUESTIONS or self._quick_size > MAX_RECORDS:
                    self._quick.clear()
                    self._quick_size = 0
                found = self._quick[question] = {}
            quick = found
        cpu, memory = pod_room
        shapes = self.shapes
        cpu_steps, memory_steps = shapes.cpu_steps, shapes.memory_steps
        cpu_per_core, memory_per_core = shapes.cpu_per_core, shapes.memory_per_core
        # the least CPU and memory left after the pod that covers every shape's pod
        cpu_top = cpu_steps[-1] if cpu_steps else 0
        memory_top = memory_steps[-1] if memory_steps else 0
        starve = STARVED_WEIGHT
        taken = _cores_of(request)
        # the pressure term per device model: constant through one decision
        press = (
            {m: PRESSURE_WEIGHT * taken * (p - 1.0) for m, p in self.pressure().items()}
            if PRESSURE_WEIGHT
            else {}
        )
        # the least pressure term on a node of more than one model
        press_floor = min(0.0, *press.values()) if press else 0.0
        # passing over nodes that cannot beat the best needs every cost to be at least
        # the record's least one: not with ``every`` (each node's cost is asked for)
        prune = every is None and cpu >= 0 and memory >= 0
        best: _Ranked | None = None
        best_cost = float("inf")
        looked = 0
        for name in names:
            known = quick.get(name)
            if known is None:
                record = records.get(name)
                if record is None:
                    node = nodes.get(name)
                    if node is None:
                        continue
                    record = self._record(
                        node, request, device_policy, share, taken, answers, options
                    )
                    if cacheable:
                        records[name] = record
                # its cost from the record (inline: this is most nodes when pods of many
                # sizes come; min and max written out for the same reason)
                answer = record[6]
                if answer is None:
                    known = _NO_COST  # no device takes it, whatever its CPU and memory
                elif cpu <= record[7] and memory <= record[8]:
                    # the pod leaves every shape's pod room and starves nothing
                    known = (record[9], answer[1], answer[2], record[5])
                elif (
                    prune
                    and record[10]
                    + (press_floor if record[11] is None else press.get(record[11], 0.0))
                    > best_cost + _PRUNE_MARGIN
                ):
                    looked += 1  # its cost is above the best's whatever it is exactly
                    self.passed_over += 1
                    continue
                else:
                    number, free_cpu, free_memory, left, starved_before, neg_util = record[:6]
                    cpu_left = free_cpu - cpu
                    memory_left = free_memory - memory
                    if cpu_left < 0 or memory_left < 0:
                        known = _NO_COST  # kube-scheduler's NodeResourcesFit would not offer it
                    else:
                        if cpu_left < cpu_top or memory_left < memory_top:
                            # the pod leaves too little for some shape's pod: that answer
                            memo = (
                                number << 16
                                | bisect_right(cpu_steps, cpu_left) << 8
                                | bisect_right(memory_steps, memory_left)
                            )
                            answer = answers.get(memo, _MISSING)
                            if answer is _MISSING:
                                answer = self._answer_for(
                                    nodes[name], request, device_policy, share, memo, options
                                )
                                if cacheable:
                                    answers[memo] = answer
                        if answer is None:
                            known = _NO_COST
                        else:
                            worked = answer[0]
                            if starve:
                                # the cores its CPU and memory can no longer feed
                                # (``_starving``; 0 where its room is unknown)
                                usable = float(left)
                                if cpu_per_core > 0:
                                    fed = cpu_left / cpu_per_core
                                    if fed < usable:
                                        usable = fed
                                if memory_per_core > 0:
                                    fed = memory_left / memory_per_core
                                    if fed < usable:
                                        usable = fed
                                if not usable > 0.0:  # max(0.0, usable)
                                    usable = 0.0
                                worked += starve * (left - usable - starved_before)
                            known = (worked, answer[1], answer[2], neg_util)
                if cacheable:
                    quick[name] = known
                    self._quick_size += 1
            looked += 1
            cost, pick, model, neg_util = known
            if cost is None:
                continue
            if press:
                cost += press.get(model, 0.0)
            if every is not None:
                every.append((cost, neg_util, name, pick))
            if cost < best_cost:
                best = (cost, neg_util, name, pick)
                best_cost = cost
            elif cost == best_cost and best is not None and (neg_util, name) < best[1:3]:
                best = (cost, neg_util, name, pick)
        return best, looked

    def _record(
        self,
        node: NodeLike,
        request: PodRequest,
        device_policy: str,
        share: DeviceRequest | None,
        taken: int,
        answers: dict[int, _Answer],
        options: dict[int, _Options],
    ) -> _Record:
        """What a decision reads of ``node`` for this request (``_Record``)."""
        entry = self._keys.get(node.name)
        if entry is None or entry[0] != self.shapes.generation:
            entry = self._node_entry(node)
        _generation, key, number, free, room, starved_before = entry
        shapes = self.shapes
        memo = number << 16 | len(shapes.cpu_steps) << 8 | len(shapes.memory_steps)
        answer = answers.get(memo, _MISSING)
        if answer is _MISSING:
            answer = answers[memo] = self._answer_for(
                node, request, device_policy, share, memo, options
            )
        neg_util = -node.utilisation
        if room is None:
            free_cpu = free_memory = _UNKNOWN_ROOM
            left, starved_before = 0, 0.0
        else:
            free_cpu, free_memory = room
            left = free - taken if free > taken else 0
        # Up to these the pod leaves every shape's pod room and its CPU and memory still
        # feed every core it leaves, so its cost is ``roomy`` (the arithmetic of the
        # loop in ``_scan`` with nothing starved; the margin of one keeps the division's
        # rounding out: above it the loop works the cost out).
        cpu_need = float(shapes.cpu_steps[-1] if shapes.cpu_steps else 0)
        memory_need = float(shapes.memory_steps[-1] if shapes.memory_steps else 0)
        if STARVED_WEIGHT and shapes.cpu_per_core > 0:
            cpu_need = max(cpu_need, left * shapes.cpu_per_core + 1)
        if STARVED_WEIGHT and shapes.memory_per_core > 0:
            memory_need = max(memory_need, left * shapes.memory_per_core + 1)
        roomy = least = 0.0
        if answer is not None:
            roomy = least = answer[0]
            if STARVED_WEIGHT:
                fed = float(left) if left > 0 else 0.0
                roomy += STARVED_WEIGHT * (left - fed - starved_before)
                # a pod of no CPU and memory: what the node's room feeds now
                usable = float(left)
                if room is not None and shapes.cpu_per_core > 0:
                    usable = min(usable, free_cpu / shapes.cpu_per_core)
                if room is not None and shapes.memory_per_core > 0:
                    usable = min(usable, free_memory / shapes.memory_per_core)
                least += STARVED_WEIGHT * (left - max(0.0, usable) - starved_before)
        models = {device[0] for device in key[0]}
        model = next(iter(models)) if len(models) == 1 else None
        return (
            number,
            free_cpu,
            free_memory,
            left,
            starved_before,
            neg_util,
            answer,
            free_cpu - cpu_need,
            free_memory - memory_need,
            roomy,
            least,
            model,
        )

    def _answer_for(
        self,
        node: NodeLike,
        request: PodRequest,
        device_policy: str,
        share: DeviceRequest | None,
        memo: int,
        options: dict[int, _Options],
    ) -> _Answer:
        """``_answer`` for the node state and room steps ``memo`` packs."""
        entry = self._keys.get(node.name)
        if entry is None or entry[0] != self.shapes.generation:
            entry = self._node_entry(node)
        return self._answer(
            node,
            request,
            device_policy,
            share,
            entry[1],
            (memo >> 8 & 255, memo & 255),
            options,
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
        options: dict[int, _Options],
        number: int,
    ) -> _Answer:
        """The pod's cheapest placement on a node in state ``key`` whose CPU and memory,
        after the pod, cover ``after_room`` steps. The placements to weigh (``_options``)
        do not depend on the room, so they are worked out once per node state and only
        the sum is taken again for each room."""
        found = options.get(number, _NO_OPTIONS)
        if found is _NO_OPTIONS:
            found = options[number] = self._options(node, request, device_policy, share, key)
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
    ) -> _Options:
        """The fragment before the pod, and each placement to weigh: (the device key to
        take, the model charged, the node's devices after it, their masks, the shapes met
        on them before the room is asked); None when the pod fits nowhere on the node."""
        before = self.fragment(key)
        fragment = self.fragment
        if share is not None:
            view = node.views.get(share.type_word)
            if view is None or view.unavailable is not None:
                return None
            selectors = request.selectors_for(share.type_word)
            candidates: list[_Candidate] = []
            seen: set[defrag.DeviceKey] = set()
            for device in view.devices:
                dkey = defrag.device_key(share.type_word, device)
                if dkey is None or dkey in seen:
                    continue
                seen.add(dkey)
                if device_reason(device, share, selectors, None) is not None:
                    continue
                after = defrag.taken(dkey, share.memory_on(device.total_memory), share.cores)
                devices = _replace_all(key[0], [(dkey, after)])
                candidates.append((dkey, dkey[0], devices, *fragment.parts(devices)))
            return (before, candidates) if candidates else None
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
        devices = _replace_all(key[0], replaced)
        model = key[0][0][0] if key[0] else ""
        return before, [(None, model, devices, *fragment.parts(devices))]


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
