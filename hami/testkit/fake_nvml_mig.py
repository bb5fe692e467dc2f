"""GPU and compute instances in the fake NVML (a mixin of
``hami.testkit.fake_nvml.FakeNvml``), with the driver's rules as NVIDIA's MIG user guide
states them: a GPU instance only in MIG mode, only at one of its profile's legal placements,
never overlapping another one's memory slices and no more of a profile than its instance
count; compute instances inside a GPU instance up to its slices; nothing destroyed while in
use (a GPU instance while it holds compute instances, a compute instance while a process
runs on it: ``busy``).

Handles are integers (``c_nvmlGpuInstance_t`` and ``c_nvmlComputeInstance_t`` are
``c_uint`` here, so the code under test fills ctypes arrays as it does with real pynvml).
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from hami.backends.mig_tables import GpuInstanceProfile, profiles_for
from hami.protocol.mig import MigPlacement, placements_overlap

# Compute instance profile id -> compute slices (NVML_COMPUTE_INSTANCE_PROFILE_*).
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeCi:
    id: int
    profile_id: int
    uuid: str


@dataclass
class FakeGi:
    id: int
    profile: GpuInstanceProfile
    placement: MigPlacement
    cis: dict[int, FakeCi] = field(default_factory=dict)


@dataclass(frozen=True)
class MigHandle:
    """A MIG device (``nvmlDeviceGetMigDeviceHandleByIndex``)."""

    index: int  # the parent GPU's
    gi: int
    ci: int


class FakeMigInstances:
    c_nvmlGpuInstance_t = ctypes.c_uint
    c_nvmlComputeInstance_t = ctypes.c_uint

    gpus: list[Any]

    def _mig_init(self) -> None:
        self.instances: dict[int, dict[int, FakeGi]] = {}  # GPU index -> GI id -> GI
        self.busy: set[str] = set()  # MIG uuids with a process running
        self.fail: dict[str, int] = {}  # NVML function name -> error code it raises
        self.created: list[tuple[int, int, MigPlacement]] = []  # (GPU, GI id, placement)
        self.destroyed: list[tuple[int, int]] = []  # (GPU, GI id)
        self._serial = itertools.count(1)

    # ----------------------------------------------------------------- helpers

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail:
            raise _error(self.fail[name])

    def _gis(self, index: int) -> dict[int, FakeGi]:
        return self.instances.setdefault(index, {})

    def _gi(self, handle: int) -> tuple[int, FakeGi]:
        index, gi_id = handle >> 16, handle & 0xFFFF
        found = self._gis(index).get(gi_id)
        if found is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index, found

    def _ci(self, handle: int) -> tuple[int, FakeGi, FakeCi]:
        index, gi = self._gi(handle >> 8)
        found = gi.cis.get(handle & 0xFF)
        if found is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index, gi, found

    def _mig_profile(self, index: int, profile_id: int) -> GpuInstanceProfile:
        gpu = self.gpus[index]
        if gpu.mig_mode != 1:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for profile in profiles_for(gpu.name):
            if profile.profile_id == profile_id:
                return profile
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    @staticmethod
    def _fill(array: Any, count_ref: Any, handles: list[int]) -> int:
        count = count_ref._obj
        if array is not None:
            if len(array) < len(handles) or count.value < len(handles):
                raise _error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, handle in enumerate(handles):
                array[i] = handle
        count.value = len(handles)
        return int(pynvml.NVML_SUCCESS)

    def add_instance(self, index: int, profile_id: int, start: int, with_ci: bool = True) -> int:
        """Create a GPU instance (and its compute instance) as an operator would, outside the
        agent; returns its GPU instance id."""
        placement = self.c_nvmlGpuInstancePlacement_t()  # type: ignore[attr-defined]
        placement.start = start
        placement.size = self._mig_profile(index, profile_id).placements[0].size
        gi = self.nvmlDeviceCreateGpuInstanceWithPlacement(
            SimpleNamespace(index=index), profile_id, ctypes.byref(placement)
        )
        if with_ci:
            slices = self._gi(gi)[1].profile.slice_count
            ci_profile = next(p for p, s in CI_SLICES.items() if s == slices)
            self.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
        return gi & 0xFFFF

    # ----------------------------------------------------------------- GPU instances

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: int, placement_ref: Any
    ) -> int:
        self._maybe_fail("nvmlDeviceCreateGpuInstanceWithPlacement")
        index = handle.index
        profile = self._mig_profile(index, profile_id)
        wanted = MigPlacement(int(placement_ref._obj.start), int(placement_ref._obj.size))
        if wanted not in profile.placements:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gis = self._gis(index)
        if any(placements_overlap(wanted, gi.placement) for gi in gis.values()):
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        same = [gi for gi in gis.values() if gi.profile.profile_id == profile_id]
        if len(same) >= profile.instance_count:
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = next(i for i in itertools.count(1) if i not in gis)
        gis[gi_id] = FakeGi(gi_id, profile, wanted)
        self.created.append((index, gi_id, wanted))
        return (int(index) << 16) | gi_id

    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: int, array: Any, count_ref: Any
    ) -> int:
        self._maybe_fail("nvmlDeviceGetGpuInstances")
        self._mig_profile(handle.index, profile_id)
        gis = sorted(self._gis(handle.index).values(), key=lambda gi: gi.id)
        handles = [
            (handle.index << 16) | gi.id for gi in gis if gi.profile.profile_id == profile_id
        ]
        return self._fill(array, count_ref, handles)

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int) -> int:
        if gi_id not in self._gis(handle.index):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return (int(handle.index) << 16) | gi_id

    def nvmlGpuInstanceGetInfo(self, gi_handle: int) -> SimpleNamespace:
        _, gi = self._gi(gi_handle)
        placement = SimpleNamespace(start=gi.placement.start, size=gi.placement.size)
        return SimpleNamespace(id=gi.id, profileId=gi.profile.profile_id, placement=placement)

    def nvmlGpuInstanceDestroy(self, gi_handle: int) -> int:
        self._maybe_fail("nvmlGpuInstanceDestroy")
        index, gi = self._gi(gi_handle)
        if gi.cis:
            raise _error(pynvml.NVML_ERROR_IN_USE)
        del self._gis(index)[gi.id]
        self.destroyed.append((index, gi.id))
        return int(pynvml.NVML_SUCCESS)

    # ----------------------------------------------------------------- compute instances

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi_handle: int, profile_id: int, engine: int, version: int = 2
    ) -> SimpleNamespace:
        _, gi = self._gi(gi_handle)
        slices = CI_SLICES.get(profile_id)
        if slices is None or slices > gi.profile.slice_count or engine != 0:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(
            id=profile_id, sliceCount=slices, instanceCount=gi.profile.slice_count // slices
        )

    def nvmlGpuInstanceCreateComputeInstance(self, gi_handle: int, profile_id: int) -> int:
        self._maybe_fail("nvmlGpuInstanceCreateComputeInstance")
        index, gi = self._gi(gi_handle)
        info = self.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_handle, profile_id, 0)
        used = sum(CI_SLICES[ci.profile_id] for ci in gi.cis.values())
        if used + info.sliceCount > gi.profile.slice_count:
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in itertools.count(0) if i not in gi.cis)
        uuid = f"MIG-{self.gpus[index].uuid.removeprefix('GPU-')}-{next(self._serial):04d}"
        gi.cis[ci_id] = FakeCi(ci_id, profile_id, uuid)
        return (gi_handle << 8) | ci_id

    def nvmlGpuInstanceGetComputeInstances(
        self, gi_handle: int, profile_id: int, array: Any, count_ref: Any
    ) -> int:
        _, gi = self._gi(gi_handle)
        handles = [
            (gi_handle << 8) | ci.id
            for ci in sorted(gi.cis.values(), key=lambda c: c.id)
            if ci.profile_id == profile_id
        ]
        return self._fill(array, count_ref, handles)

    def nvmlComputeInstanceGetInfo(self, ci_handle: int) -> SimpleNamespace:
        _, _, ci = self._ci(ci_handle)
        return SimpleNamespace(id=ci.id, profileId=ci.profile_id, gpuInstance=ci_handle >> 8)

    def nvmlComputeInstanceDestroy(self, ci_handle: int) -> int:
        self._maybe_fail("nvmlComputeInstanceDestroy")
        _, gi, ci = self._ci(ci_handle)
        if ci.uuid in self.busy:
            raise _error(pynvml.NVML_ERROR_IN_USE)
        del gi.cis[ci.id]
        return int(pynvml.NVML_SUCCESS)

    # ----------------------------------------------------------------- MIG devices

    def _mig_devices(self, index: int) -> list[tuple[FakeGi, FakeCi]]:
        gis = sorted(self._gis(index).values(), key=lambda gi: gi.id)
        return [(gi, ci) for gi in gis for ci in sorted(gi.cis.values(), key=lambda c: c.id)]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        self._maybe_fail("nvmlDeviceGetMaxMigDeviceCount")
        if self.gpus[handle.index].mig_mode != 1:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, position: int) -> MigHandle:
        found = self._mig_devices(handle.index)
        if position >= len(found):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        gi, ci = found[position]
        return MigHandle(handle.index, gi.id, ci.id)

    def nvmlDeviceGetGpuInstanceId(self, handle: MigHandle) -> int:
        return handle.gi

    def nvmlDeviceGetComputeInstanceId(self, handle: MigHandle) -> int:
        return handle.ci

    def mig_uuid(self, handle: MigHandle) -> str:
        return self._gis(handle.index)[handle.gi].cis[handle.ci].uuid

    def live(self, index: int) -> dict[int, tuple[MigPlacement, list[str]]]:
        """GI id -> (placement, MIG uuids) on one GPU, for assertions."""
        return {
            gi.id: (gi.placement, [ci.uuid for ci in gi.cis.values()])
            for gi in self._gis(index).values()
        }
