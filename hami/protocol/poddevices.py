"""Pod device values ``*-devices-allocated`` / ``*-devices-to-allocate`` (protocol.md section 3).

``entry = *device ";"`` with ``device = uuid "," vendor "," memory "," cores ":"``; one entry
per container (init containers first), empty entries kept so indexes match containers.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from hami.protocol._ints import parse_int32, shared_int
from hami.protocol.errors import ProtocolError

_WHAT = "pod devices value"
MAX_CORES = 100  # percent of one device: a container never holds more than the whole of it


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One device slice given to one container."""

    uuid: str
    vendor: str  # vendor word: NVIDIA, MLU
    memory: int  # MiB
    cores: int  # percent of the device


PodDevices = list[list[ContainerDevice]]


def encode_pod_devices(containers: Sequence[Sequence[ContainerDevice]]) -> str:
    out: list[str] = []
    for devices in containers:
        for device in devices:
            for field, text in (("uuid", device.uuid), ("vendor", device.vendor)):
                if not text or any(ch in text for ch in ",:;"):
                    raise ProtocolError(_WHAT, f"{field} is empty or contains , : or ;", text)
            _check_range(device.memory, device.cores, repr(device))
            out.append(f"{device.uuid},{device.vendor},{device.memory},{device.cores}:")
        out.append(";")
    return "".join(out)


def decode_pod_devices(value: str) -> PodDevices:
    """Decode a value; ``""`` is no containers, ``";"`` is one container with nothing left.

    The piece after the final ``;`` is an entry only when it holds devices, as Go HAMi reads
    it (its empty one is not an entry: protocol.md §8); other text there is rejected."""
    pieces = value.split(";")
    entries = [_decode_entry(entry) for entry in pieces[:-1]]
    tail = pieces[-1]
    if tail.strip():
        last = _decode_entry(tail)
        if not last:
            raise ProtocolError(_WHAT, "text after the last ';' is not a device", value)
        entries.append(last)
    return entries


def _decode_entry(entry: str) -> list[ContainerDevice]:
    devices: list[ContainerDevice] = []
    for piece in entry.split(":"):
        if "," not in piece:
            continue
        fields = piece.split(",")
        if len(fields) < 4:
            raise ProtocolError(_WHAT, f"a device has {len(fields)} fields, expected 4", piece)
        uuid, vendor, memory_text, cores_text = fields[:4]
        memory = shared_int(parse_int32(memory_text, what=_WHAT, field="memory"))
        cores = parse_int32(cores_text, what=_WHAT, field="cores")
        _check_range(memory, cores, piece)
        # Interned: every pod on a device holds its id (the register's, interned too), and
        # the vendor word repeats on every entry: one string each instead of one per pod.
        device = ContainerDevice(
            uuid=sys.intern(uuid), vendor=sys.intern(vendor), memory=memory, cores=cores
        )
        devices.append(device)
    return devices


def _check_range(memory: int, cores: int, text: str) -> None:
    """Go accepts negative numbers here; counted as usage they would *add* room to a device
    (protocol.md §8: this project rejects them), and cores above 100 are no container's."""
    if memory < 0:
        raise ProtocolError(_WHAT, "memory is negative", text)
    if not 0 <= cores <= MAX_CORES:
        raise ProtocolError(_WHAT, f"cores is outside 0..{MAX_CORES}", text)


def first_pending_entry(containers: PodDevices) -> int | None:
    """Index of the first container that still has devices to allocate (section 4)."""
    for index, devices in enumerate(containers):
        if devices:
            return index
    return None


def entry_containers(entries: int, requesting: Sequence[bool]) -> list[int] | None:
    """The container (position, init containers first) each entry of a value belongs to.

    A value with an entry per container maps entry *i* to container *i*. Go HAMi 2.10 writes
    no entry for a container that asks for no device of the type (protocol.md §8), so a
    value with fewer entries than the pod has containers maps its entries, in order, onto
    the containers that ask for the type (``requesting``, one flag per container). None
    when neither fits: the value does not belong to this pod.
    """
    if entries >= len(requesting):
        return list(range(entries))
    asking = [position for position, asks in enumerate(requesting) if asks]
    return asking if entries == len(asking) else None
