"""Cambricon MLU as Go HAMi 2.10 models it on the scheduler side (issue 24).

Go HAMi 2.10 reads no register value for Cambricon: Cambricon's own device plugin (dynamic
sMLU) advertises each card as 100 units of ``cambricon.com/mlu.smlu.vcore`` and its memory
in 256 MiB units of ``cambricon.com/mlu.smlu.vmemory``, and Go's scheduler rebuilds the
cards from those two capacities. With a decision it writes, besides the devices values,
``CAMBRICON_DSMLU_ASSIGNED: "false"`` and ``CAMBRICON_DSMLU_PROFILE:
{index}_{cores}_{memory units}`` of the first device it gives, which that plug-in reads.

This module holds those rules as pure functions; ``CambriconBackend`` uses them, and its node
agent advertises the same two capacities (``capacity_units``) so that Go's scheduler finds
the cards of a node this project serves.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami.backends.capacity import capacity_of, node_name, whole_quantity
from hami.protocol import ContainerDevice, NodeDevice, ProtocolError
from hami.protocol.resources import ResourceNames

UNITS_PER_CARD = 100  # vcore units a card advertises: 100 % of it
MEMORY_UNIT_MIB = 256  # one vmemory unit
MODEL = "MLU"  # Go's device type for every card it reads from capacity
PROFILE = "CAMBRICON_DSMLU_PROFILE"
ASSIGNED = "CAMBRICON_DSMLU_ASSIGNED"
NODE_LOCK = "cambricon.com/dsmlu.lock"  # Go's scheduler's node lock for these nodes
_INT32_MAX = 2**31 - 1


def card_id(node: str, index: int) -> str:
    """The id Go gives the card at ``index`` of a node it reads from capacity."""
    return f"{node}-cambricon-mlu-{index}"


_PROFILE = re.compile(r"(0|[1-9][0-9]{0,8})_(0|[1-9][0-9]{0,8})_(0|[1-9][0-9]{0,8})", re.ASCII)
_INDEX = re.compile(r"0|[1-9][0-9]{0,8}", re.ASCII)


def our_cards(
    devices: Sequence[ContainerDevice],
    node: str,
    uuids: Sequence[str],
    annotations: Mapping[str, str],
) -> list[ContainerDevice]:
    """A decision's devices with Go's capacity ids (``{node}-cambricon-mlu-{i}``) named by
    the uuid of this node's card ``i`` (``uuids``: the node's cards in index order, as its
    capacity counts them); other names are kept for the caller's check. The dsmlu profile
    Go writes beside them, when present, must be ``{index}_{cores}_{units}`` of a card here.
    Raises ValueError saying what is wrong."""
    profile = annotations.get(PROFILE)
    if profile is not None:
        match = _PROFILE.fullmatch(profile)
        if match is None:
            raise ValueError(
                f"{PROFILE} {profile[:100]!r} is not {{card index}}_{{cores}}_{{memory units}}"
            )
        if int(match[1]) >= len(uuids):
            raise ValueError(
                f"{PROFILE} {profile!r} names card {match[1]}, the node has {len(uuids)}"
            )
    prefix = card_id(node, 0)[:-1]
    out: list[ContainerDevice] = []
    for device in devices:
        if not device.uuid.startswith(prefix):
            out.append(device)
            continue
        tail = device.uuid[len(prefix) :]
        if not _INDEX.fullmatch(tail):
            raise ValueError(f"device {device.uuid!r} does not end in a card index")
        index = int(tail)
        if index >= len(uuids):
            raise ValueError(
                f"device {device.uuid} names card {index}, the node has {len(uuids)} "
                f"(cards 0..{len(uuids) - 1})"
            )
        out.append(dataclasses.replace(device, uuid=uuids[index]))
    return out


def whole_card_mib(memory_mib: int) -> int:
    """The memory a whole card is given by a scheduler that reads its vmemory units: the
    registered memory cut to whole 256 MiB units (Go's 100 % of a card)."""
    return max(memory_mib, 0) // MEMORY_UNIT_MIB * MEMORY_UNIT_MIB


def devices_from_capacity(
    node: Mapping[str, Any], resources: ResourceNames
) -> list[NodeDevice] | None:
    """The cards a node's capacity implies, None when it advertises no vcore units.

    Each card has 100 slots and 100 cores; the memory is spread evenly: total vmemory units
    x 256 MiB x 100 / total vcore units, truncated. A vcore total that is not a multiple of
    100 still makes a card of the rest, as Go counts cards (index x 100 below the total)."""
    capacity = capacity_of(node)
    cores_name, memory_name = resources.cores, resources.memory
    if cores_name is None or memory_name is None or cores_name not in capacity:
        return None
    units = whole_quantity(capacity[cores_name], cores_name)
    if units <= 0:
        return None
    try:
        memory_units = whole_quantity(capacity.get(memory_name, 0), memory_name)
    except ProtocolError:
        memory_units = 0  # Go reads an unreadable memory capacity as none
    memory = memory_units * MEMORY_UNIT_MIB * UNITS_PER_CARD // units
    if not 0 <= memory <= _INT32_MAX:
        raise ProtocolError(
            "node capacity", f"{memory_name} gives each card {memory} MiB", str(memory_units)
        )
    name = node_name(node)
    cards = -(-units // UNITS_PER_CARD)
    return [
        NodeDevice(
            uuid=card_id(name, index),
            count=UNITS_PER_CARD,
            memory=memory,
            cores=UNITS_PER_CARD,
            model=MODEL,
            numa=0,
            healthy=True,
            index=index,
        )
        for index in range(cards)
    ]


def dsmlu_annotations(
    containers: Sequence[Sequence[ContainerDevice]], index_of: Callable[[str], int]
) -> dict[str, str]:
    """What Go's scheduler writes with a Cambricon decision besides the devices values."""
    if not containers:
        return {}
    out = {ASSIGNED: "false"}
    for devices in containers:
        if devices:
            first = devices[0]
            units = first.memory // MEMORY_UNIT_MIB
            out[PROFILE] = f"{index_of(first.uuid)}_{first.cores}_{units}"
            break
    return out


def capacity_units(memory_mib: int, resources: ResourceNames) -> dict[str, int]:
    """The vcore and vmemory units one card of ``memory_mib`` advertises to kubelet."""
    units: dict[str, int] = {}
    if resources.cores:
        units[resources.cores] = UNITS_PER_CARD
    if resources.memory:
        units[resources.memory] = max(memory_mib, 0) // MEMORY_UNIT_MIB
    return units
