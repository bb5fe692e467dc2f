"""The ``defrag`` node policy: place a pod where it strands the least GPU capacity for
the pods that usually follow.

Pure. The idea is the one FGD (USENIX ATC '23) measured on Alibaba's GPU-sharing trace;
the measure here is this project's own and knows HAMi's dimensions:

* A **shape** is what a kind of pod asks for: device type, devices, cores and memory
  per device, type selectors, and the pod's CPU and memory. ``ShapeWindow`` keeps the
  shapes of the last ``WINDOW`` pods asked about and weighs the common ones by how much
  GPU they ask for (count x devices x cores), so rare large pods are not forgotten.
* A node's **stranded** amount for a shape: the free cores (percent, per device) the
  shape cannot use there. A device is usable when it is healthy, of an allowed type, has
  a free share slot, and its free cores *and* free memory cover one share (a whole-device
  shape wants an idle device). When the node's CPU or memory cannot take the shape's pod,
  or fewer devices are usable than it asks for, all of the node's free cores are
  stranded for it.
* A node's **fragment** is the weighted sum over the shapes; placing a pod costs the
  fragment's increase, and the cheapest placement wins (ties: the fuller node, then
  the name, so a decision is deterministic).

A node's state is reduced to a ``NodeKey`` (its devices' free amounts, sorted, and how
many of the shapes' CPU and memory requests its free CPU and memory cover), so nodes in
the same state share one computation: a decision costs a dictionary look-up per node.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hami.core.requests import PodRequest
from hami.core.usage import DeviceState

# Shapes of this many recent pods make the workload a placement is judged against.
WINDOW = 2000
# At most this many shapes (the most demanded) are weighed.
MAX_SHAPES = 48
# The weights are recomputed after this many new pods (between: cached amounts stay).
REWEIGH_EVERY = 500
# ... and replaced only when the recent demand moved this far from them (total variation
# distance): a steady workload keeps one set of weights, so the cached node states stay
# valid (a new set makes every node's answer be worked out again). Two windows of one
# steady workload differ by 0.03-0.08 from sampling alone (openb trace).
REWEIGH_TOLERANCE = 0.1
# A workload of many distinct pods (hundreds of shapes for 48 weights) moves that far
# from sampling alone; once the window is full, a move below this is taken at most once
# per window's length of pods, a larger one (the workload changed) at once.
SHIFT_TOLERANCE = 0.25


@dataclass(frozen=True, slots=True)
class Shape:
    type_word: str
    count: int  # devices
    cores: int  # percent of each device (100: the whole device)
    memory: int  # MiB per device (0 with ``memory_percentage``)
    memory_percentage: int | None
    use_types: tuple[str, ...]
    nouse_types: tuple[str, ...]
    cpu_milli: int
    memory_mib: int

    def memory_on(self, total: int) -> int:
        if self.memory_percentage is None:
            return self.memory
        return total * self.memory_percentage // 100

    def type_ok(self, model: str) -> bool:
        lowered = model.lower()
        if self.use_types and not any(t in lowered for t in self.use_types):
            return False
        return not any(t in lowered for t in self.nouse_types)

    @property
    def demand(self) -> int:
        """Cores percent asked for in all (the weight of one such pod)."""
        return self.count * max(self.cores, 1)


def shape_of(request: PodRequest, cpu_milli: int = 0, memory_mib: int = 0) -> Shape | None:
    """The shape of a pod: its largest device request (by devices x cores); None when it
    asks for no device."""
    best = None
    for container in request.containers[request.init_count :] or request.containers:
        for item in container:
            if best is None or item.count * item.cores > best.count * best.cores:
                best = item
    if best is None:
        return None
    selectors = request.selectors_for(best.type_word)
    return Shape(
        best.type_word,
        best.count,
        best.cores,
        best.memory,
        best.memory_percentage,
        selectors.use_types,
        selectors.nouse_types,
        cpu_milli,
        memory_mib,
    )


# One device as the measure sees it: (model, type word, free slots, free cores, free
# memory, total memory, idle). Unhealthy devices are left out: nothing can use them.
DeviceKey = tuple[str, str, int, int, int, int, bool]
# A node: its devices (sorted), and how many shape CPU / memory thresholds it covers.
NodeKey = tuple[tuple[DeviceKey, ...], int, int]


def device_key(type_word: str, device: DeviceState) -> DeviceKey | None:
    if not device.healthy:
        return None
    return (
        device.model,
        type_word,
        max(0, device.count - device.used),
        device.free_cores,
        device.free_memory,
        device.total_memory,
        device.used == 0 and device.used_memory == 0 and device.used_cores == 0,
    )


def taken(key: DeviceKey, memory: int, cores: int) -> DeviceKey:
    """``key`` after one more share of ``memory`` MiB and ``cores`` percent."""
    model, word, slots, free_cores, free_memory, total_memory, _idle = key
    return (
        model,
        word,
        max(0, slots - 1),
        max(0, free_cores - cores),
        max(0, free_memory - memory),
        total_memory,
        False,
    )


class ShapeWindow:
    """The recent shapes and their weights; ``generation`` moves when weights change."""

    def __init__(self, window: int = WINDOW, max_shapes: int = MAX_SHAPES) -> None:
        self._recent: deque[Shape] = deque(maxlen=window)
        self._counts: Counter[Shape] = Counter()
        self._max_shapes = max_shapes
        self._since = 0
        self._observed = 0  # shapes observed in all
        self._applied_at = 0  # ... when the weights in use were set
        self._basis: tuple[tuple[Shape, float], ...] = ()  # the whole demand then
        self.generation = 0
        self.weights: tuple[tuple[Shape, float], ...] = ()
        self.cpu_steps: list[int] = []
        self.cpu_per_core = 0.0  # CPU millicores the recent pods ask per core percent
        self.memory_per_core = 0.0
        self.memory_steps: list[int] = []

    def observe(self, shape: Shape) -> None:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._recent.append(shape)
        self._counts[shape] += 1
        self._since += 1
        self._observed += 1
        # early on the workload is still being learnt: reweigh often, then rarely (each
        # reweigh invalidates every cached node state)
        if not self.weights or self._since >= min(REWEIGH_EVERY, max(8, len(self._recent) // 4)):
            self._reweigh()

    def _reweigh(self) -> None:
        self._since = 0
        demand = {s: n * s.demand for s, n in self._counts.items()}
        top = sorted(demand.items(), key=lambda item: (-item[1], repr(item[0])))
        top = top[: self._max_shapes]
        total = sum(d for _, d in top) or 1
        weights = tuple((s, d / total) for s, d in top)
        # the move is measured on the whole recent demand, not on the top shapes only:
        # with hundreds of shapes which ones make the cut is itself sampling noise
        everything = sum(demand.values()) or 1
        basis = tuple((s, d / everything) for s, d in demand.items())
        if self.weights:
            distance = moved(self._basis, basis)
            if distance < REWEIGH_TOLERANCE:
                return  # the same workload: every cached node state stays valid
            if (
                distance < SHIFT_TOLERANCE
                and len(self._recent) == self._recent.maxlen
                and self._observed - self._applied_at < len(self._recent)
            ):
                return  # a varied workload's noise: at most one new set per window
        self._applied_at = self._observed
        self._basis = basis
        self.weights = weights
        cores = sum(n * s.count * s.cores for s, n in self._counts.items()) or 1
        self.cpu_per_core = sum(n * s.cpu_milli for s, n in self._counts.items()) / cores
        self.memory_per_core = sum(n * s.memory_mib for s, n in self._counts.items()) / cores
        self.cpu_steps = sorted({s.cpu_milli for s, _ in self.weights})
        self.memory_steps = sorted({s.memory_mib for s, _ in self.weights})
        self.generation += 1

    def force_reweigh(self) -> None:
        """Weigh the window now, however little it moved (tests)."""
        self.weights = ()
        self._reweigh()

    def covered(self, free_cpu: int | None, free_memory: int | None) -> tuple[int, int]:
        """How many of the shapes' CPU and memory requests fit (None: unknown, all)."""
        cpu = (
            len(self.cpu_steps)
            if free_cpu is None
            else bisect.bisect_right(self.cpu_steps, free_cpu)
        )
        memory = (
            len(self.memory_steps)
            if free_memory is None
            else bisect.bisect_right(self.memory_steps, free_memory)
        )
        return cpu, memory


def moved(old: Sequence[tuple[Shape, float]], new: Sequence[tuple[Shape, float]]) -> float:
    """How far the recent demand moved from the weights in use: the share of it that
    would have to be weighed differently (total variation distance, 0..1)."""
    before, after = dict(old), dict(new)
    return 0.5 * sum(abs(before.get(s, 0.0) - after.get(s, 0.0)) for s in before.keys() | after)


def usable(shape: Shape, device: DeviceKey) -> bool:
    """Whether one share of ``shape`` can go on ``device``."""
    model, word, slots, free_cores, free_memory, total_memory, idle = device
    return (
        slots > 0
        and word == shape.type_word
        and (idle if shape.cores >= 100 else free_cores >= shape.cores and free_cores > 0)
        and free_memory >= shape.memory_on(total_memory)
        and shape.type_ok(model)
    )


def stranded(shape: Shape, devices: Sequence[DeviceKey], cpu_ok: bool) -> int:
    """Free cores (percent) on these devices that ``shape`` cannot use (the plain
    definition; ``FragmentCache`` computes the same sum with bit masks)."""
    free = sum(d[3] for d in devices)
    fits = [d for d in devices if usable(shape, d)]
    if not cpu_ok or len(fits) < shape.count:
        return free
    return free - sum(d[3] for d in fits)


def fragment(window: ShapeWindow, key: NodeKey) -> float:
    """The node's weighted stranded amount over the window's shapes."""
    total = 0.0
    for shape, weight in window.weights:
        total += weight * stranded(shape, key[0], _room_ok(window, shape, key))
    return total


def _room_ok(window: ShapeWindow, shape: Shape, key: NodeKey) -> bool:
    return (
        bisect.bisect_right(window.cpu_steps, shape.cpu_milli) <= key[1]
        and bisect.bisect_right(window.memory_steps, shape.memory_mib) <= key[2]
    )


class FragmentCache:
    """``fragment`` per node key, valid for one window generation.

    The same sum, computed with one bit per shape: a device's mask has the bits of the
    shapes it can take one share of; a shape is *met* on the node when the node's CPU
    and memory take its pod and enough devices have its bit. Then
    fragment = free - sum over devices of free * (weight of the met shapes it takes).
    """

    def __init__(self, window: ShapeWindow) -> None:
        self.window = window
        self._generation = -1
        self._values: dict[NodeKey, float] = {}
        self._masks: dict[DeviceKey, int] = {}
        self._room_masks: dict[tuple[int, int], int] = {}
        self._weight_of: dict[int, float] = {}
        self._single = 0  # shapes of one device
        self._multi: list[tuple[int, int]] = []  # (bit, devices) of the others
        self._total_weight = 0.0
        self._most = 0  # the most devices a shape asks for

    def _reset(self) -> None:
        self._values.clear()
        self._masks.clear()
        self._room_masks.clear()
        self._weight_of.clear()
        self._generation = self.window.generation
        self._single = 0
        self._multi = []
        self._total_weight = sum(w for _s, w in self.window.weights)
        for bit, (shape, _weight) in enumerate(self.window.weights):
            if shape.count <= 1:
                self._single |= 1 << bit
            else:
                self._multi.append((bit, shape.count))
        self._most = max((count for _bit, count in self._multi), default=0)

    def __call__(self, key: NodeKey) -> float:
        if self._generation != self.window.generation:
            self._reset()
        value = self._values.get(key)
        if value is None:
            if len(self._values) > 200_000:
                self._values.clear()
            value = self._values[key] = self._compute(key)
        return value

    def _mask(self, device: DeviceKey) -> int:
        mask = self._masks.get(device)
        if mask is None:
            mask = 0
            for bit, (shape, _weight) in enumerate(self.window.weights):
                if usable(shape, device):
                    mask |= 1 << bit
            self._masks[device] = mask
        return mask

    def _room_mask(self, key: NodeKey) -> int:
        room = (key[1], key[2])
        mask = self._room_masks.get(room)
        if mask is None:
            mask = 0
            for bit, (shape, _weight) in enumerate(self.window.weights):
                if _room_ok(self.window, shape, key):
                    mask |= 1 << bit
            self._room_masks[room] = mask
        return mask

    def _weight(self, mask: int) -> float:
        weight = self._weight_of.get(mask)
        if weight is None:
            weight = sum(w for bit, (_s, w) in enumerate(self.window.weights) if mask >> bit & 1)
            self._weight_of[mask] = weight
        return weight

    def _compute(self, key: NodeKey) -> float:
        masks, met = self.parts(key[0])
        return self.value(key[0], masks, met & self._room_mask(key))

    def parts(self, devices: Sequence[DeviceKey]) -> tuple[list[int], int]:
        """The masks of these devices (a node key's, in its order) and the shapes met on
        them before the node's CPU and memory are asked (``room_mask`` is that part)."""
        if self._generation != self.window.generation:
            self._reset()
        masks = [self._mask(d) for d in devices]
        any_device = 0
        for mask in masks:
            any_device |= mask
        met = any_device & self._single
        if self._multi:
            # at_least[k]: the shapes k or more of the devices can take a share of
            at_least = [-1] + [0] * self._most
            for mask in masks:
                for k in range(self._most, 0, -1):
                    at_least[k] |= at_least[k - 1] & mask
            for bit, count in self._multi:
                if at_least[count] >> bit & 1:
                    met |= 1 << bit
        return masks, met

    def room_mask(self, covered_cpu: int, covered_memory: int) -> int:
        """The shapes whose pods a node covering that many CPU and memory steps takes."""
        if self._generation != self.window.generation:
            self._reset()
        return self._room_mask(((), covered_cpu, covered_memory))

    def value(self, devices: Sequence[DeviceKey], masks: Sequence[int], met: int) -> float:
        """The fragment of these devices with these masks, when the shapes ``met`` are."""
        free = 0
        total = 0.0
        for device, mask in zip(devices, masks, strict=True):
            free += device[3]
            if mask & met:
                total += device[3] * self._weight(mask & met)
        return free * self._total_weight - total


def starved(free_cores: int, free_cpu: int, free_memory: int, window: ShapeWindow) -> float:
    """Free cores the node's free CPU or memory cannot feed at the recent pods' ratio."""
    usable = float(free_cores)
    if window.cpu_per_core > 0:
        usable = min(usable, free_cpu / window.cpu_per_core)
    if window.memory_per_core > 0:
        usable = min(usable, free_memory / window.memory_per_core)
    return free_cores - max(0.0, usable)


def node_key(devices: Iterable[DeviceKey | None], covered: tuple[int, int]) -> NodeKey:
    return (tuple(sorted(d for d in devices if d is not None)), covered[0], covered[1])
