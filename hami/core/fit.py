"""Does a pod fit on a node's devices, on which ones, and if not, why (reason codes).

Pure. Devices are checked in this order, and the first failing check is the device's
reason (the codes are HAMi's, so operators see the same words):

=================================  ==============================================
``CardUuidMismatch``               excluded by ``use-/nouse-…uuid``
``CardTypeMismatch``               excluded by ``use-/nouse-…type`` or ``vgpu-mode``
``CardUnhealthy``                  the node reports the device unhealthy
``CardTimeSlicingExhausted``       every split slot is taken
``CardMigTopologyInfeasible``      a MIG GPU has no profile with a free placement for
                                   the request (the reason names them: hami.core.migfit)
``CardInsufficientMemory``         not enough free memory for the request
``ExclusiveDeviceAllocateConflict``  100 cores asked but the device is in use, or the
                                   device is held exclusively by another container
``CardComputeUnitsExhausted``      all of the device's cores are taken
``CardInsufficientCore``           not enough free cores for the request
``AllocatedCardsInsufficientRequest``  the device fits, but too few devices do
``NumaNotFit``                     the device fits, but no NUMA node has enough of them
                                   (``numa-bind``)
``ModeNotFit``                     (every device) the node does not offer the mode the
                                   pod asks for (Ascend's soft split: ``hami-vnpu-core``)
=================================  ==============================================

Under the ``mutex`` policy a device in use (by anyone, this pod's earlier containers
included) is ``ExclusiveDeviceAllocateConflict``.

A node's reason lists the reasons of the first container that does not fit, as
``{devices}/{node devices} {code}`` sorted by count, e.g.
``3/4 CardInsufficientMemory, 1/4 CardTypeMismatch``.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hami.core import migfit
from hami.core.requests import (
    DEFAULT_WEIGHTS,
    DevicePolicy,
    DeviceRequest,
    PodRequest,
    Selectors,
    Weights,
    device_policy_of,
)
from hami.core.usage import DeviceState, Use, hold, with_init_peaks
from hami.protocol import ContainerDevice, handshake
from hami.protocol.mig import MigAllocation, MigPlacement

CARD_UUID_MISMATCH = "CardUuidMismatch"
CARD_TYPE_MISMATCH = "CardTypeMismatch"
CARD_UNHEALTHY = "CardUnhealthy"
CARD_SLOTS_EXHAUSTED = "CardTimeSlicingExhausted"
CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
EXCLUSIVE_CONFLICT = "ExclusiveDeviceAllocateConflict"
CARD_CORES_EXHAUSTED = "CardComputeUnitsExhausted"
CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
INSUFFICIENT_DEVICES = "AllocatedCardsInsufficientRequest"
NUMA_NOT_FIT = "NumaNotFit"
MODE_NOT_FIT = "ModeNotFit"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
NODE_UNREGISTERED = handshake.NODE_UNREGISTERED

BINPACK = "binpack"
SPREAD = "spread"
NUMA = "numa"
# topology-aware compares every set of the asked size; past this many sets it grows one
# set greedily instead (a node annotation cannot make a decision take long).
MAX_COMBINATIONS = 5000

PairScores = Mapping[str, Mapping[str, int]]  # uuid -> peer uuid -> link score


@dataclass(frozen=True, slots=True)
class TypeView:
    """One device type on one node, as the fit needs it."""

    devices: Sequence[DeviceState]
    unavailable: str | None = None  # reason the type may not be used, or None
    # Link scores between devices (``hami.io/node-{type}-score``, higher is better): what
    # ``topology-aware`` picks by. Empty: none known.
    pair_scores: PairScores = field(default_factory=dict)
    # The modes the node offers for the type (``DeviceKind.node_offers``); None: the kind has
    # no such rule, every request fits as far as modes go.
    offers: frozenset[str] | None = None


@dataclass(slots=True)
class NodeFit:
    """Where each container's devices go on this node, and what the pod then holds."""

    assignment: dict[str, list[list[ContainerDevice]]]  # type -> per container devices
    usage: dict[str, Use]  # uuid -> the pod's hold
    utilisation_delta: float  # sum over touched devices of the utilisation increase
    # the MIG instances reserved (hami.io/vgpu-mig-allocations), by container and device
    mig: tuple[MigAllocation, ...] = ()


@dataclass(slots=True)
class NodeMiss:
    reason: str
    counts: Counter[str] = field(default_factory=Counter)  # device reason -> devices


def format_reasons(counts: Mapping[str, int], total: int) -> str:
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{n}/{total} {code}" for code, n in ordered)


def device_reason(
    device: DeviceState,
    request: DeviceRequest,
    selectors: Selectors,
    extra: Use | None,
    *,
    taken: Sequence[MigPlacement] = (),
) -> str | None:
    """Why ``device`` cannot take one slice of ``request`` (None: it can); ``taken``:
    the MIG placements this pod already chose on it."""
    if not selectors.uuid_ok(device.uuid):
        return CARD_UUID_MISMATCH
    if not selectors.type_ok(device.model) or not migfit.mode_allows(
        selectors.vgpu_mode, device.mode
    ):
        return CARD_TYPE_MISMATCH
    if not device.healthy:
        return CARD_UNHEALTHY
    used, used_memory, used_cores = device.used, device.used_memory, device.used_cores
    if extra is not None:
        used += extra.slots
        used_memory += extra.memory
        used_cores += extra.cores
    if used >= device.count:
        return CARD_SLOTS_EXHAUSTED
    if device.mig_hold is not None or migfit.is_mig(device):  # MIG terms before memory
        why = migfit.reason(device, request.memory_on(device.total_memory), taken)
        if why is not None:
            return why
    if request.memory_on(device.total_memory) > device.total_memory - used_memory:
        return CARD_INSUFFICIENT_MEMORY
    if request.cores >= 100 and used > 0:
        return EXCLUSIVE_CONFLICT
    if device.total_cores > 0:
        if used_cores >= device.total_cores:
            return CARD_CORES_EXHAUSTED
        if request.cores > device.total_cores - used_cores:
            return CARD_INSUFFICIENT_CORE
    elif used_cores >= 100:
        return EXCLUSIVE_CONFLICT
    return None


def _device_score(
    device: DeviceState, memory: int, cores: int, extra: Use | None, weights: Weights
) -> float:
    slots = 1
    if extra is not None:
        slots += extra.slots
        memory += extra.memory
        cores += extra.cores
    if weights == DEFAULT_WEIGHTS:
        return device.utilisation(slots, memory, cores)
    return weighted_utilisation(device, slots, memory, cores, weights)


def weighted_utilisation(
    device: DeviceState, slots: int, memory: int, cores: int, weights: Weights
) -> float:
    """``DeviceState.utilisation`` with per-term weights (``hami.io/device-scoring-weights``):
    the weighted mean of the slot, memory and (with a core limiter) core shares."""
    total = weights.slot * ((device.used + slots) / device.count if device.count else 1.0)
    total += weights.memory * (
        (device.used_memory + memory) / device.total_memory if device.total_memory else 1.0
    )
    weight = weights.slot + weights.memory
    if device.total_cores:
        total += weights.core * (device.used_cores + cores) / device.total_cores
        weight += weights.core
    return total / weight if weight else 0.0


def _sort_key(policy: DevicePolicy, score: float, device: DeviceState) -> tuple[float, ...]:
    """The policy's sort keys in the order written: binpack takes the most used first,
    spread the least used, numa the lowest NUMA node (so picks share one)."""
    key: list[float] = []
    for name in policy.sort_keys:
        if name == BINPACK:
            key.append(-score)
        elif name == SPREAD:
            key.append(score)
        else:
            key.append(float(device.numa))
    return tuple(key)


def fit_container(
    devices: Sequence[DeviceState],
    request: DeviceRequest,
    selectors: Selectors,
    overlay: Mapping[str, Use],
    device_policy: str | DevicePolicy,
    reasons: Counter[str] | None = None,
    *,
    weights: Weights = DEFAULT_WEIGHTS,
    pair_scores: PairScores | None = None,
    mig_taken: Mapping[str, Sequence[MigPlacement]] | None = None,
) -> list[tuple[DeviceState, int]] | None:
    """Devices (with the MiB each gives) for one container's request, or None.

    ``overlay`` is what earlier containers of the same pod already take on these devices.
    ``device_policy`` (a comma list, see ``hami.core.requests.DevicePolicy``) orders the
    fitting devices by its sort keys: ``spread`` prefers the least used (after this
    request, scored with ``weights``), ``binpack`` the most used, ``numa`` the lower NUMA
    node; remaining ties go to the lower device index. ``mutex`` leaves out every device
    in use; ``topology-aware`` picks by ``pair_scores`` (``_best_connected``).
    ``mig_taken``: the MIG placements the pod's earlier containers chose, per device.
    """
    policy = (
        device_policy
        if isinstance(device_policy, DevicePolicy)
        else device_policy_of(device_policy)
    )
    fitting: list[tuple[tuple[float, ...], int, DeviceState, int]] = []
    for device in devices:
        extra = overlay.get(device.uuid) if overlay else None
        taken = mig_taken.get(device.uuid, ()) if mig_taken else ()
        why = device_reason(device, request, selectors, extra, taken=taken)
        if why is None and policy.mutex and device.used + (extra.slots if extra else 0) > 0:
            why = EXCLUSIVE_CONFLICT  # mutex: only devices nobody uses
        if why is not None:
            if reasons is not None:
                reasons[why] += 1
            continue
        memory = request.memory_on(device.total_memory)
        score = _device_score(device, memory, request.cores, extra, weights)
        fitting.append((_sort_key(policy, score, device), device.index, device, memory))
    if request.pick is not None and len(fitting) >= request.count:
        return _picked(devices, fitting, request, overlay, reasons)
    if len(fitting) < request.count:
        if reasons is not None and fitting:
            reasons[INSUFFICIENT_DEVICES] += len(fitting)
        return None
    fitting.sort(key=lambda item: (item[0], item[1]))
    ranked = [(device, memory) for _key, _index, device, memory in fitting]
    if request.module > 1:
        modules = _whole_modules(ranked, request.count, request.module)
        if modules is None and reasons is not None:
            reasons[INSUFFICIENT_DEVICES] += len(fitting)
        return modules
    if selectors.numa_bind:
        groups = _numa_groups(ranked, request.count)
        if not groups:
            if reasons is not None:
                reasons[NUMA_NOT_FIT] += len(fitting)
            return None
        if policy.topology and request.count > 1:
            return _best_connected(groups, request.count, pair_scores or {})
        return groups[0][: request.count]
    if policy.topology and len(ranked) > request.count:
        return _best_connected([ranked], request.count, pair_scores or {})
    return ranked[: request.count]


Pick = tuple[DeviceState, int]  # a device and the MiB it gives


def _picked(
    devices: Sequence[DeviceState],
    fitting: Sequence[tuple[tuple[float, ...], int, DeviceState, int]],
    request: DeviceRequest,
    overlay: Mapping[str, Use],
    reasons: Counter[str] | None,
) -> list[Pick] | None:
    """The devices the request's own picker (``DeviceRequest.pick``) chooses among the
    fitting ones; ``NumaNotFit`` for each fitting device when it chooses none."""
    assert request.pick is not None
    memory = {id(device): mib for _key, _index, device, mib in fitting}
    fits = [id(device) in memory for device in devices]
    chosen = request.pick(devices, fits, request, overlay or {})
    if not chosen or not all(fits[position] for position in chosen):
        if reasons is not None:
            reasons[NUMA_NOT_FIT] += len(fitting)
        return None
    return [(devices[position], memory[id(devices[position])]) for position in chosen]


def _whole_modules(ranked: Sequence[Pick], count: int, module: int) -> list[Pick] | None:
    """Whole modules only (Ascend 910C: the device at ``index`` is in module ``index //
    module``): modules all of whose devices fit, taken in the order of their best-ranked
    device, each in index order; None when they do not make ``count`` exactly."""
    by_module: dict[int, list[Pick]] = {}
    for pick in ranked:
        by_module.setdefault(pick[0].index // module, []).append(pick)
    chosen: list[Pick] = []
    for picks in by_module.values():
        if len(chosen) >= count:
            break
        if len(picks) == module:
            chosen += sorted(picks, key=lambda pick: pick[0].index)
    return chosen if len(chosen) == count else None


def _numa_groups(ranked: Sequence[Pick], count: int) -> list[list[Pick]]:
    """``numa-bind``: the ranked devices of each NUMA node that has at least ``count``;
    the node of the best-ranked device that completes a set comes first."""
    by_numa: dict[int, list[Pick]] = {}
    complete: list[int] = []
    for pick in ranked:
        group = by_numa.setdefault(pick[0].numa, [])
        group.append(pick)
        if len(group) == count:
            complete.append(pick[0].numa)
    return [by_numa[numa] for numa in complete]


def _pair(scores: PairScores, a: str, b: str) -> int:
    forward = scores.get(a)
    if forward is not None and b in forward:
        return forward[b]
    backward = scores.get(b)
    return backward.get(a, 0) if backward is not None else 0


def _set_score(scores: PairScores, picks: Sequence[Pick]) -> int:
    return sum(_pair(scores, a[0].uuid, b[0].uuid) for a, b in itertools.combinations(picks, 2))


def _best_connected(pools: Sequence[Sequence[Pick]], count: int, scores: PairScores) -> list[Pick]:
    """``topology-aware``, as Go HAMi decides: one device goes to the fitting device worst
    connected to the others (keeping well-connected sets free); several go to the set with
    the highest sum of pair scores. Ties keep the policy's order (the earliest set)."""
    if count == 1:
        pool = [pick for group in pools for pick in group]
        totals = [
            sum(_pair(scores, p[0].uuid, q[0].uuid) for q in pool if q is not p) for p in pool
        ]
        return [pool[totals.index(min(totals))]]
    best: list[Pick] | None = None
    best_score = -math.inf
    for group in pools:
        if math.comb(len(group), count) > MAX_COMBINATIONS:
            candidates: Sequence[Sequence[Pick]] = [_greedy_set(group, count, scores)]
        else:
            candidates = list(itertools.combinations(group, count))
        for picks in candidates:
            total = _set_score(scores, picks)
            if total > best_score:
                best, best_score = list(picks), total
    assert best is not None  # every pool has at least ``count`` devices
    return best


def _greedy_set(pool: Sequence[Pick], count: int, scores: PairScores) -> list[Pick]:
    """From the best-ranked device, add the device best connected to those taken so far."""
    chosen = [pool[0]]
    rest = list(pool[1:])
    while len(chosen) < count:
        gains = [sum(_pair(scores, c[0].uuid, p[0].uuid) for c in chosen) for p in rest]
        chosen.append(rest.pop(gains.index(max(gains))))
    return chosen


def fit_pod(
    types: Mapping[str, TypeView],
    request: PodRequest,
    device_policy: str | DevicePolicy,
    *,
    explain: bool = False,
) -> NodeFit | NodeMiss:
    """Place every container's request on this node's devices.

    Init containers run alone, so each is checked against the node's usage only; app
    containers run together, so each sees what the earlier app containers took.
    """
    policy = (
        device_policy
        if isinstance(device_policy, DevicePolicy)
        else device_policy_of(device_policy)
    )
    assignment: dict[str, list[list[ContainerDevice]]] = {
        word: [[] for _ in request.containers] for word in request.type_words
    }
    overlay: dict[str, Use] = {}  # app containers so far
    init_peak: dict[str, Use] = {}
    devices_by_uuid: dict[str, DeviceState] = {}
    # MIG instances of every container (init ones too: never sharing slices with the app)
    mig_taken: dict[str, list[MigPlacement]] = {}
    mig: list[MigAllocation] = []
    for position, container in enumerate(request.containers):
        is_init = position < request.init_count
        for device_request in container:
            view = types.get(device_request.type_word)
            if view is None:
                return NodeMiss(NODE_UNREGISTERED)
            if view.unavailable is not None:
                return NodeMiss(view.unavailable)
            needs = request.selectors_for(device_request.type_word).needs
            if view.offers is not None and not needs <= view.offers:
                # Go HAMi refuses the node before looking at any device (ModeNotFit)
                total = len(view.devices)
                return NodeMiss(
                    format_reasons({MODE_NOT_FIT: total}, total), Counter({MODE_NOT_FIT: total})
                )
            if device_request.count > len(view.devices):
                return NodeMiss(
                    f"{NODE_INSUFFICIENT_DEVICE}: {device_request.count} "
                    f"{device_request.type_word} devices asked, node has {len(view.devices)}"
                )
            reasons: Counter[str] | None = Counter() if explain else None
            chosen = fit_container(
                view.devices,
                device_request,
                request.selectors_for(device_request.type_word),
                {} if is_init else overlay,
                policy,
                reasons,
                weights=request.weights,
                pair_scores=view.pair_scores,
                mig_taken=mig_taken,
            )
            if chosen is None:
                if reasons is None:
                    return NodeMiss("")
                return NodeMiss(format_reasons(reasons, len(view.devices)), reasons)
            entry = assignment[device_request.type_word][position]
            for device, memory in chosen:
                devices_by_uuid[device.uuid] = device
                cores = device_request.cores
                if migfit.is_mig(device):
                    taken = mig_taken.setdefault(device.uuid, [])
                    picked = migfit.choose(device, memory, taken)
                    if picked is None:  # fit_container checked it; never taken
                        return NodeMiss(f"{migfit.MIG_INFEASIBLE} (GPU {device.index})")
                    profile, placement = picked
                    memory, cores = profile.memory_mb, profile.core  # the instance's, as Go
                    mig.append(
                        MigAllocation(position, len(entry), device.uuid, profile.name, placement)
                    )
                    taken.append(placement)
                entry.append(ContainerDevice(device.uuid, device_request.vendor, memory, cores))
                hold(overlay, init_peak, device.uuid, memory, cores, is_init=is_init)
    usage = with_init_peaks(overlay, init_peak)
    delta = 0.0
    for uuid, use in usage.items():
        device = devices_by_uuid[uuid]
        delta += device.utilisation(use.slots, use.memory, use.cores) - device.utilisation()
    return NodeFit(assignment, usage, delta, tuple(mig))
