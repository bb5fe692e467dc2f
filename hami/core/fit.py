"""Does a pod fit on a node's devices, on which ones, and if not, why (reason codes).

Pure. Devices are checked in this order, and the first failing check is the device's
reason (the codes are HAMi's, so operators see the same words):

=================================  ==============================================
``CardUuidMismatch``               excluded by ``use-/nouse-…uuid``
``CardTypeMismatch``               excluded by ``use-/nouse-…type``
``CardUnhealthy``                  the node reports the device unhealthy
``CardTimeSlicingExhausted``       every split slot is taken
``CardInsufficientMemory``         not enough free memory for the request
``ExclusiveDeviceAllocateConflict``  100 cores asked but the device is in use, or the
                                   device is held exclusively by another container
``CardComputeUnitsExhausted``      all of the device's cores are taken
``CardInsufficientCore``           not enough free cores for the request
``AllocatedCardsInsufficientRequest``  the device fits, but too few devices do
``NumaNotFit``                     the device fits, but no NUMA node has enough of them
                                   (``numa-bind``)
=================================  ==============================================

A node's reason lists the reasons of the first container that does not fit, as
``{devices}/{node devices} {code}`` sorted by count, e.g.
``3/4 CardInsufficientMemory, 1/4 CardTypeMismatch``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hami.core.requests import DeviceRequest, PodRequest, Selectors
from hami.core.usage import DeviceState, Use, hold, with_init_peaks
from hami.protocol import ContainerDevice, handshake

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
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
NODE_UNREGISTERED = handshake.NODE_UNREGISTERED

BINPACK = "binpack"
SPREAD = "spread"


@dataclass(frozen=True, slots=True)
class TypeView:
    """One device type on one node, as the fit needs it."""

    devices: Sequence[DeviceState]
    unavailable: str | None = None  # reason the type may not be used, or None


@dataclass(slots=True)
class NodeFit:
    """Where each container's devices go on this node, and what the pod then holds."""

    assignment: dict[str, list[list[ContainerDevice]]]  # type -> per container devices
    usage: dict[str, Use]  # uuid -> the pod's hold
    utilisation_delta: float  # sum over touched devices of the utilisation increase


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
) -> str | None:
    """Why ``device`` cannot take one slice of ``request`` (None: it can)."""
    if not selectors.uuid_ok(device.uuid):
        return CARD_UUID_MISMATCH
    if not selectors.type_ok(device.model):
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


def _device_score(device: DeviceState, memory: int, cores: int, extra: Use | None) -> float:
    slots = 1
    if extra is not None:
        slots += extra.slots
        memory += extra.memory
        cores += extra.cores
    return device.utilisation(slots, memory, cores)


def fit_container(
    devices: Sequence[DeviceState],
    request: DeviceRequest,
    selectors: Selectors,
    overlay: Mapping[str, Use],
    device_policy: str,
    reasons: Counter[str] | None = None,
) -> list[tuple[DeviceState, int]] | None:
    """Devices (with the MiB each gives) for one container's request, or None.

    ``overlay`` is what earlier containers of the same pod already take on these devices.
    ``device_policy`` orders the fitting devices: ``spread`` prefers the least used
    (after this request), ``binpack`` the most used; ties go to the lower device index.
    """
    fitting: list[tuple[float, int, DeviceState, int]] = []
    for device in devices:
        extra = overlay.get(device.uuid) if overlay else None
        why = device_reason(device, request, selectors, extra)
        if why is not None:
            if reasons is not None:
                reasons[why] += 1
            continue
        memory = request.memory_on(device.total_memory)
        score = _device_score(device, memory, request.cores, extra)
        key = -score if device_policy == BINPACK else score
        fitting.append((key, device.index, device, memory))
    if len(fitting) < request.count:
        if reasons is not None and fitting:
            reasons[INSUFFICIENT_DEVICES] += len(fitting)
        return None
    fitting.sort(key=lambda item: (item[0], item[1]))
    if selectors.numa_bind:
        by_numa: dict[int, list[tuple[DeviceState, int]]] = {}
        for _key, _index, device, memory in fitting:
            group = by_numa.setdefault(device.numa, [])
            group.append((device, memory))
            if len(group) == request.count:
                return group  # the NUMA node of the best-ranked device that completes
        if reasons is not None:
            reasons[NUMA_NOT_FIT] += len(fitting)
        return None
    return [(device, memory) for _key, _index, device, memory in fitting[: request.count]]


def fit_pod(
    types: Mapping[str, TypeView],
    request: PodRequest,
    device_policy: str,
    *,
    explain: bool = False,
) -> NodeFit | NodeMiss:
    """Place every container's request on this node's devices.

    Init containers run alone, so each is checked against the node's usage only; app
    containers run together, so each sees what the earlier app containers took.
    """
    assignment: dict[str, list[list[ContainerDevice]]] = {
        word: [[] for _ in request.containers] for word in request.type_words
    }
    overlay: dict[str, Use] = {}  # app containers so far
    init_peak: dict[str, Use] = {}
    devices_by_uuid: dict[str, DeviceState] = {}
    for position, container in enumerate(request.containers):
        is_init = position < request.init_count
        for device_request in container:
            view = types.get(device_request.type_word)
            if view is None:
                return NodeMiss(NODE_UNREGISTERED)
            if view.unavailable is not None:
                return NodeMiss(view.unavailable)
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
                device_policy,
                reasons,
            )
            if chosen is None:
                if reasons is None:
                    return NodeMiss("")
                return NodeMiss(format_reasons(reasons, len(view.devices)), reasons)
            entry = assignment[device_request.type_word][position]
            for device, memory in chosen:
                devices_by_uuid[device.uuid] = device
                entry.append(
                    ContainerDevice(
                        device.uuid, device_request.vendor, memory, device_request.cores
                    )
                )
                hold(
                    overlay,
                    init_peak,
                    device.uuid,
                    memory,
                    device_request.cores,
                    is_init=is_init,
                )
    usage = with_init_peaks(overlay, init_peak)
    delta = 0.0
    for uuid, use in usage.items():
        device = devices_by_uuid[uuid]
        delta += device.utilisation(use.slots, use.memory, use.cores) - device.utilisation()
    return NodeFit(assignment, usage, delta)
