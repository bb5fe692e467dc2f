"""Usage monitor pieces without a cluster: the host reader's NVML failures, the scanner's
removal rule, and the exporter fed any values a region can decode to."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
from _monitor_helpers import RegionSpec, region_bytes, write_region
from _nvml_helpers import FakeGpu, FakeNvml, Handle, nvml_error
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from hami.backends.base import BackendSettings
from hami.backends.nvidia import NvidiaBackend
from hami.node.metrics import NodeMetrics
from hami.node.monitor.host import NvmlHost
from hami.node.monitor.pods import PodRef, PodView
from hami.node.monitor.region import DeviceUsage, Region
from hami.node.monitor.scan import Scanner
from hami.node.monitor.service import ContainerUsage, Snapshot

GIB = 2**30


class PartialNvml(FakeNvml):
    """GPU 0 reads; GPU 1 has no utilization counters; GPU 2 is lost."""

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        if handle.index == 1:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=7, memory=3)


def test_host_reader_leaves_out_what_nvml_cannot_read() -> None:
    gpus = [
        FakeGpu(0, "GPU-0", "A100", 80 * GIB, "0000:01:00.0"),
        FakeGpu(1, "GPU-1", "A100", 80 * GIB, "0000:02:00.0"),
        FakeGpu(2, "GPU-2", "A100", 80 * GIB, "0000:03:00.0", lost="after_uuid"),
    ]
    host = NvmlHost(NvidiaBackend(BackendSettings(), nvml=PartialNvml(gpus)))
    found = host.read()
    assert [(g.index, g.uuid, g.device_type) for g in found] == [
        (0, "GPU-0", "NVIDIA-A100"),
        (1, "GPU-1", "NVIDIA-A100"),
    ]
    assert (found[0].memory_used, found[0].utilization, found[0].memory_utilization) == (GIB, 7, 3)
    assert (found[1].memory_used, found[1].utilization) == (GIB, None)


def test_host_reader_without_nvml_reads_nothing() -> None:
    broken = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert NvmlHost(NvidiaBackend(BackendSettings(), nvml=broken)).read() == []


def test_scanner_keeps_a_gone_pods_directory_written_to_within_the_grace(tmp_path: Path) -> None:
    gone = str(uuid.uuid4())
    directory = write_region(tmp_path, gone, "c", RegionSpec()).parent
    clock = [0.0]
    scanner = Scanner([str(tmp_path)], grace=10, clock=lambda: clock[0])
    current = PodView({}, current=True)
    scanner.scan(current)
    clock[0] = 100  # gone long enough by the pod view ...
    scanner.scan(current)
    assert directory.exists()  # ... but its directory was just written (mtime now)
    then = time.time() - 60
    os.utime(directory, (then, then))
    # the pod came back (a stale list): the count starts again
    scanner.scan(PodView({gone: PodRef("ns", "p")}, current=True))
    clock[0] = 105
    scanner.scan(current)
    assert directory.exists()
    clock[0] = 120
    assert scanner.scan(current).removed == 1
    assert not directory.exists()


def test_scanner_never_removes_without_a_current_view(tmp_path: Path) -> None:
    gone = str(uuid.uuid4())
    directory = write_region(tmp_path, gone, "c", RegionSpec()).parent
    then = time.time() - 3600
    os.utime(directory, (then, then))
    clock = [0.0]
    scanner = Scanner([str(tmp_path)], grace=1, clock=lambda: clock[0])
    for step in range(5):
        clock[0] = step * 10
        result = scanner.scan(PodView({}, current=False))
        assert result.removed == 0 and len(result.found) == 1
    assert directory.exists()


def test_scanner_reports_a_missing_containers_dir_as_empty(tmp_path: Path) -> None:
    result = Scanner([str(tmp_path / "absent")], grace=1).scan(PodView({}, current=True))
    assert result.found == [] and result.removed == 0


u64 = st.integers(0, 2**64 - 1)
devices = st.builds(
    DeviceUsage,
    st.integers(0, 15),
    st.text('GPU-abc0123456789"\\\n{}', min_size=1, max_size=40),
    u64,
    u64,
    u64,
    u64,
    u64,
    st.integers(0, 5 * (2**64 - 1)),
    st.integers(0, 1024 * (2**64 - 1)),
)
regions = st.builds(
    Region,
    st.sampled_from(["v0", "v1"]),
    st.lists(devices, max_size=3).map(tuple),
    st.just(()),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1),
)


@settings(max_examples=60, deadline=None)
@given(regions=st.lists(regions, max_size=3), name=st.text(max_size=10))
def test_any_decoded_values_render_as_valid_exposition(regions: list[Region], name: str) -> None:
    snap = Snapshot(
        containers=tuple(
            ContainerUsage(PodRef("ns", f"p{i}{name}"), "uid", "c", r)
            for i, r in enumerate(regions)
        )
    )
    metrics = NodeMetrics()
    metrics.add_usage("node", lambda: snap)
    families: dict[str, Any] = {
        f.name: f for f in text_string_to_metric_families(metrics.render().decode())
    }
    expected = sum(len(r.devices) for r in regions)
    assert len(families["hami_vgpu_memory_used_bytes"].samples) == expected
    for sample in families["hami_container_last_kernel_elapsed_seconds"].samples:
        assert sample.value >= 0


entry_kinds = st.sampled_from(["dir", "symlink-dir", "file", "fifo", "region", "garbage"])
entry_names = st.one_of(
    st.builds(lambda c: f"{uuid.uuid4()}_{c}", st.sampled_from(["a", "b_c", "x"])),
    st.sampled_from(["_", "a_", "_b", "noscore", "x_y", "..._z"]),
)


@settings(max_examples=40, deadline=None)
@given(
    entries=st.lists(st.tuples(entry_names, entry_kinds, st.binary(max_size=64)), max_size=8),
    current=st.booleans(),
)
def test_any_containers_dir_scans_without_raising(
    entries: list[tuple[str, str, bytes]], current: bool
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        root, outside = Path(d) / "containers", Path(d) / "outside"
        root.mkdir()
        outside.mkdir()
        (outside / "keep.cache").write_bytes(b"x")
        for name, kind, data in entries:
            path = root / name
            if path.exists() or path.is_symlink():
                continue
            if kind == "symlink-dir":
                path.symlink_to(outside, target_is_directory=True)
            elif kind == "file":
                path.write_bytes(data)
            elif kind == "fifo":
                os.mkfifo(path)
            else:
                path.mkdir()
                if kind == "region":
                    (path / "a1.cache").write_bytes(region_bytes(RegionSpec()))
                elif kind == "garbage":
                    (path / "g.cache").write_bytes(data)
                    (path / "s.cache").symlink_to(outside / "keep.cache")
        then = time.time() - 3600
        for path in root.iterdir():
            os.utime(path, (then, then), follow_symlinks=False)
        clock = [0.0]
        scanner = Scanner([str(root)], grace=1, clock=lambda: clock[0])
        for step in (0, 5):
            clock[0] = step
            result = scanner.scan(PodView({}, current=current))
            assert all(f.cache.region.layout == "v1" for f in result.found)
        assert (outside / "keep.cache").read_bytes() == b"x"
