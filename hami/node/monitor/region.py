"""Decode one HAMi-core shared region into plain values, trusting nothing in it.

The file lives in a directory the container can write: any byte may be garbage. Sizes and
counts are clamped (``device_num`` to 16, ``proc_num`` to 0..1024), a device whose UUID is
not printable ASCII is left out, and every problem with the file as a whole is a
``CacheError`` naming it. Sums are Python ints (no uint64 wrap-around).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from hami.node.monitor.layout import (
    HEADER_BYTES,
    MAGIC,
    MAX_DEVICES,
    MAX_PROCS,
    MEM_BUFFER,
    MEM_CONTEXT,
    MEM_MODULE,
    MEM_OFFSET,
    MEM_TOTAL,
    UTIL_SM,
    UUID_BYTES,
    V0,
    V1,
    Layout,
)

# read(offset, length) -> bytes; may return fewer bytes when the file shrank meanwhile
Reader = Callable[[int, int], bytes]


class CacheError(Exception):
    """The file is not a HAMi-core region this monitor can read; the message says why."""


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    index: int  # the container's device number (vdevice_index)
    uuid: str
    limit: int  # bytes
    context: int
    module: int
    buffer: int
    offset: int
    total: int  # bytes in use: HAMi-core's own total of the above
    sm_util: int  # percent, summed over the container's processes


@dataclass(frozen=True, slots=True)
class Region:
    layout: str  # "v0" or "v1"
    devices: tuple[DeviceUsage, ...]
    uuids: tuple[str, ...]  # every device slot with a valid UUID (the feedback's view)
    proc_num: int
    priority: int
    utilization_switch: int
    recent_kernel: int
    last_kernel_time: int  # unix seconds; 0: never (or v0)


def layout_for(size: int, header: bytes) -> Layout:
    """The layout of a file of ``size`` bytes starting with ``header``, by Go HAMi's rule:
    a v0-sized file is v0 (it has no version field); v1 needs major_version 1."""
    if size < HEADER_BYTES or len(header) < HEADER_BYTES:
        raise CacheError(f"{size} bytes: too small for a HAMi-core region")
    flag, major, minor = struct.unpack_from("<iii", header)
    if flag != MAGIC:
        raise CacheError(f"initialized_flag is {flag}, not HAMi-core's {MAGIC}")
    if V0.size <= size < V1.size:
        return V0
    if major == 1 and size >= V1.size:
        return V1
    raise CacheError(
        f"unknown layout: {size} bytes, version {major}.{minor} "
        f"(known: v0 of {V0.size} bytes, v1.x of {V1.size})"
    )


def decode(read: Reader, size: int) -> Region:
    """Read the region through ``read``; ``size`` is the file's size when opened."""
    layout = layout_for(size, read(0, HEADER_BYTES))
    head = _exact(read, 0, layout.header_end)
    tail_end = layout.priority + 4 if layout.last_kernel_time is None else layout.priority + 12
    tail = _exact(read, layout.proc_num, tail_end - layout.proc_num)
    proc_num, switch, recent, priority = struct.unpack_from("<iiii", tail)
    last_kernel = 0
    if layout.last_kernel_time is not None:
        (last_kernel,) = struct.unpack_from("<q", tail, layout.last_kernel_time - layout.proc_num)
    procs = min(max(proc_num, 0), MAX_PROCS)
    slots = _exact(read, layout.procs, procs * layout.slot_size)
    (num,) = struct.unpack_from("<Q", head, layout.device_num)
    count = min(num, MAX_DEVICES)
    limits = struct.unpack_from(f"<{MAX_DEVICES}Q", head, layout.limit)

    sums = [[0] * 6 for _ in range(MAX_DEVICES)]  # context, module, buffer, offset, total, sm
    live = [
        base
        for base in range(0, len(slots), layout.slot_size)
        if struct.unpack_from("<i", slots, base + layout.slot_status)[0] != 0
    ]
    mem_words, util_words = layout.mem_stride // 8, layout.util_stride // 8
    mem_fmt, util_fmt = f"<{count * mem_words}Q", f"<{count * util_words}Q"
    for base in live:
        mem = struct.unpack_from(mem_fmt, slots, base + layout.slot_used)
        util = struct.unpack_from(util_fmt, slots, base + layout.slot_util)
        for dev in range(count):
            row, m = sums[dev], dev * mem_words
            for i, field in enumerate((MEM_CONTEXT, MEM_MODULE, MEM_BUFFER, MEM_OFFSET, MEM_TOTAL)):
                row[i] += mem[m + field // 8]
            row[5] += util[dev * util_words + UTIL_SM // 8]

    uuids: list[str | None] = [
        _uuid(head[layout.uuids + i * UUID_BYTES : layout.uuids + (i + 1) * UUID_BYTES])
        for i in range(MAX_DEVICES)
    ]
    devices = tuple(
        DeviceUsage(dev, uuid, limits[dev], *sums[dev])
        for dev in range(count)
        if (uuid := uuids[dev]) is not None
    )
    return Region(
        layout=layout.name,
        devices=devices,
        uuids=tuple(u for u in uuids if u is not None),
        proc_num=proc_num,
        priority=priority,
        utilization_switch=switch,
        recent_kernel=recent,
        last_kernel_time=last_kernel,
    )


def _exact(read: Reader, offset: int, length: int) -> bytes:
    data = read(offset, length)
    if len(data) < length:
        raise CacheError(f"truncated: {offset + len(data)} bytes where {offset + length} expected")
    return data


def _uuid(raw: bytes) -> str | None:
    """The NUL-terminated UUID, or None for an empty slot or one that is not printable
    ASCII (a label value must be text)."""
    text = raw.split(b"\0", 1)[0]
    if not text or not all(0x21 <= b < 0x7F for b in text):
        return None
    return text.decode("ascii")
