"""The NVIDIA backend's link scores (issue 10 item 7): ``hami.io/node-nvidia-score`` from
NVML's topology (common PCIe ancestor, NVLinks direct or through NVSwitch), scored and
encoded as Go HAMi's plugin does, written with the register value."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pynvml
from _nvml_helpers import FakeGpu, FakeNvml, load_node
from structlog.testing import capture_logs

from hami.backends import BackendSettings
from hami.backends.nvidia import NvidiaBackend
from hami.core.topology import parse_pair_scores
from hami.node.registration import registration_annotations
from hami.node.state import DeviceState

SCORE = "hami.io/node-nvidia-score"
GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH


def backend_for(nvml: FakeNvml, sysfs: Path, **options: Any) -> NvidiaBackend:
    settings = BackendSettings(options={"sysfs_root": str(sysfs), **options})
    return NvidiaBackend(settings, nvml=nvml)


def gpu(index: int, bus: str, links: list[tuple[str, int] | None], numa: int = 0) -> FakeGpu:
    return FakeGpu(index, f"GPU-{index}", "Tesla V100-SXM2-32GB", 32 << 30, bus, numa, None, links)


BUS = ["00000000:1A:00.0", "00000000:1B:00.0", "00000000:3D:00.0", "00000000:3E:00.0"]


def bridged_box() -> FakeNvml:
    """Four GPUs: NVLink bridges 0-1 (2 links) and 2-3 (3 links, one disabled in between);
    0-1 and 2-3 each behind one PCIe switch, the pairs on two NUMA nodes."""
    gpus = [
        gpu(0, BUS[0], [(BUS[1], GPU), (BUS[1], GPU)]),
        gpu(1, BUS[1], [(BUS[0], GPU), (BUS[0], GPU)]),
        gpu(2, BUS[2], [(BUS[3], GPU), None, (BUS[3], GPU), (BUS[3], GPU)], numa=1),
        gpu(3, BUS[3], [(BUS[2], GPU), (BUS[2], GPU), (BUS[2], GPU)], numa=1),
    ]
    nvml = FakeNvml(gpus)
    nvml.ancestors = {
        frozenset((0, 1)): pynvml.NVML_TOPOLOGY_SINGLE,
        frozenset((2, 3)): pynvml.NVML_TOPOLOGY_SINGLE,
    }
    return nvml


async def test_link_scores_are_go_hamis(tmp_path: Path) -> None:
    nvml = bridged_box()
    backend = backend_for(nvml, tmp_path)
    devices = await backend.enumerate()
    value = backend.node_annotations(devices)[SCORE]
    scores = parse_pair_scores(value)
    assert scores["GPU-0"] == {"GPU-1": 50 + 200, "GPU-2": 10, "GPU-3": 10}
    assert scores["GPU-2"] == {"GPU-0": 10, "GPU-1": 10, "GPU-3": 50 + 300}
    # Go's json.Marshal of ListDeviceScore: uuid then score, peers sorted, no spaces
    first = json.loads(value)[0]
    assert list(first) == ["uuid", "score"] and " " not in value
    assert value.startswith('[{"uuid":"GPU-0","score":{"GPU-1":250,"GPU-2":10,"GPU-3":10}}')


async def test_nvswitch_links_count_for_every_pair(tmp_path: Path) -> None:
    # DGX A100: every GPU has 12 NVLinks to the six NVSwitches (two to each)
    gpus = load_node("nvml_dgx_a100_80gb.json", tmp_path)
    switches = [f"00000000:{0xC4 + s:02X}:00.0" for s in range(6)]
    for g in gpus:
        g.nvlinks = [(switches[link // 2], SWITCH) for link in range(12)]
    backend = backend_for(FakeNvml(gpus), tmp_path)
    devices = await backend.enumerate()
    scores = parse_pair_scores(backend.node_annotations(devices)[SCORE])
    uuid = [g.uuid for g in gpus]
    assert scores[uuid[0]][uuid[1]] == 20 + 1200  # one NUMA node
    assert scores[uuid[0]][uuid[4]] == 10 + 1200  # across CPUs
    assert len(scores) == 8 and all(len(peers) == 7 for peers in scores.values())


async def test_a_link_seen_from_one_side_scores_zero(tmp_path: Path) -> None:
    nvml = bridged_box()
    nvml.gpus[1].nvlinks = []  # GPU 1 does not see its bridge
    backend = backend_for(nvml, tmp_path)
    scores = parse_pair_scores(backend.node_annotations(await backend.enumerate())[SCORE])
    assert scores["GPU-0"]["GPU-1"] == 0 and scores["GPU-1"]["GPU-0"] == 0
    assert scores["GPU-2"]["GPU-3"] == 350


async def test_topology_is_read_once_per_set_of_gpus(tmp_path: Path) -> None:
    nvml = bridged_box()
    backend = backend_for(nvml, tmp_path)
    await backend.enumerate()
    calls = nvml.topology_calls
    assert calls == 12  # every ordered pair
    devices = await backend.enumerate()
    assert nvml.topology_calls == calls
    assert backend.node_annotations(devices[:3]) == {}  # not the GPUs it was read for
    nvml.gpus.pop()
    devices = await backend.enumerate()
    assert nvml.topology_calls == calls + 6
    assert set(parse_pair_scores(backend.node_annotations(devices)[SCORE])) == {
        "GPU-0",
        "GPU-1",
        "GPU-2",
    }


async def test_unreadable_topology_writes_no_score_and_registers_all_the_same(
    tmp_path: Path,
) -> None:
    nvml = bridged_box()
    nvml.topology_error = pynvml.NVML_ERROR_UNKNOWN
    backend = backend_for(nvml, tmp_path)
    with capture_logs() as logs:
        devices = await backend.enumerate()
    assert len(devices) == 4
    assert backend.node_annotations(devices) == {}
    assert any(entry["event"] == "nvidia.topology_unreadable" for entry in logs)
    # a driver without the call: PCIe part unknown, NVLinks still scored
    nvml = bridged_box()
    nvml.topology_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = backend_for(nvml, tmp_path)
    scores = parse_pair_scores(backend.node_annotations(await backend.enumerate())[SCORE])
    assert scores["GPU-0"] == {"GPU-1": 200, "GPU-2": 0, "GPU-3": 0}


async def test_the_option_turns_it_off(tmp_path: Path) -> None:
    nvml = bridged_box()
    backend = backend_for(nvml, tmp_path, topology_score=False)
    assert backend.node_annotations(await backend.enumerate()) == {}
    assert nvml.topology_calls == 0


async def test_the_registration_writes_the_score_with_the_register_value(
    tmp_path: Path,
) -> None:
    backend = backend_for(bridged_box(), tmp_path)
    state = DeviceState("nvidia", backend)
    state.set_enumerated(await backend.enumerate())
    written = registration_annotations(state, datetime(2024, 5, 20, tzinfo=UTC))
    assert backend.register_key in written
    assert parse_pair_scores(written[SCORE])["GPU-0"]["GPU-1"] == 250
