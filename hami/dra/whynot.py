"""Why a pod's claims can or cannot be met on each node, from the published devices and
the allocated claims: the reasoning of ``hami explain`` in DRA mode. Pure.

kube-scheduler's DynamicResources plugin says only "cannot allocate all claims". This
judges each request as its allocator does for hami's consumable capacities, device by
device: taints the request does not tolerate, the model selector, a device another claim
holds whole (or an unshared one already allocated), the most one request may name, free
share slots, free memory and free cores; then whether all of the pod's requests fit on
the node together (a small search over the devices that fit each one alone). What it
cannot judge (other CEL, matchAttribute, the node's CPU, memory and taints) is
kube-scheduler's, and the answer says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from hami.dra import migwhynot, taints
from hami.dra.claimasks import Pinned, Toleration, Want, Wanted
from hami.dra.devicepicture import DeviceView, Held, PartView, Taint

BLOCKING = ("NoSchedule", "NoExecute")  # a taint with effect None only informs
SEARCH_STEPS = 20_000  # placements tried per node before the combined check gives up


@dataclass(frozen=True, slots=True)
class Verdict:
    fits: bool
    lines: tuple[str, ...]  # why not (empty when it fits); notes when it fits anyway


@dataclass(slots=True)
class _Free:
    slots: int
    memory: int
    cores: int
    untouched: bool  # nothing allocated: an unshared device can still be taken


def tolerated(tolerations: Sequence[Toleration], taint: Taint) -> bool:
    """Kubernetes' toleration match, as for node taints."""
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists" and (not t.key or t.key == taint.key):
            return True
        if t.operator == "Equal" and t.key == taint.key and t.value == taint.value:
            return True
    return False


def _asks(want: Want, device: DeviceView) -> tuple[int, int]:
    """MiB and cores one allocation of ``want`` consumes on ``device``."""
    memory = device.memory.default if want.memory is None else want.memory
    cores = device.cores.default if want.cores is None else want.cores
    return memory, cores


def _memory_words(want: Want, memory: int) -> str:
    if want.memory is None:
        return f"the whole device ({memory} MiB: no memory named)"
    return f"{memory} MiB"


def blocked(want: Want, device: DeviceView, held: Held) -> str | None:
    """Why ``want`` can never use ``device`` as it is now (None: it may, room allowing)."""
    for taint in device.taints:
        if taint.effect in BLOCKING and not tolerated(want.tolerations, taint):
            meaning = taints.describe(taint.key, taint.value)
            why = f" ({meaning})" if meaning else ""
            return (
                f"{device.label} has the taint {taint}{why}, which {want.label} does not tolerate"
            )
    model = device.model.lower()
    if want.use_models and not any(m in model for m in want.use_models):
        words = " or ".join(repr(m) for m in want.use_models)
        model_name = device.model or "device of no model"
        return f"{device.label} is a {model_name}, {want.label} asks a model containing {words}"
    excluded = [m for m in want.nouse_models if m in model]
    if excluded:
        return f"{device.label} is a {device.model}, {want.label} excludes {excluded[0]!r}"
    if held.whole:
        holder = held.whole[0]
        return f"{device.label} is allocated whole to claim {holder}, {want.label} cannot share it"
    if not device.shared and held.claims:
        return f"{device.label} is not shared and already allocated to claim {held.claims[0]}"
    memory, cores = _asks(want, device)
    if memory > device.memory.most:
        return (
            f"{device.label} has {device.memory.total} MiB in all, "
            f"{want.label} asks {_memory_words(want, memory)}"
        )
    if cores > device.cores.most:
        most = device.cores.most
        return f"{device.label} allows at most {most}% cores per claim, {want.label} asks {cores}%"
    return None


def _copies(want: Want, device: DeviceView, free: _Free) -> int:
    """How many allocations of ``want`` fit in what is free on ``device``."""
    if not device.shared:
        return 1 if free.untouched else 0
    memory, cores = _asks(want, device)
    fits = free.slots
    if memory > 0:
        fits = min(fits, free.memory // memory)
    if cores > 0:
        fits = min(fits, free.cores // cores)
    return max(0, fits)


def _short(want: Want, device: DeviceView, free: _Free, held: Held) -> str:
    """Why nothing of ``want`` fits in what is free on ``device`` (room, not a block)."""
    if not device.shared:
        return f"{device.label} is not shared and already taken"
    if free.slots <= 0:
        return (
            f"{device.label} has all {device.slots.total} share slots taken "
            f"({len(held.claims)} claims), {want.label} needs one"
        )
    memory, cores = _asks(want, device)
    parts = []
    if memory > free.memory:
        asked = _memory_words(want, memory)
        parts.append(f"{device.label} has {free.memory} MiB free, {want.label} asks {asked}")
    if cores > free.cores:
        parts.append(f"{device.label} has {free.cores}% cores free, {want.label} asks {cores}%")
    return "; ".join(parts) or f"{device.label} has no room for {want.label}"


def _free(device: DeviceView, held: Held) -> _Free:
    # an over-committed device (a slice shrunk under its claims) is full, never negative
    return _Free(
        slots=max(0, device.slots.total - held.use.slots),
        memory=max(0, device.memory.total - held.use.memory),
        cores=max(0, device.cores.total - held.use.cores),
        untouched=not held.claims,
    )


def _alone(
    want: Want, devices: Sequence[DeviceView], holds: Mapping[str, Held]
) -> tuple[int, list[str]]:
    """How many allocations of ``want`` the node can give (capped at what it asks), and
    why each device that gives none cannot."""
    room = 0
    why: list[str] = []
    for device in devices:
        if device.driver != want.driver:
            continue
        held = holds.get(device.name) or Held()
        reason = blocked(want, device, held)
        if reason is None:
            copies = _copies(want, device, _free(device, held))
            if copies > 0:
                room += 1 if want.distinct else copies
                continue
            reason = _short(want, device, _free(device, held), held)
        why.append(reason)
    return min(room, want.count), why


def _placements(
    want: Want, devices: Sequence[DeviceView], free: Mapping[str, _Free]
) -> Iterator[tuple[DeviceView, ...]]:
    usable = [d for d in devices if _copies(want, d, free[d.name]) > 0]
    if want.distinct or not all(d.shared for d in usable):
        yield from itertools.combinations(usable, want.count)
        return
    for combo in itertools.combinations_with_replacement(usable, want.count):
        if all(combo.count(d) <= _copies(want, d, free[d.name]) for d in set(combo)):
            yield combo


def _take(want: Want, device: DeviceView, free: _Free, sign: int) -> None:
    memory, cores = _asks(want, device)
    free.slots -= sign
    free.memory -= sign * memory
    free.cores -= sign * cores
    if not device.shared:
        free.untouched = sign < 0


def together(
    wanted: Sequence[Sequence[Want]], devices: Sequence[DeviceView], holds: Mapping[str, Held]
) -> bool | None:
    """Whether every request (its usable choices) fits on the node at once; None when the
    search ran out of steps (undecided)."""
    free = {d.name: _free(d, holds.get(d.name) or Held()) for d in devices}
    steps = 0

    def place(i: int) -> bool | None:
        nonlocal steps
        if i == len(wanted):
            return True
        undecided = False
        for want in wanted[i]:
            mine = [d for d in devices if d.driver == want.driver]
            for combo in _placements(want, mine, free):
                steps += 1
                if steps > SEARCH_STEPS:
                    return None
                for device in combo:
                    _take(want, device, free[device.name], 1)
                found = place(i + 1)
                for device in combo:
                    _take(want, device, free[device.name], -1)
                if found:
                    return True
                undecided = undecided or found is None
        return None if undecided else False

    return place(0)


def judge_node(
    node: str,
    wanted: Sequence[Wanted],
    devices: Sequence[DeviceView],
    holds: Mapping[str, Held],
    pinned: Sequence[Pinned] = (),
    parts: Sequence[PartView] = (),
) -> Verdict:
    """Whether the node can meet every request of the pod; if not, why, naming the
    claim, the request, the device and the shortfall. ``holds``: by device name, this
    node's only; ``parts``: its MIG partitions."""
    lines = [
        f"{p.claim} is allocated on node {p.node} ({', '.join(p.devices)}): "
        "the pod can only go there"
        for p in pinned
        if p.node != node
    ]
    drivers = {d.driver for d in devices} | {p.driver for p in parts}
    usable: list[list[Want]] = []
    for request in wanted:
        ok: list[Want] = []
        why: list[str] = []
        for want in request.choices:
            if want.driver not in drivers:
                why.append(f"the node publishes no {want.driver} devices, {want.label} asks them")
                continue
            if want.mig_profile is None:
                room, reasons = _alone(want, devices, holds)
                reasons.extend(migwhynot.not_shared(want, parts))
            else:
                room, reasons = migwhynot.alone(want, parts, holds, _blocks(want))
            if room >= want.count:
                ok.append(want)
                continue
            if room:
                why.append(f"{want.label} asks {want.count} devices, {room} can take it")
            why.extend(reasons)
        if not ok:
            lines.extend(why)
        # a request a partition meets is left out of the combined search (shared devices)
        if not any(w.mig_profile for w in ok):
            usable.append(ok)
    if lines:
        full = "" if parts else _all_used(devices, holds)
        return Verdict(False, tuple(([full] if full else []) + lines))
    fit = together(usable, devices, holds)
    if fit is False:
        names = ", ".join(r.label for r in wanted)
        return Verdict(
            False, (f"each request fits alone, but not all together on its devices ({names})",)
        )
    if fit is None:
        return Verdict(True, ("each request fits alone; too many ways to check them together",))
    return Verdict(True, ())


def _blocks(want: Want) -> Callable[[Taint], bool]:
    return lambda taint: taint.effect in BLOCKING and not tolerated(want.tolerations, taint)


def _all_used(devices: Sequence[DeviceView], holds: Mapping[str, Held]) -> str:
    """A summary line when no device of the node has any room left."""
    if not devices:
        return ""
    for device in devices:
        held = holds.get(device.name) or Held()
        free = _free(device, held)
        takeable = not held.whole and (device.shared or not held.claims)
        if takeable and free.slots > 0 and free.memory > 0:
            return ""
    return f"every one of the node's {len(devices)} hami devices is fully used"
