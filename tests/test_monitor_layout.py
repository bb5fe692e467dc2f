"""HAMi-core's shared-region layouts (v0, v1) and the decoder, on files written in them."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _monitor_helpers import Proc, RegionSpec, region_bytes, write_region
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.node.monitor.cachefile import find_cache, open_dir, read_region
from hami.node.monitor.layout import MAGIC, V0, V1, Layout
from hami.node.monitor.region import CacheError, Region, decode

GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-66666666-7777-8888-9999-000000000000"
FIXTURES = Path(__file__).parent / "fixtures"


# ----------------------------------------------------------------- layout vs the C struct


def _c_structs(v1: bool) -> tuple[type[ctypes.Structure], type[ctypes.Structure], int, int]:
    """shared_region_t as ctypes lays it out by the C ABI rules, from the field list alone."""
    u64, i32 = ctypes.c_uint64, ctypes.c_int32
    pad: list[tuple[str, Any]] = [("unused", u64 * 3)] if v1 else []

    class Mem(ctypes.Structure):
        _fields_ = [*[(n, u64) for n in ("context", "module", "data", "offset", "total")], *pad]

    class Util(ctypes.Structure):
        _fields_ = [*[(n, u64) for n in ("dec", "enc", "sm")], *pad]

    class Slot(ctypes.Structure):
        _fields_ = [
            ("pid", i32),
            ("hostpid", i32),
            ("used", Mem * 16),
            ("monitorused", u64 * 16),
            ("device_util", Util * 16),
            ("status", i32),
            *pad,
        ]

    head: list[tuple[str, Any]] = [("initialized_flag", i32)]
    head += [("major_version", ctypes.c_uint32), ("minor_version", ctypes.c_uint32)] if v1 else []
    tail: list[tuple[str, Any]] = (
        [("last_kernel_time", ctypes.c_int64), ("unused", u64 * 4)] if v1 else []
    )

    class Region(ctypes.Structure):
        _fields_ = [
            *head,
            ("sm_init_flag", i32),
            ("owner_pid", ctypes.c_size_t),
            ("sem", u64 * 4),  # sem_t: 32 bytes, 8-aligned on x86-64 glibc
            ("num", u64),
            ("uuids", ctypes.c_char * 96 * 16),
            ("limit", u64 * 16),
            ("sm_limit", u64 * 16),
            ("procs", Slot * 1024),
            ("proc_num", ctypes.c_int),
            ("utilization_switch", ctypes.c_int),
            ("recent_kernel", ctypes.c_int),
            ("priority", ctypes.c_int),
            *tail,
        ]

    return Region, Slot, ctypes.sizeof(Mem), ctypes.sizeof(Util)


def _expected(v1: bool) -> dict[str, int | None]:
    region, slot, mem, util = _c_structs(v1)

    def at(name: str) -> int:
        return int(getattr(region, name).offset)

    return {
        "size": ctypes.sizeof(region),
        "major_version": at("major_version") if v1 else None,
        "device_num": at("num"),
        "uuids": at("uuids"),
        "limit": at("limit"),
        "sm_limit": at("sm_limit"),
        "procs": at("procs"),
        "slot_size": ctypes.sizeof(slot),
        "slot_used": int(slot.used.offset),
        "mem_stride": mem,
        "slot_util": int(slot.device_util.offset),
        "util_stride": util,
        "slot_status": int(slot.status.offset),
        "proc_num": at("proc_num"),
        "utilization_switch": at("utilization_switch"),
        "recent_kernel": at("recent_kernel"),
        "priority": at("priority"),
        "last_kernel_time": at("last_kernel_time") if v1 else None,
    }


@pytest.mark.parametrize(("layout", "v1"), [(V0, False), (V1, True)])
def test_pinned_offsets_are_the_c_abi_layout_of_the_fields(layout: Layout, v1: bool) -> None:
    fields = {name: getattr(layout, name) for name in _expected(v1)}
    assert fields == _expected(v1)


def test_pinned_sizes_are_the_ones_gcc_printed_from_hamicore_headers() -> None:
    # printed by tests/fixtures/hamicore_layout.c against HAMi-core 7a9c88b (v0),
    # 9b46404 (v1.1) and 8f3a89c (v1.2, 2026-06)
    assert (V0.size, V0.slot_size, V0.procs, V0.utilization_switch) == (
        1197896,
        1168,
        1848,
        1197884,
    )
    assert (V1.size, V1.slot_size, V1.procs, V1.utilization_switch, V1.last_kernel_time) == (
        2008952,
        1960,
        1856,
        2008900,
        2008912,
    )


@pytest.mark.skipif(
    not os.environ.get("HAMICORE_HEADER") or not shutil.which("gcc"),
    reason="set HAMICORE_HEADER to HAMi-core's src/multiprocess/multiprocess_memory_limit.h",
)
def test_gcc_prints_the_pinned_layout_from_a_hamicore_header(tmp_path: Path) -> None:
    header = Path(os.environ["HAMICORE_HEADER"]).resolve()
    text = header.read_text()
    (tmp_path / "include").mkdir()
    (tmp_path / "cuda.h").write_text("typedef void *CUcontext;\n")
    (tmp_path / "static_config.h").write_text("")
    (tmp_path / "include" / "log_utils.h").write_text("")
    v1 = "major_version" in text
    flags = ["-DV1"] if v1 else []
    if "device_num;" in text:
        flags.append("-DNUM_FIELD=device_num")
    exe = tmp_path / "layout"
    subprocess.run(
        [
            "gcc",
            "-I",
            str(tmp_path),
            f'-DHDR="{header}"',
            *flags,
            str(FIXTURES / "hamicore_layout.c"),
            "-o",
            str(exe),
        ],
        check=True,
    )
    printed = dict(
        line.split() for line in subprocess.check_output([str(exe)], text=True).splitlines()
    )
    layout = V1 if v1 else V0
    for name, value in printed.items():
        assert getattr(layout, name) == int(value), name


# ----------------------------------------------------------------- decoding


def _decode(buf: bytes | bytearray) -> Region:
    return decode(lambda off, n: bytes(buf[off : off + n]), len(buf))


@pytest.mark.parametrize("layout", [V0, V1])
def test_decode_sums_live_processes_per_device(layout: Layout) -> None:
    spec = RegionSpec(
        layout=layout,
        uuids=(GPU0, GPU1),
        limits=(4 * 2**30, 8 * 2**30),
        procs=(
            Proc(pid=1, memory={0: (10, 20, 30, 5, 65), 1: (1, 2, 3, 4, 10)}, sm_util={0: 40}),
            Proc(pid=2, memory={0: (100, 0, 200, 0, 300)}, sm_util={0: 15, 1: 7}),
            Proc(pid=3, status=0, memory={0: (9999, 9999, 9999, 9999, 9999)}, sm_util={0: 99}),
        ),
        priority=0,
        utilization_switch=1,
        recent_kernel=2,
        last_kernel_time=1_700_000_000,
    )
    region = _decode(region_bytes(spec))
    assert region.layout == layout.name
    d0, d1 = region.devices
    assert (d0.index, d0.uuid, d0.limit) == (0, GPU0, 4 * 2**30)
    assert (d0.context, d0.module, d0.buffer, d0.offset, d0.total, d0.sm_util) == (
        110,
        20,
        230,
        5,
        365,
        55,
    )
    assert (d1.index, d1.uuid, d1.limit, d1.total, d1.sm_util) == (1, GPU1, 8 * 2**30, 10, 7)
    assert (region.priority, region.utilization_switch, region.recent_kernel) == (0, 1, 2)
    expected_time = 1_700_000_000 if layout is V1 else 0  # v0 has no last_kernel_time
    assert region.last_kernel_time == expected_time


def test_v0_is_told_by_size_and_v1_needs_major_version_one() -> None:
    v1 = region_bytes(RegionSpec(version=(2, 0)))
    with pytest.raises(CacheError, match=r"unknown layout: 2008952 bytes, version 2\.0"):
        _decode(v1)
    between = region_bytes(RegionSpec(layout=V0)) + b"\0" * 100
    assert _decode(between).layout == "v0"


@pytest.mark.parametrize(
    ("buf", "message"),
    [
        (b"", "too small"),
        (struct.pack("<iii", MAGIC, 1, 1) + b"\0" * 100, "unknown layout: 112 bytes"),
        (region_bytes(RegionSpec(magic=1234)), "initialized_flag is 1234"),
    ],
)
def test_foreign_files_are_cache_errors(buf: bytes, message: str) -> None:
    with pytest.raises(CacheError, match=message):
        _decode(buf)


def test_a_file_shrinking_while_read_is_a_cache_error() -> None:
    buf = region_bytes(RegionSpec(procs=(Proc(),)))
    with pytest.raises(CacheError, match="truncated"):
        decode(lambda off, n: bytes(buf[off : min(off + n, 5000)]), len(buf))


def test_garbage_counts_are_clamped_and_bad_uuids_left_out() -> None:
    spec = RegionSpec(
        uuids=(GPU0, "GPU-\x01bad", "", GPU1),
        device_num=2**63,
        proc_num=-5,
        procs=(Proc(memory={0: (1, 1, 1, 1, 4)}),),
    )
    region = _decode(region_bytes(spec))
    assert [d.uuid for d in region.devices] == [GPU0, GPU1]
    assert region.devices[0].total == 0  # proc_num < 0: none
    spec.proc_num = 10**6
    assert _decode(region_bytes(spec)).devices[0].total == 4


_V1_TEMPLATE = bytes(region_bytes(RegionSpec(uuids=(GPU0, GPU1), procs=(Proc(), Proc(pid=7)))))
_HOT = [0, 4, 8, V1.device_num, V1.uuids, V1.uuids + 96, V1.procs, V1.procs + V1.slot_status]
_HOT += [V1.proc_num, V1.priority, V1.last_kernel_time or 0]


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    edits=st.lists(
        st.tuples(
            st.one_of(st.sampled_from(_HOT), st.integers(0, V1.size - 1)),
            st.binary(min_size=1, max_size=16),
        ),
        max_size=8,
    ),
    cut=st.one_of(st.none(), st.integers(0, V1.size)),
)
def test_fuzzed_regions_decode_or_raise_cache_error(
    edits: list[tuple[int, bytes]], cut: int | None
) -> None:
    buf = bytearray(_V1_TEMPLATE)
    for offset, data in edits:
        buf[offset : offset + len(data)] = data
    del buf[V1.size :]
    if cut is not None:
        del buf[cut:]
    try:
        region = _decode(buf)
    except CacheError:
        return
    for device in region.devices:
        assert 0 <= device.index < 16
        assert device.uuid.isascii() and device.uuid.isprintable()
        assert min(device.total, device.limit, device.sm_util) >= 0


# ----------------------------------------------------------------- files on disk


def test_read_region_from_a_container_directory(tmp_path: Path) -> None:
    write_region(tmp_path, "uid", "main", RegionSpec(procs=(Proc(memory={0: (0, 0, 0, 0, 9)}),)))
    (tmp_path / "uid_main" / "libvgpu.so").write_bytes(b"")  # the library's mount target
    fd = open_dir(str(tmp_path / "uid_main"))
    try:
        name = find_cache(fd)
        assert name == "a1.cache"
        assert read_region(fd, name).region.devices[0].total == 9
    finally:
        os.close(fd)


def test_symlinked_files_and_directories_are_not_followed(tmp_path: Path) -> None:
    real = write_region(tmp_path / "elsewhere", "uid", "c", RegionSpec())
    ctr = tmp_path / "containers" / "uid_c"
    ctr.mkdir(parents=True)
    (ctr / "a1.cache").symlink_to(real)
    fd = open_dir(str(ctr))
    try:
        assert find_cache(fd) is None  # a symlink is not a candidate
        with pytest.raises(CacheError, match="cannot open"):
            read_region(fd, "a1.cache")
    finally:
        os.close(fd)
    (tmp_path / "containers" / "uid_d").symlink_to(real.parent, target_is_directory=True)
    with pytest.raises(OSError):
        open_dir(str(tmp_path / "containers" / "uid_d"))


def test_a_fifo_named_like_a_cache_is_refused_without_blocking(tmp_path: Path) -> None:
    ctr = tmp_path / "uid_c"
    ctr.mkdir()
    os.mkfifo(ctr / "x.cache")
    fd = open_dir(str(ctr))
    try:
        with pytest.raises(CacheError, match="not a regular file"):
            read_region(fd, "x.cache")
    finally:
        os.close(fd)


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(0, V0.size + 10))
def test_truncated_files_on_disk_are_cache_errors(cut: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        path = write_region(Path(d), "uid", "c", RegionSpec(layout=V0))
        os.truncate(path, cut)
        fd = open_dir(str(path.parent))
        try:
            try:
                region = read_region(fd, path.name).region
            except CacheError:
                assert cut < V0.size
            else:
                assert cut >= V0.size and region.layout == "v0"
        finally:
            os.close(fd)
