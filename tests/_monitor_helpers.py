"""Writes HAMi-core shared-region files as libvgpu.so lays them out, for the monitor tests."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hami.node.monitor.layout import (
    MAGIC,
    MEM_BUFFER,
    MEM_CONTEXT,
    MEM_MODULE,
    MEM_OFFSET,
    MEM_TOTAL,
    UTIL_SM,
    UUID_BYTES,
    V1,
    Layout,
)


@dataclass
class Proc:
    pid: int = 100
    status: int = 1  # 0: a free slot, not counted
    # per device index: (context, module, buffer, offset, total)
    memory: dict[int, tuple[int, int, int, int, int]] = field(default_factory=dict)
    sm_util: dict[int, int] = field(default_factory=dict)


@dataclass
class RegionSpec:
    layout: Layout = V1
    uuids: Sequence[str] = ("GPU-00000000-0000-0000-0000-000000000001",)
    limits: Sequence[int] = (2 * 2**30,)
    procs: Sequence[Proc] = ()
    priority: int = 1
    utilization_switch: int = 0
    recent_kernel: int = 0
    last_kernel_time: int = 0
    version: tuple[int, int] = (1, 2)
    magic: int = MAGIC
    device_num: int | None = None  # default: len(uuids)
    proc_num: int | None = None  # default: len(procs)


def region_bytes(spec: RegionSpec) -> bytearray:
    lay = spec.layout
    buf = bytearray(lay.size)
    struct.pack_into("<i", buf, 0, spec.magic)
    if lay.major_version is not None:
        struct.pack_into("<II", buf, lay.major_version, *spec.version)
    num = len(spec.uuids) if spec.device_num is None else spec.device_num
    struct.pack_into("<Q", buf, lay.device_num, num)
    for i, uuid in enumerate(spec.uuids):
        raw = uuid.encode()[:UUID_BYTES]
        buf[lay.uuids + i * UUID_BYTES : lay.uuids + i * UUID_BYTES + len(raw)] = raw
    for i, limit in enumerate(spec.limits):
        struct.pack_into("<Q", buf, lay.limit + 8 * i, limit)
    for n, proc in enumerate(spec.procs):
        base = lay.procs + n * lay.slot_size
        struct.pack_into("<ii", buf, base, proc.pid, proc.pid)
        struct.pack_into("<i", buf, base + lay.slot_status, proc.status)
        for dev, values in proc.memory.items():
            at = base + lay.slot_used + dev * lay.mem_stride
            for off, value in zip(
                (MEM_CONTEXT, MEM_MODULE, MEM_BUFFER, MEM_OFFSET, MEM_TOTAL), values, strict=True
            ):
                struct.pack_into("<Q", buf, at + off, value)
        for dev, util in proc.sm_util.items():
            struct.pack_into(
                "<Q", buf, base + lay.slot_util + dev * lay.util_stride + UTIL_SM, util
            )
    proc_num = len(spec.procs) if spec.proc_num is None else spec.proc_num
    struct.pack_into(
        "<iiii",
        buf,
        lay.proc_num,
        proc_num,
        spec.utilization_switch,
        spec.recent_kernel,
        spec.priority,
    )
    if lay.last_kernel_time is not None:
        struct.pack_into("<q", buf, lay.last_kernel_time, spec.last_kernel_time)
    return buf


def write_region(
    containers: Path, pod_uid: str, container: str, spec: RegionSpec, name: str = "a1.cache"
) -> Path:
    directory = containers / f"{pod_uid}_{container}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(region_bytes(spec))
    return path


def read_int32(path: Path, offset: int) -> int:
    with path.open("rb") as f:
        f.seek(offset)
        value: int = struct.unpack("<i", f.read(4))[0]
    return value
