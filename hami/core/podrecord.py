"""What one pod holds, as the scheduler keeps it for every running pod.

Pure. At 65,000 nodes the scheduler keeps half a million of these, so a record is laid out
for memory (issue 20 item 2, docs/performance.md "Memory per pod"): the hold is one tuple
of small tuples, and the per-container decision is kept as the annotation text it was
read from, decoded only when asked for (metrics, the bind fence). The mappings callers
read (``usage``, ``types``, ``assignment``) are built on demand from those.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import cast

from hami.core import migfit
from hami.core.usage import Use
from hami.protocol import PodDevices, decode_pod_devices, encode_pod_devices
from hami.protocol._ints import shared_int

# One device a pod holds: (uuid, device type word, slots, memory MiB, cores percent).
Held = tuple[str, str, int, int, int]
HELD_FIELDS = 5

# PodRecord.whole and .mig of the records that hold nothing whole and no MIG placement
# (nearly all): one shared empty mapping instead of one per record.
NOTHING_WHOLE: Mapping[str, frozenset[str]] = MappingProxyType({})
NOTHING_MIG: migfit.PodMig = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Reservation:
    """A filter's hold not yet written on its pod (``Cluster.reserve``)."""

    at: float  # its start on the scheduler's monotonic clock (expire_reservations)
    # the annotations bind writes (protocol.md section 3), None when the decision is
    # already on the pod
    decision: Mapping[str, str | None] | None = None
    # the pod's resourceVersion as filter saw it: bind writes the decision only on that
    # version of the pod (or, after a conflict, on one still unbound)
    pod_version: str | None = None


@dataclass(frozen=True, slots=True)
class PodRecord:
    key: str  # namespace/name
    uid: str
    node: str
    # what it holds: the ``Held`` fields of each device one after another, devices sorted
    # by uuid (``held_of``; one flat tuple, not one per device: ~50 bytes a pod); compared
    # with == to ask "the same devices?", so the order must not depend on how it was built
    held: tuple[str | int, ...]
    bound: bool = False
    # Bookkeeping of an unbound decision's deadline, not part of what the pod holds (so
    # excluded from ==, which callers use to ask "is this still the hold I saw?"); a
    # bound pod keeps neither.
    stamp: str | None = field(default=None, compare=False)  # hami.io/vgpu-time as written
    since: datetime | None = field(default=None, compare=False)  # deadline start, None: next pass
    # made by reserve(), not yet written on the pod; None for every other record
    reservation: Reservation | None = field(default=None, compare=False)
    # The per-container devices (``assignment``) as the annotation text they were read
    # from, in one of three forms (``value_pairs`` reads them all; every value decodes):
    # - (vendor,), one tuple shared by every such record: the value is exactly the one
    #   device held, one share, in one entry ("uuid,vendor,MiB,cores:;": most pods),
    #   rebuilt from ``held`` when read;
    # - the value alone, where it is of the one type of every device held;
    # - device type word, value, ... per type the decision gives.
    values: str | tuple[str, ...] = field(default=(), compare=False)
    # device type -> ids held entirely because the type's value cannot be read and no
    # readable one came before (empty, or not all registered on the node: every device of
    # the type there). Fails closed: an unreadable value never frees room.
    whole: Mapping[str, frozenset[str]] = field(default_factory=lambda: NOTHING_WHOLE)
    # gpu uuid -> the MIG placements held there (hami.io/vgpu-mig-allocations; migfit)
    mig: migfit.PodMig = field(default_factory=lambda: NOTHING_MIG)

    @property
    def reserved(self) -> bool:
        return self.reservation is not None

    @property
    def reserved_at(self) -> float:
        return 0.0 if self.reservation is None else self.reservation.at

    @property
    def decision(self) -> Mapping[str, str | None] | None:
        return None if self.reservation is None else self.reservation.decision

    @property
    def pod_version(self) -> str | None:
        return None if self.reservation is None else self.reservation.pod_version

    def holds(self) -> Iterator[Held]:
        """Each device it holds."""
        held = self.held
        for i in range(0, len(held), HELD_FIELDS):
            yield cast(Held, held[i : i + HELD_FIELDS])

    def value_pairs(self) -> Iterator[tuple[str, str]]:
        """(device type word, device annotation value) per type the decision gives."""
        values = self.values
        if isinstance(values, str):
            yield cast(str, self.held[1]), values
            return
        if len(values) == 1:
            yield cast(str, self.held[1]), _one_share(self.held, values[0])
            return
        for i in range(0, len(values), 2):
            yield values[i], values[i + 1]

    @property
    def usage(self) -> dict[str, Use]:
        """uuid -> what the pod holds there."""
        return {h[0]: Use(h[2], h[3], h[4]) for h in self.holds()}

    @property
    def types(self) -> dict[str, str]:
        """uuid -> device type word: which quota resources the hold counts against."""
        return {h[0]: h[1] for h in self.holds()}

    @property
    def words(self) -> set[str]:
        """The device types the pod holds or was given."""
        return {h[1] for h in self.holds()} | {word for word, _value in self.value_pairs()}

    @property
    def assignment(self) -> dict[str, PodDevices]:
        """Device type -> per annotation entry (container) devices: what the decision
        gives each container (the per-container metrics, the bind fence)."""
        return {word: decode_pod_devices(value) for word, value in self.value_pairs()}


def held_of(usage: Mapping[str, Use], types: Mapping[str, str]) -> tuple[str | int, ...]:
    """The record's hold (``PodRecord.held``) from per-uuid uses and type words."""
    if len(usage) == 1:  # most pods: no sorting, no flattening
        for uuid, use in usage.items():
            return (uuid, types.get(uuid, ""), use.slots, shared_int(use.memory), use.cores)
    devices = sorted(
        (uuid, types.get(uuid, ""), use.slots, shared_int(use.memory), use.cores)
        for uuid, use in usage.items()
    )
    return tuple(part for device in devices for part in device)


def values_of(
    pairs: Iterable[tuple[str, str]], held: tuple[str | int, ...]
) -> str | tuple[str, ...]:
    """``PodRecord.values`` from (device type word, annotation value) pairs, for a record
    holding ``held``."""
    pairs = list(pairs)
    flat = pairs[0] if len(pairs) == 1 else tuple(part for pair in pairs for part in pair)
    if len(flat) == 2 and held and set(held[1::HELD_FIELDS]) == {flat[0]}:
        text = flat[1]
        if len(held) == HELD_FIELDS and held[2] == 1 and text.count(",") == 3:
            vendor = text.split(",")[1]
            if _one_share(held, vendor) == text:
                shared = _VENDOR_ONLY.get(vendor)
                if shared is None and len(_VENDOR_ONLY) < MAX_VENDORS:
                    shared = _VENDOR_ONLY[vendor] = (sys.intern(vendor),)
                if shared is not None:
                    return shared
        return text
    return flat


# vendor -> the (vendor,) every record of one share of one device shares (bounded: the
# vendor word is annotation text, and a writer could vary it)
_VENDOR_ONLY: dict[str, tuple[str]] = {}
MAX_VENDORS = 64


def _one_share(held: tuple[str | int, ...], vendor: str) -> str:
    """The annotation value of one share of the one device ``held`` names."""
    return f"{held[0]},{vendor},{held[3]},{held[4]}:;"


def assignment_values(
    assignment: Mapping[str, PodDevices], held: tuple[str | int, ...]
) -> str | tuple[str, ...]:
    """A decision's per-container devices as the annotation text bind writes."""
    pairs = ((word, encode_pod_devices(per)) for word, per in assignment.items())
    return values_of(pairs, held)
