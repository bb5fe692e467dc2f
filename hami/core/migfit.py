"""NVIDIA dynamic MIG in the scheduler (protocol.md section 10, docs/scheduler.md "MIG").

Pure. A GPU registered with mode ``mig`` is not shared by HAMi-core limits: each device a
container gets on it is one GPU instance of a profile the node offers, at a placement
(memory slices) no other instance on that GPU overlaps. As Go HAMi 2.10 does:

- the request's memory (``gpumem``, or ``gpumem-percentage`` of the GPU's memory) picks the
  smallest profile with at least that memory that has a free placement, in Go's search
  order (:func:`hami.protocol.mig.select_mig_profile`);
- the decision's devices value then carries the profile's memory and cores, and
  ``hami.io/vgpu-mig-allocations`` names GPU, profile and placement per device;
- a GPU's occupancy is every placement any pod's value reserves there, realised or not
  (:class:`MigHold`, kept per node by :mod:`hami.core.cluster` like device usage);
- ``nvidia.com/vgpu-mode`` on the pod limits it to devices whose mode the value contains
  (``mig`` only MIG GPUs, ``hami-core`` only the others).

Fail closed: a GPU some pod uses without a readable reservation for it (no value, an
unreadable one, fewer reservations than devices) has unknown occupancy and takes no
instance; a GPU not in MIG mode that holds reservations takes nothing either (Go marks
both unhealthy).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hami.protocol import ContainerDevice, ProtocolError
from hami.protocol._ints import UINT32_MAX
from hami.protocol.keys import MIG_ALLOCATIONS
from hami.protocol.mig import (
    MIG_MODE,
    MigAllocation,
    MigPlacement,
    MigProfile,
    decode_mig_allocations,
    placements_overlap,
    select_mig_profile,
)

if TYPE_CHECKING:
    from hami.core.usage import DeviceState, Use

MIG_INFEASIBLE = "CardMigTopologyInfeasible"  # Go HAMi's reason code
# A pod uses the GPU without a readable reservation for that use: its occupancy is unknown.
# Size 0 never comes from a readable value (decode_mig_allocations refuses it).
WHOLE = MigPlacement(0, 0)
VGPU_MODE_ANNOTATION = "vgpu-mode"  # {domain}/vgpu-mode, e.g. nvidia.com/vgpu-mode

PodMig = Mapping[str, tuple[MigPlacement, ...]]  # gpu uuid -> what one pod reserves there


@dataclass(slots=True, eq=False)
class MigHold:
    """Every pod's reservations on one GPU of a node: placements with how many pods hold
    each (``WHOLE``: unknown), and the slots of the pods that have a value for the GPU
    (fewer than the GPU's used slots: some pod uses it without one)."""

    placements: Counter[MigPlacement] = field(default_factory=Counter)
    covered: int = 0

    def is_empty(self) -> bool:
        return self.covered == 0 and not self.placements

    def reserved(self) -> bool:
        """Whether any real reservation (not ``WHOLE``) is held."""
        return any(p != WHOLE for p in self.placements)


def is_mig(device: DeviceState) -> bool:
    return device.mode == MIG_MODE


def legal_profiles(profiles: Sequence[MigProfile]) -> tuple[MigProfile, ...]:
    """The profiles with only placements a reservation can hold: size above 0 and ending
    within 32 bits (Go would place a size-0 instance and then write no reservation)."""
    out = []
    for profile in profiles:
        placements = tuple(
            p for p in profile.placements if p.size > 0 and p.start + p.size <= UINT32_MAX
        )
        out.append(
            profile
            if placements == profile.placements
            else MigProfile(
                profile.name, profile.memory_mb, profile.core, profile.slice_count, placements
            )
        )
    return tuple(out)


def gpu_slices(profiles: Sequence[MigProfile]) -> int:
    """The GPU's memory slices as its profiles' placements span them."""
    return max((p.start + p.size for pr in profiles for p in pr.placements), default=0)


def occupied(device: DeviceState) -> list[MigPlacement] | None:
    """The placements taken on a MIG GPU; None when its occupancy is unknown."""
    hold = device.mig_hold
    if hold is None:
        return [] if device.used == 0 else None
    if hold.placements.get(WHOLE, 0) > 0 or device.used > hold.covered:
        return None
    return list(hold.placements.elements())


def choose(
    device: DeviceState, memory: int, taken: Sequence[MigPlacement] = ()
) -> tuple[MigProfile, MigPlacement] | None:
    """Profile and placement for one instance of ``memory`` MiB on a MIG GPU, beside what
    pods hold and ``taken`` (this pod's instances chosen so far); None: none fits."""
    held = occupied(device)
    if held is None:
        return None
    return select_mig_profile(device.mig_profiles, [*held, *taken], memory)


def reason(device: DeviceState, memory: int, taken: Sequence[MigPlacement] = ()) -> str | None:
    """Why the device cannot take one MIG instance of ``memory`` MiB (None: it can, or it
    is not a MIG GPU and holds no reservation). The reason names profile and GPU."""
    where = f"GPU {device.index}"
    if not is_mig(device):
        hold = device.mig_hold
        if hold is not None and hold.reserved():
            return f"{MIG_INFEASIBLE} ({where} is not in MIG mode but holds MIG reservations)"
        return None
    if choose(device, memory, taken) is not None:
        return None
    if occupied(device) is None:
        return (
            f"{MIG_INFEASIBLE} ({where}: a pod uses it without a readable {MIG_ALLOCATIONS} "
            "reservation, so its free slices are unknown)"
        )
    big_enough = sorted(
        (p for p in device.mig_profiles if p.memory_mb >= memory),
        key=lambda p: (p.memory_mb, p.slice_count),
    )
    if not big_enough:
        return f"{MIG_INFEASIBLE} (no MIG profile of {where} has {memory} MiB)"
    larger = " or larger" if len(big_enough) > 1 else ""
    return f"{MIG_INFEASIBLE} (no {big_enough[0].name}{larger} placement free on {where})"


def mode_allows(vgpu_mode: str | None, device_mode: str) -> bool:
    """``{domain}/vgpu-mode`` as Go reads it: absent allows every device, else the value
    must contain the device's mode."""
    return vgpu_mode is None or device_mode in vgpu_mode


# --------------------------------------------------------------------------- pods


def pod_mig(
    value: str | None,
    assignment: Mapping[str, Sequence[Sequence[ContainerDevice]]],
    kept: PodMig | None = None,
) -> tuple[PodMig, str | None]:
    """What a pod reserves per GPU from its ``hami.io/vgpu-mig-allocations`` (None: the
    annotation is absent) and its decision's devices per type; and an error.

    Every reservation counts on its GPU, named by the pod's devices or not (as Go counts
    them). A GPU the pod has more devices on than reservations also holds ``WHOLE``. An
    unreadable value keeps ``kept`` (the same decision's last readable hold) or holds
    every GPU the devices name ``WHOLE``."""
    if value is None:
        return {}, None
    entries: Counter[str] = Counter(
        device.uuid
        for per_container in assignment.values()
        for devices in per_container
        for device in devices
    )
    try:
        allocations = decode_mig_allocations(value)
    except ProtocolError as exc:
        if kept:
            return kept, f"{exc}; counted as holding what its last readable value held"
        held = ", ".join(sorted(entries)) or "no GPU"
        return {uuid: (WHOLE,) for uuid in entries}, (
            f"{exc}; counted as holding every MIG slice of {held} until the pod is deleted "
            "or its value is fixed"
        )
    placements: dict[str, list[MigPlacement]] = {}
    for allocation in allocations:
        placements.setdefault(allocation.gpu_uuid, []).append(allocation.placement)
    for uuid, count in entries.items():
        mine = placements.setdefault(uuid, [])
        if count > len(mine):
            mine.append(WHOLE)
    return {uuid: tuple(held) for uuid, held in placements.items()}, None


def fit_mig(allocations: Iterable[MigAllocation]) -> PodMig:
    """A decision's reservations per GPU, as :func:`pod_mig` reads them back."""
    placements: dict[str, list[MigPlacement]] = {}
    for allocation in allocations:
        placements.setdefault(allocation.gpu_uuid, []).append(allocation.placement)
    return {uuid: tuple(held) for uuid, held in placements.items()}


def apply_hold(
    holds: MutableMapping[str, MigHold],
    mig: PodMig,
    usage: Mapping[str, Use],
    sign: int,
    devices: Mapping[str, DeviceState],
) -> None:
    """Add (``sign`` 1) or remove (-1) one pod's reservations to a node's holds, and point
    the node's devices at them."""
    for uuid, placements in mig.items():
        hold = holds.get(uuid)
        if hold is None:
            hold = holds[uuid] = MigHold()
        for placement in placements:
            count = hold.placements[placement] + sign
            if count > 0:
                hold.placements[placement] = count
            else:
                hold.placements.pop(placement, None)
        use = usage.get(uuid)
        hold.covered += sign * (use.slots if use is not None else 0)
        if hold.is_empty():
            del holds[uuid]
            hold_now: MigHold | None = None
        else:
            hold_now = hold
        device = devices.get(uuid)
        if device is not None:
            device.mig_hold = hold_now


def fence_refusal(
    device: DeviceState,
    hold: MigHold | None,
    mine: Sequence[MigPlacement],
    remove: Sequence[tuple[PodMig, int]],
    add: Sequence[tuple[PodMig, int]],
    slots: int,
) -> str | None:
    """The bind fence on a MIG GPU (hami.core.fence): why ``mine`` (the decision's
    placements there) may not be bound beside what others hold: ``hold`` less ``remove``
    plus ``add`` (each a pod's reservations with its slots on this GPU), ``slots`` the
    others' slots on it. None: bind it."""
    held: Counter[MigPlacement] = Counter(hold.placements) if hold is not None else Counter()
    covered = hold.covered if hold is not None else 0
    for pods, sign in ((remove, -1), (add, 1)):
        for mig, pod_slots in pods:
            placements = mig.get(device.uuid)
            if placements is None:
                continue
            held.update({p: sign for p in placements})
            covered += sign * pod_slots
    where = f"MIG GPU {device.uuid}"
    if held[WHOLE] > 0 or slots > covered:
        return f"{where}: a pod uses it without a readable reservation"
    taken = [p for p, n in held.items() if n > 0]
    for placement in mine:
        if placement == WHOLE or any(placements_overlap(placement, t) for t in taken):
            return (
                f"{where}: slices {placement.start}-{placement.start + placement.size - 1} "
                "are no longer free"
            )
    return None


def attach(holds: Mapping[str, MigHold], devices: Iterable[DeviceState]) -> None:
    """Point freshly registered devices at the node's holds."""
    for device in devices:
        device.mig_hold = holds.get(device.uuid)
