"""The NVIDIA backend on MIG GPUs (issue 23 item 1, the capability part): with
``mig_profile_allowlist`` a GPU in MIG mode registers its allowed profiles and placements as
NVML reports them, in Go HAMi 2.10's register form, against the fake NVML's A100 40/80 GB,
H100 80 GB and H200 tables (hami.backends.mig_tables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest
from _data import data_json
from _nvml_helpers import FakeGpu, FakeNvml
from structlog.testing import capture_logs

from hami.backends import BackendError, BackendSettings
from hami.backends.mig_tables import MIG_PROFILES
from hami.backends.nvidia import NvidiaBackend
from hami.protocol import decode_node_devices
from hami.protocol.mig import (
    MigPlacement,
    placements_overlap,
    select_mig_profile,
)

# The chart's allow-list entries (Go HAMi's device-configmap.yaml) for these GPUs.
ALLOWLIST: list[dict[str, Any]] = [
    {"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]},
    {"models": ["A100-SXM4-80GB"], "profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]},
    {"models": ["H100 80GB HBM3"], "profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]},
    {"models": ["H200"], "profiles": ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]},
]
MEMORY = {"A100-SXM4-40GB": 40960, "A100-SXM4-80GB": 81920, "H100 80GB HBM3": 81559}
MEMORY["H200"] = 143771


def gpu(index: int, name: str, mig_mode: int | None = 1) -> FakeGpu:
    return FakeGpu(
        index=index,
        uuid=f"GPU-mig-{index}",
        name=name,
        memory_total_bytes=MEMORY.get(name, 24576) * 2**20,
        bus_id=f"00000000:{index + 7:02X}:00.0",
        mig_mode=mig_mode,
    )


def backend(
    nvml: FakeNvml,
    sysfs: Path,
    allowlist: Any = ALLOWLIST,
    register_format: str = "json",
    mode: str = "mig",
) -> NvidiaBackend:
    options: dict[str, Any] = {
        "sysfs_root": str(sysfs),
        "topology_score": False,
        "operating_mode": mode,
        "mig_state_file": str(sysfs / "mig-ledger.json"),
    }
    if allowlist is not None:
        options["mig_profile_allowlist"] = allowlist
    return NvidiaBackend(
        BackendSettings(options=options, register_format=register_format), nvml=nvml
    )


async def test_a100_in_mig_mode_registers_byte_for_byte_what_go_registers(tmp_path: Path) -> None:
    nvml = FakeNvml([gpu(0, "A100-SXM4-40GB")])
    nvidia = backend(nvml, tmp_path)
    nvidia_devices = nvidia.to_node_devices(await nvidia.enumerate())
    value = nvidia.register_value(nvidia_devices)
    # Go HAMi's MarshalNodeDevices on the same profiles (tests/data/hami-go-v2.10-mig.json),
    # which is what Go's plugin publishes for this GPU with the chart's allow-list.
    (go,) = [
        c
        for c in data_json("hami-go-v2.10-mig.json")["register_encode"]
        if c["name"] == "a100-40-allowed"
    ]
    assert value == go["value"]
    (device,) = decode_node_devices(value)
    assert (device.mode, device.count, device.cores) == ("mig", 7, 100)
    assert [p.name for p in device.mig_profiles] == ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]


@pytest.mark.parametrize("model", sorted(MIG_PROFILES))
async def test_every_modelled_gpu_registers_its_allowed_geometry(
    model: str, tmp_path: Path
) -> None:
    nvml = FakeNvml([gpu(0, model)])
    nvidia = backend(nvml, tmp_path)
    (device,) = await nvidia.enumerate()
    assert device.mig is not None
    names = [p.name for p in device.mig.profiles]
    (entry,) = [e for e in ALLOWLIST if e["models"][0] == model]
    assert names == entry["profiles"]
    starts = {p.name[:2]: [x.start for x in p.placements] for p in device.mig.profiles}
    assert starts == {"1g": list(range(7)), "2g": [0, 2, 4], "3g": [0, 4], "7g": [0]}
    assert device.mig.instances == 7
    assert [p.core for p in device.mig.profiles][-1] == 100
    # Filling it with the scheduler's choice never yields an illegal layout.
    taken: list[MigPlacement] = []
    for request in [1, 10_000, 1, 30_000, 1, 1, 1, 1, 1]:
        chosen = select_mig_profile(device.mig.profiles, taken, request)
        if chosen is not None:
            assert not any(placements_overlap(chosen[1], t) for t in taken)
            taken.append(chosen[1])
    assert sum(p.size for p in taken) <= 8


@pytest.mark.parametrize("allowlist", [ALLOWLIST, None])
async def test_a_hami_core_node_registers_only_gpus_not_in_mig_mode(
    allowlist: Any, tmp_path: Path
) -> None:
    """HAMi-core cannot share a GPU in MIG mode, and a hami-core node publishes no MIG
    capability whatever its allow-list (Go's chart carries one on every node)."""
    gpus = [gpu(0, "A100-SXM4-80GB", mig_mode=0), gpu(1, "Tesla T4", None), gpu(2, "H200")]
    nvidia = backend(FakeNvml(gpus), tmp_path, allowlist=allowlist, mode="hami-core")
    with capture_logs() as logs:
        devices = nvidia.to_node_devices(await nvidia.enumerate())
    assert [(d.mode, d.mig_profiles, d.count) for d in devices] == [("hami-core", (), 10)] * 2
    (skipped,) = [e for e in logs if e["event"] == "nvidia.device_skipped_for_mode"]
    assert skipped["uuid"] == "GPU-mig-2" and "operating_mode: mig" in skipped["hint"]


async def test_a_mig_node_hands_out_no_hami_core_shares(tmp_path: Path) -> None:
    nvml = FakeNvml([gpu(0, "H200"), gpu(1, "H200", mig_mode=0), gpu(2, "Tesla T4", None)])
    nvidia = backend(nvml, tmp_path)
    with capture_logs() as logs:
        registered = nvidia.to_node_devices(await nvidia.enumerate())
    read = decode_node_devices(nvidia.register_value(registered))
    assert read == registered
    assert [(d.uuid, d.mode) for d in read] == [("GPU-mig-0", "mig")]
    assert read[0].mig_profiles[0].memory_mb == 16640
    hints = [e["hint"] for e in logs if e["event"] == "nvidia.device_skipped_for_mode"]
    assert len(hints) == 2 and all("nvidia-smi -i" in h for h in hints)


async def test_a_mig_gpu_with_no_allowed_profile_is_not_registered(tmp_path: Path) -> None:
    nvml = FakeNvml([gpu(0, "A100-SXM4-40GB"), gpu(1, "H200")])
    nvidia = backend(nvml, tmp_path, allowlist=[ALLOWLIST[0]])
    with capture_logs() as logs:
        devices = await nvidia.enumerate()
    assert [d.uuid for d in devices] == ["GPU-mig-0"]
    (skipped,) = [e for e in logs if e["event"] == "nvidia.mig_device_skipped"]
    assert skipped["uuid"] == "GPU-mig-1" and "mig_profile_allowlist" in skipped["hint"]


async def test_profiles_nvml_cannot_place_are_left_out(tmp_path: Path) -> None:
    nvml = FakeNvml([gpu(0, "A100-SXM4-40GB")])
    nvml.placements_error[2] = pynvml.NVML_ERROR_UNKNOWN  # the 3-slice profile
    allow = [{"models": ["A100"], "profiles": ["1g.5gb", "3g.20gb", "5g.x", "7g.40gb"]}]
    nvidia = backend(nvml, tmp_path, allowlist=allow)
    with capture_logs() as logs:
        (device,) = await nvidia.enumerate()
    assert device.mig is not None
    assert [p.name for p in device.mig.profiles] == ["1g.5gb", "7g.40gb"]
    reasons = [e["reason"] for e in logs if e["event"] == "nvidia.mig_profile_skipped"]
    assert [r.split(":")[0] for r in reasons] == ["3g.20gb", "5g.x"]


async def test_a_profile_name_reads_nvmls_profile_of_its_slice_count(tmp_path: Path) -> None:
    """As Go's plugin: ``1g.20gb`` reads NVML's plain 1-slice profile (the name is a label)."""
    nvml = FakeNvml([gpu(0, "A100-SXM4-80GB")])
    allow = [{"models": ["A100"], "profiles": ["1g.20gb"]}]
    (device,) = await backend(nvml, tmp_path, allowlist=allow).enumerate()
    assert device.mig is not None
    (profile,) = device.mig.profiles
    assert (profile.name, profile.memory_mb, len(profile.placements)) == ("1g.20gb", 9728, 7)


@pytest.mark.parametrize(
    ("allowlist", "register_format", "message"),
    [
        (ALLOWLIST, "seed", "register_format: json"),
        ([], "json", "operating_mode mig needs mig_profile_allowlist"),
        ([{"models": ["A100"], "profiles": ["1g"]}], "json", "invalid MIG profile '1g'"),
        ([{"models": [], "profiles": ["1g.5gb"]}], "json", "must name models and profiles"),
        ({"models": ["A100"]}, "json", "must be a list"),
    ],
)
def test_a_bad_allowlist_is_a_config_error(
    allowlist: Any, register_format: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(BackendError, match=r"mig_profile_allowlist|MIG") as caught:
        backend(FakeNvml([]), tmp_path, allowlist=allowlist, register_format=register_format)
    assert message in str(caught.value)


@pytest.mark.parametrize(("mode", "message"), [("x", "'x'"), ("MIG", "one of hami-core, mig, mps")])
def test_an_unknown_operating_mode_is_a_config_error(
    mode: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(BackendError, match="operating_mode") as caught:
        backend(FakeNvml([]), tmp_path, mode=mode)
    assert message in str(caught.value)


def test_a_hami_core_node_takes_an_allowlist_with_the_seed_register_form(tmp_path: Path) -> None:
    nvidia = backend(FakeNvml([]), tmp_path, register_format="seed", mode="hami-core")
    assert nvidia.operating_mode == "hami-core" and not nvidia.allocate_does_io
