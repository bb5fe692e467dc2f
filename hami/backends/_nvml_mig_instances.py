"""GPU and compute instances through NVML: what is live on a GPU, making one GPU instance at
an exact placement with one compute instance over all of it, the MIG device's UUID, and
destroying one. Every function raises ``NVMLError``; callers say what it meant.

pynvml's list calls take a ctypes array and a count (as for placements); the handle types
are read from the ``nvml`` module given, so a fake NVML can use its own.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

from hami.backends._nvml import text
from hami.backends._nvml_mig import GI_PROFILE_BY_SLICES
from hami.protocol.mig import MigPlacement

# nvmlComputeInstanceProfile ids by slice word (the compute instance that spans its GPU
# instance, as Go HAMi's plugin makes it).
CI_PROFILE_BY_SLICES: dict[str, int] = {
    "1g": 0,
    "2g": 1,
    "3g": 2,
    "4g": 3,
    "6g": 6,
    "7g": 4,
    "8g": 5,
}
GI_PROFILE_COUNT = 18  # NVML_GPU_INSTANCE_PROFILE_COUNT: every id an existing one may have
CI_PROFILE_COUNT = 9  # NVML_COMPUTE_INSTANCE_PROFILE_COUNT
ENGINE_SHARED = 0  # NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
_MAX_PER_PROFILE = 8  # no GPU has more instances of one profile than memory slices


@dataclass(frozen=True, slots=True)
class LiveInstance:
    """A GPU instance NVML reports on a GPU, with the ids of its compute instances."""

    gi_id: int
    profile_id: int
    placement: MigPlacement
    ci_ids: tuple[int, ...] = ()
    handle: Any = field(default=None, compare=False, repr=False)


def _listed(nvml: Any, kind: Any, call: Any, owner: Any, profile_id: int) -> list[Any]:
    array = (kind * _MAX_PER_PROFILE)()
    count = ctypes.c_uint(_MAX_PER_PROFILE)
    call(owner, profile_id, array, ctypes.byref(count))
    return list(array[: count.value])


def compute_instances(nvml: Any, gi: Any) -> list[tuple[int, Any]]:
    """(id, handle) of every compute instance of the GPU instance ``gi``."""
    found: list[tuple[int, Any]] = []
    for profile_id in range(CI_PROFILE_COUNT):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile_id, ENGINE_SHARED)
        except nvml.NVMLError:
            continue  # a profile this GPU instance cannot hold
        listing = nvml.nvmlGpuInstanceGetComputeInstances
        for ci in _listed(nvml, nvml.c_nvmlComputeInstance_t, listing, gi, int(info.id)):
            found.append((int(nvml.nvmlComputeInstanceGetInfo(ci).id), ci))
    return sorted(found, key=lambda pair: pair[0])


def live_instances(nvml: Any, handle: Any) -> list[LiveInstance]:
    """Every GPU instance on the GPU, by id."""
    found: list[LiveInstance] = []
    for profile_id in range(GI_PROFILE_COUNT):
        try:
            nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
        except nvml.NVMLError:
            continue  # not a profile of this GPU
        listing = nvml.nvmlDeviceGetGpuInstances
        for gi in _listed(nvml, nvml.c_nvmlGpuInstance_t, listing, handle, profile_id):
            info = nvml.nvmlGpuInstanceGetInfo(gi)
            placement = MigPlacement(int(info.placement.start), int(info.placement.size))
            cis = tuple(ci_id for ci_id, _ in compute_instances(nvml, gi))
            found.append(LiveInstance(int(info.id), int(info.profileId), placement, cis, gi))
    return sorted(found, key=lambda i: i.gi_id)


def create_gpu_instance(nvml: Any, handle: Any, profile_id: int, placement: MigPlacement) -> Any:
    """A GPU instance of ``profile_id`` exactly at ``placement``; returns its handle."""
    where = nvml.c_nvmlGpuInstancePlacement_t()
    where.start, where.size = placement.start, placement.size
    return nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, ctypes.byref(where))


def create_compute_instance(nvml: Any, gi: Any, slice_word: str) -> int:
    """The compute instance spanning the GPU instance ``gi``; returns its id."""
    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, CI_PROFILE_BY_SLICES[slice_word], ENGINE_SHARED
    )
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, int(info.id))
    return int(nvml.nvmlComputeInstanceGetInfo(ci).id)


def gi_info(nvml: Any, gi: Any) -> tuple[int, int]:
    """(GPU instance id, profile id) of a GPU instance handle."""
    info = nvml.nvmlGpuInstanceGetInfo(gi)
    return int(info.id), int(info.profileId)


def mig_device_uuid(nvml: Any, handle: Any, gi_id: int, ci_id: int) -> str | None:
    """The UUID of the MIG device of (GPU instance, compute instance); None when NVML shows
    no such MIG device."""
    for position in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, position)
        except nvml.NVMLError:
            continue  # an empty position
        if (
            int(nvml.nvmlDeviceGetGpuInstanceId(device)) == gi_id
            and int(nvml.nvmlDeviceGetComputeInstanceId(device)) == ci_id
        ):
            return text(nvml.nvmlDeviceGetUUID(device))
    return None


def destroy_gpu_instance(nvml: Any, handle: Any, gi_id: int) -> bool:
    """Destroy the GPU instance ``gi_id`` and its compute instances; False when it is gone
    already. Raises NVMLError (``IN_USE`` while a process runs on it)."""
    try:
        gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
    except nvml.NVMLError_NotFound:
        return False
    for _, ci in compute_instances(nvml, gi):
        nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)
    return True


def gi_profile_id(slice_word: str) -> int | None:
    return GI_PROFILE_BY_SLICES.get(slice_word)
