"""Byte layouts of HAMi-core's shared region (``shared_region_t``), the file each container's
``libvgpu.so`` keeps at ``$CUDA_DEVICE_MEMORY_SHARED_CACHE``.

Two layouts exist, the two Go HAMi's monitor reads (``pkg/monitor/nvidia/v0`` and ``v1``):

- v0: HAMi-core before version fields (2024-04 to 2024-08); no ``major_version``, no
  ``last_kernel_time``; told apart by file size alone.
- v1: ``major_version`` 1 (minor 1 and 2 share one layout: 1.2 renamed padding only).

Every offset below was printed by ``gcc`` from HAMi-core's own header on x86-64 Linux
(``tests/fixtures/hamicore_layout.c`` prints them; ``tests/test_monitor_layout.py`` pins
them and rebuilds them from the field sizes). Little-endian, natural alignment.
"""

from __future__ import annotations

from dataclasses import dataclass

MAGIC = 19920718  # initialized_flag once libvgpu.so has set the region up
MAX_DEVICES = 16  # CUDA_DEVICE_MAX_COUNT
MAX_PROCS = 1024  # SHARED_REGION_MAX_PROCESS_NUM
UUID_BYTES = 96

# device_memory_t fields, by offset inside one entry
MEM_CONTEXT, MEM_MODULE, MEM_BUFFER, MEM_OFFSET, MEM_TOTAL = 0, 8, 16, 24, 32
# device_util_t: sm_util's offset (dec_util 0 and enc_util 8 are not exported)
UTIL_SM = 16


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    size: int  # sizeof(shared_region_t)
    major_version: int | None  # offset of major_version (v1); v0 has none
    device_num: int
    uuids: int
    limit: int
    sm_limit: int
    procs: int
    slot_size: int  # sizeof(shrreg_proc_slot_t)
    slot_used: int  # device_memory_t used[16]
    mem_stride: int  # sizeof(device_memory_t)
    slot_util: int  # device_util_t device_util[16]
    util_stride: int  # sizeof(device_util_t)
    slot_status: int
    proc_num: int
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int | None  # v1 only

    @property
    def header_end(self) -> int:
        """Bytes before the process slots: everything a reader needs but the slots."""
        return self.procs


V0 = Layout(
    name="v0",
    size=1197896,
    major_version=None,
    device_num=48,
    uuids=56,
    limit=1592,
    sm_limit=1720,
    procs=1848,
    slot_size=1168,
    slot_used=8,
    mem_stride=40,
    slot_util=776,
    util_stride=24,
    slot_status=1160,
    proc_num=1197880,
    utilization_switch=1197884,
    recent_kernel=1197888,
    priority=1197892,
    last_kernel_time=None,
)

V1 = Layout(
    name="v1",
    size=2008952,
    major_version=4,
    device_num=56,
    uuids=64,
    limit=1600,
    sm_limit=1728,
    procs=1856,
    slot_size=1960,
    slot_used=8,
    mem_stride=64,
    slot_util=1160,
    util_stride=48,
    slot_status=1928,
    proc_num=2008896,
    utilization_switch=2008900,
    recent_kernel=2008904,
    priority=2008908,
    last_kernel_time=2008912,
)

HEADER_BYTES = 12  # initialized_flag, then v1's major and minor version
