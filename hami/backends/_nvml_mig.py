"""A MIG GPU's capability from NVML, as Go HAMi 2.10's device plugin discovers it.

Only the profiles the allow-list names for the GPU's model are read. Each name's part
before the ``.`` (``3g``) chooses the NVML GPU instance profile (``3g`` -> the 3-slice
profile), as Go's plugin does: the name is the allow-list's label and the memory, slices
and placements are NVML's for that profile (so ``1g.20gb`` would read as the plain 1-slice
profile). ``core`` is the profile's multiprocessors in percent of the largest profile's,
rounded up. Reads only: MIG mode is never changed here.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

from hami.protocol.mig import (
    AllowedMigProfiles,
    MigPlacement,
    MigProfile,
    allowed_profiles_for_model,
    profile_slice_key,
)

# nvmlGpuInstanceProfile ids by a profile name's slice word, as Go HAMi's plugin maps them.
GI_PROFILE_BY_SLICES: dict[str, int] = {
    "1g": 0,  # NVML_GPU_INSTANCE_PROFILE_1_SLICE
    "2g": 1,  # _2_SLICE
    "3g": 2,  # _3_SLICE
    "4g": 3,  # _4_SLICE
    "6g": 6,  # _6_SLICE
    "7g": 4,  # _7_SLICE
    "8g": 5,  # _8_SLICE
}
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE


def mig_enabled(nvml: Any, handle: Any) -> bool:
    """Whether the GPU runs in MIG mode now; a GPU without MIG (NVML: not supported) does not."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return False
    return int(current) == _MIG_ENABLED


def _profile_info(nvml: Any, handle: Any, profile_id: int) -> Any | None:
    try:
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
    except nvml.NVMLError:
        return None  # a profile this GPU does not have


def possible_placements(nvml: Any, handle: Any, profile_id: int) -> tuple[MigPlacement, ...]:
    """Every legal placement of the profile (NVML asked twice: how many, then which).
    Raises NVMLError."""
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    if count.value == 0:
        return ()
    found = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, found, ctypes.byref(count))
    return tuple(MigPlacement(int(p.start), int(p.size)) for p in found[: count.value])


def read_mig_profiles(
    nvml: Any, handle: Any, model: str, allowlist: Iterable[AllowedMigProfiles]
) -> tuple[tuple[MigProfile, ...], int, list[str]]:
    """The allowed profiles NVML has for this GPU, the most instances any allows (the
    register's count), and the names skipped with why."""
    infos = [_profile_info(nvml, handle, pid) for pid in GI_PROFILE_BY_SLICES.values()]
    full = max((int(i.multiprocessorCount) for i in infos if i is not None), default=0)
    profiles: list[MigProfile] = []
    instances = 0
    skipped: list[str] = []
    for name in allowed_profiles_for_model(allowlist, model):
        profile_id = GI_PROFILE_BY_SLICES.get(profile_slice_key(name))
        info = None if profile_id is None else _profile_info(nvml, handle, profile_id)
        if profile_id is None or info is None:
            skipped.append(f"{name}: no such GPU instance profile on this GPU")
            continue
        try:
            placements = possible_placements(nvml, handle, profile_id)
        except nvml.NVMLError as exc:
            skipped.append(f"{name}: NVML gave no placements ({exc})")
            continue
        multiprocessors = int(info.multiprocessorCount)
        core = (multiprocessors * 100 + full - 1) // full if full else 0
        profiles.append(
            MigProfile(
                name=name,
                memory_mb=int(info.memorySizeMB),
                core=core,
                slice_count=int(info.sliceCount),
                placements=placements,
            )
        )
        instances = max(instances, int(info.instanceCount))
    return tuple(profiles), instances, skipped
