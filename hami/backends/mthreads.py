"""Moore Threads GPUs, scheduler side only, as Go HAMi 2.10 models them (issue 24).

Go HAMi reads no register value for Moore Threads: the vendor's device plug-in advertises each
card as 16 units of ``mthreads.com/sgpu-core`` and the node's memory in 512 MiB units of
``mthreads.com/sgpu-memory``, and Go's scheduler rebuilds the cards from those capacities
(``devices_from_node``): 100 slots and 16 cores each, the memory spread evenly, the model
``Mthreads``. A container asks with ``mthreads.com/vgpu`` (devices), ``sgpu-memory`` (512 MiB
units) and ``sgpu-core`` (sixteenths of a card), both for all of its devices together. Go's
webhook refuses a count below 1 and, for one device, a memory other than 2, 4, 8, 16, 32, 64
or 96 units; it gives a container without memory, or with several devices, 16 cores and 96
units per device. With a decision Go writes ``hami.io/mthreads-vgpu-devices-allocated`` and
``mthreads.com/gpu-index`` (the device indices of the last container given any), which the
plug-in reads. This project has no node agent for Moore Threads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami.backends.base import (
    ResourceNames,
)
from hami.backends.capacity import advertised, capacity_of, node_name, whole_quantity
from hami.backends.schedulerside import SchedulerSideBackend
from hami.core.requests import NO_ANNOTATIONS, DeviceRequest, RequestError
from hami.protocol import ContainerDevice, NodeDevice, ProtocolError

MTHREADS_RESOURCES = ResourceNames(
    count="mthreads.com/vgpu",
    memory="mthreads.com/sgpu-memory",
    cores="mthreads.com/sgpu-core",
    memory_unit_mib=512,
)
CORES_PER_CARD = 16  # sgpu-core units a card advertises
WHOLE_CARD_UNITS = 96  # sgpu-memory units Go's webhook gives a whole card
LEGAL_MEMORY_UNITS = (2, 4, 8, 16, 32, 64, 96)  # one device's sgpu-memory, as Go's webhook
SLOTS = 100  # tasks per card, as Go counts them
MODEL = "Mthreads"
GPU_INDEX = "mthreads.com/gpu-index"
_INT32_MAX = 2**31 - 1


def card_id(node: str, index: int) -> str:
    """The id Go gives the card at ``index`` of a node it reads from capacity."""
    return f"{node}-mthreads-{index}"


def devices_from_capacity(node: Mapping[str, Any]) -> list[NodeDevice] | None:
    """The cards a node's capacity implies (a card per 16 sgpu-core units, the rest making
    one more), None when it advertises none."""
    cores_name, memory_name = MTHREADS_RESOURCES.cores, MTHREADS_RESOURCES.memory
    assert cores_name is not None and memory_name is not None
    units = advertised(node, cores_name)
    if units is None:
        return None
    try:
        memory_units = whole_quantity(capacity_of(node).get(memory_name, 0), memory_name)
    except ProtocolError:
        memory_units = 0  # Go reads an unreadable memory capacity as none
    memory = memory_units * MTHREADS_RESOURCES.memory_unit_mib * CORES_PER_CARD // units
    if not 0 <= memory <= _INT32_MAX:
        raise ProtocolError(
            "node capacity", f"{memory_name} gives each card {memory} MiB", str(memory_units)
        )
    name = node_name(node)
    return [
        NodeDevice(
            uuid=card_id(name, index),
            count=SLOTS,
            memory=memory,
            cores=CORES_PER_CARD,
            model=MODEL,
            numa=0,
            healthy=True,
            index=index,
        )
        for index in range(-(-units // CORES_PER_CARD))
    ]


def request_rule(request: DeviceRequest, where: str) -> DeviceRequest:
    """The request Go's webhook and scheduler derive; memory and cores arrive as the
    container's totals (``cores_per_container``) and leave per device."""
    names = MTHREADS_RESOURCES
    count = request.count
    if count < 1:
        raise RequestError(f"{where}: {names.count} must be >= 1, got {count}")
    whole = dataclasses.replace(
        request,
        memory=WHOLE_CARD_UNITS * names.memory_unit_mib,
        memory_percentage=None,
        cores=CORES_PER_CARD,
    )
    if count > 1 or request.memory_percentage is not None:
        return whole  # Go's webhook writes 16 cores and 96 units per device
    units = request.memory // names.memory_unit_mib
    if units not in LEGAL_MEMORY_UNITS:
        raise RequestError(
            f"{where}: {names.memory} must be one of "
            f"{', '.join(map(str, LEGAL_MEMORY_UNITS))}, got {units}"
        )
    if request.cores > CORES_PER_CARD:
        raise RequestError(
            f"{where}: {names.cores} must be between 0 and {CORES_PER_CARD} for one device, "
            f"got {request.cores}"
        )
    return request


def gpu_index(
    containers: Sequence[Sequence[ContainerDevice]], index_of: Callable[[str], int]
) -> dict[str, str]:
    """``mthreads.com/gpu-index``: the indices of the last container given devices."""
    out: dict[str, str] = {}
    for devices in containers:
        if devices:
            out[GPU_INDEX] = ",".join(str(index_of(d.uuid)) for d in devices)
    return out


class MthreadsBackend(SchedulerSideBackend):
    vendor = "Moore Threads"
    node_plugin = "Moore Threads' device plug-in"
    plugin_does = "advertises mthreads.com/sgpu-core"
    type_word = "mthreads"
    vendor_word = MODEL
    default_resources = MTHREADS_RESOURCES
    allocated_key = "hami.io/mthreads-vgpu-devices-allocated"
    to_allocate_key = "hami.io/mthreads-vgpu-devices-to-allocate"
    default_cores = 0
    known_options = frozenset()
    cores_per_container = True
    memory_per_container = True
    node_lock = False  # Go's LockNode does nothing; the vendor's plug-in releases no lock

    fixed_resources = True

    @property
    def selector_keys(self) -> tuple[tuple[str, str], ...]:
        """Go reads the uuid selectors under the ``mthreads.ai`` domain."""
        return (
            ("use-uuid", "mthreads.ai/use-gpuuuid"),
            ("nouse-uuid", "mthreads.ai/nouse-gpuuuid"),
        )

    def devices_from_node(self, node: Mapping[str, Any]) -> list[NodeDevice] | None:
        return devices_from_capacity(node)

    def request_rule(
        self, request: DeviceRequest, annotations: Mapping[str, str], where: str
    ) -> DeviceRequest:
        return request_rule(request, where)

    def pod_annotations(
        self,
        containers: Sequence[Sequence[ContainerDevice]],
        index_of: Callable[[str], int],
        annotations: Mapping[str, str] = NO_ANNOTATIONS,
    ) -> dict[str, str]:
        return gpu_index(containers, index_of)
