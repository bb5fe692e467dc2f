"""Kunlunxin XPUs, scheduler side only, as Go HAMi 2.10 models them (issue 24).

Go HAMi has two device types for Kunlunxin, each a backend here under Go's name:

- ``kunlun``: whole cards. Go reads no register value: the vendor's plug-in advertises the
  cards as ``kunlunxin.com/xpu`` capacity, and Go's scheduler rebuilds them from it
  (``devices_from_node``): ids ``<node>-kunlun-<i>``, 100 slots, 98304 MiB, 100 cores, the
  second half of the cards on NUMA node 1. A container asks with ``kunlunxin.com/xpu``
  (cards); each card it gets is whole (all of its memory and cores) and must be unused. A
  decision writes ``hami.io/kunlun-allocated`` and ``BAIDU_COM_DEVICE_IDX`` (the card
  indices of the last container given any), which the plug-in reads.
- ``XPU``: shared cards (vXPU). The plug-in writes ``hami.io/node-register-xpu`` (the JSON
  register form) and ``hami.io/node-handshake-xpu``. A container asks with
  ``kunlunxin.com/vxpu`` (cards) and ``kunlunxin.com/vxpu-memory`` (MiB), which Go's webhook
  rounds up to a quarter, a half or a whole card (24576, 49152 or 98304 MiB) and which gives
  the cores (25, 50 or 100 %); no memory means whole cards. A card already shared takes only
  slices of the size it holds. The devices values are ``hami.io/xpu-devices-to-allocate``
  and ``hami.io/xpu-devices-allocated``.

Both choose the cards of a request as Go does (``hami.core.cardsets``: wings of four cards,
linked pairs and groups of four). Go reads the uuid selectors of both types under both
``hami.io/use-xpu-uuid`` and ``baidu.com/use-gpuuuid`` (and their ``no-use`` forms); each
backend here reads one pair (``selector_keys``). This project has no node agent for
Kunlunxin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami.backends.base import (
    ResourceNames,
)
from hami.backends.capacity import advertised, node_name
from hami.backends.schedulerside import SchedulerSideBackend
from hami.core import cardsets
from hami.core.requests import NO_ANNOTATIONS, DeviceRequest
from hami.core.usage import DeviceState, Use
from hami.protocol import ContainerDevice, NodeDevice

KUNLUN_RESOURCES = ResourceNames(count="kunlunxin.com/xpu")
XPU_RESOURCES = ResourceNames(count="kunlunxin.com/vxpu", memory="kunlunxin.com/vxpu-memory")
CARD_MIB = 98304  # a card's memory as Go counts it
SLICES_MIB = (24576, 49152, CARD_MIB)  # the vXPU sizes Go's webhook rounds up to
WHOLE = 100
SLOTS = 100
DEVICE_INDEX = "BAIDU_COM_DEVICE_IDX"


def card_id(node: str, index: int) -> str:
    """The id Go gives the card at ``index`` of a node it reads from capacity."""
    return f"{node}-kunlun-{index}"


def devices_from_capacity(node: Mapping[str, Any]) -> list[NodeDevice] | None:
    """The whole cards ``kunlunxin.com/xpu`` capacity advertises, None when none."""
    cards = advertised(node, KUNLUN_RESOURCES.count)
    if cards is None:
        return None
    node_id = node_name(node)
    return [
        NodeDevice(
            uuid=card_id(node_id, index),
            count=SLOTS,
            memory=CARD_MIB,
            cores=WHOLE,
            model="kunlun",
            numa=1 if index >= cards // 2 else 0,
            healthy=True,
            index=index,
        )
        for index in range(cards)
    ]


def _positions(devices: Sequence[DeviceState], chosen: Sequence[int]) -> list[int] | None:
    """Card indices -> positions of the first device with each index."""
    first: dict[int, int] = {}
    for position, device in enumerate(devices):
        first.setdefault(device.index, position)
    if not chosen or any(index not in first for index in chosen):
        return None
    return [first[index] for index in chosen]


def pick_cards(
    devices: Sequence[DeviceState],
    fits: Sequence[bool],
    request: DeviceRequest,
    overlay: Mapping[str, Use],
) -> list[int] | None:
    """Whole cards (``kunlun``): Go's card sets among the fitting cards."""
    chosen = cardsets.choose([d.index for d in devices], fits, request.count)
    return _positions(devices, chosen)


def _same_size(device: DeviceState, extra: Use | None, memory: int) -> bool:
    """A shared card takes only slices of the size it already holds (Go: its used memory
    divided by its users)."""
    used = device.used + (extra.slots if extra else 0)
    used_memory = device.used_memory + (extra.memory if extra else 0)
    return used == 0 or used_memory // used == memory


def pick_slices(
    devices: Sequence[DeviceState],
    fits: Sequence[bool],
    request: DeviceRequest,
    overlay: Mapping[str, Use],
) -> list[int] | None:
    """vXPU slices (``XPU``): Go's card sets among the fitting cards that hold slices of the
    request's size or none."""
    sized = [
        ok and _same_size(d, overlay.get(d.uuid), request.memory_on(d.total_memory))
        for d, ok in zip(devices, fits, strict=True)
    ]
    chosen = cardsets.choose([d.index for d in devices], sized, request.count)
    return _positions(devices, chosen)


def slice_mib(memory: int) -> int:
    """vXPU memory rounded up as Go's webhook rounds it (more than a card: a card)."""
    for size in SLICES_MIB:
        if memory <= size:
            return size
    return CARD_MIB


class KunlunBackend(SchedulerSideBackend):
    """Whole Kunlunxin cards (Go's ``kunlun`` type)."""

    vendor = "Kunlunxin"
    node_plugin = "Kunlunxin's device plug-in"
    plugin_does = f"advertises {KUNLUN_RESOURCES.count}"
    type_word = "kunlun"
    vendor_word = "kunlun"
    default_resources = KUNLUN_RESOURCES
    allocated_key = "hami.io/kunlun-allocated"
    to_allocate_key = "hami.io/kunlun-devices-to-allocate"  # Go writes none for the type
    default_cores = WHOLE
    known_options = frozenset()
    node_lock = False  # Go's LockNode does nothing; the vendor's plug-in releases no lock

    fixed_resources = True

    @property
    def selector_keys(self) -> tuple[tuple[str, str], ...]:
        return (("use-uuid", "baidu.com/use-gpuuuid"), ("nouse-uuid", "baidu.com/nouse-gpuuuid"))

    def devices_from_node(self, node: Mapping[str, Any]) -> list[NodeDevice] | None:
        return devices_from_capacity(node)

    def request_rule(
        self, request: DeviceRequest, annotations: Mapping[str, str], where: str
    ) -> DeviceRequest:
        """Whole cards: all of each card's memory and cores, chosen as Go's card sets."""
        return dataclasses.replace(
            request, memory=0, memory_percentage=WHOLE, cores=WHOLE, pick=pick_cards
        )

    def pod_annotations(
        self,
        containers: Sequence[Sequence[ContainerDevice]],
        index_of: Callable[[str], int],
        annotations: Mapping[str, str] = NO_ANNOTATIONS,
    ) -> dict[str, str]:
        """``BAIDU_COM_DEVICE_IDX``: the card indices of the last container given any."""
        out: dict[str, str] = {}
        for devices in containers:
            if devices:
                out[DEVICE_INDEX] = ",".join(str(index_of(d.uuid)) for d in devices)
        return out


class XpuBackend(SchedulerSideBackend):
    """Shared Kunlunxin cards, vXPU (Go's ``XPU`` type)."""

    vendor = "Kunlunxin"
    node_plugin = "Kunlunxin's device plug-in"
    plugin_does = "writes hami.io/node-register-xpu"
    type_word = "XPU"
    vendor_word = "XPU"
    default_resources = XPU_RESOURCES
    allocated_key = "hami.io/xpu-devices-allocated"
    to_allocate_key = "hami.io/xpu-devices-to-allocate"
    default_cores = WHOLE
    known_options = frozenset()

    fixed_resources = True

    @property
    def register_key(self) -> str:
        return "hami.io/node-register-xpu"

    @property
    def handshake_keys(self) -> tuple[str, ...]:
        return ("hami.io/node-handshake-xpu",)

    @property
    def selector_keys(self) -> tuple[tuple[str, str], ...]:
        return (("use-uuid", "hami.io/use-xpu-uuid"), ("nouse-uuid", "hami.io/no-use-xpu-uuid"))

    def request_rule(
        self, request: DeviceRequest, annotations: Mapping[str, str], where: str
    ) -> DeviceRequest:
        """Memory rounded up to a quarter, half or whole card, cores in proportion; no
        memory: whole cards."""
        if request.memory_percentage is not None:
            return dataclasses.replace(request, cores=WHOLE, pick=pick_slices)
        memory = slice_mib(request.memory)
        return dataclasses.replace(
            request, memory=memory, cores=memory * WHOLE // CARD_MIB, pick=pick_slices
        )
