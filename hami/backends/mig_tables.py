"""GPU instance profiles of MIG-capable NVIDIA GPUs, as NVML reports them, for the fake NVML
of the tests and for simulated nodes.

Geometry (profiles, instance counts, multiprocessors, legal placements) is NVIDIA's public
MIG user guide ("Supported MIG Profiles"); the memory in MiB is modelled from the guide's
sizes (a real driver reports slightly different figures, which is why the node always reads
them from NVML). Placements are in memory slices: 8 per GPU, a 7g instance taking all 8.
"""

from __future__ import annotations

from dataclasses import dataclass

from hami.protocol.mig import MigPlacement

# NVML's GPU instance profile ids (nvmlGpuInstanceProfile*), as in pynvml.
PROFILE_1_SLICE = 0
PROFILE_2_SLICE = 1
PROFILE_3_SLICE = 2
PROFILE_4_SLICE = 3
PROFILE_7_SLICE = 4
PROFILE_8_SLICE = 5
PROFILE_6_SLICE = 6
PROFILE_1_SLICE_REV1 = 7  # 1g with all media engines (1g.*+me)
PROFILE_1_SLICE_REV2 = 9  # 1g with twice the memory (1g.10gb on 40 GB, 1g.20gb on 80 GB)


@dataclass(frozen=True, slots=True)
class GpuInstanceProfile:
    """What ``nvmlDeviceGetGpuInstanceProfileInfo`` and
    ``nvmlDeviceGetGpuInstancePossiblePlacements`` answer for one profile id."""

    profile_id: int
    name: str  # NVML's name, "MIG 1g.5gb"
    slice_count: int
    instance_count: int
    multiprocessor_count: int
    memory_mb: int
    placements: tuple[MigPlacement, ...]


def _at(starts: tuple[int, ...], size: int) -> tuple[MigPlacement, ...]:
    return tuple(MigPlacement(start, size) for start in starts)


_ONE = _at((0, 1, 2, 3, 4, 5, 6), 1)
_ONE_DOUBLE = _at((0, 2, 4, 6), 2)
_TWO = _at((0, 2, 4), 2)
_THREE = _at((0, 4), 4)
_FOUR = _at((0,), 4)
_SEVEN = _at((0,), 8)


def _table(
    sms: tuple[int, int, int, int, int], names: tuple[str, ...], memory: tuple[int, ...]
) -> tuple[GpuInstanceProfile, ...]:
    """A GPU's profiles from its multiprocessors (1g, 2g, 3g, 4g, 7g), its profile names
    (1g, 1g+me, 1g double, 2g, 3g, 4g, 7g) and their memory in MiB."""
    one, two, three, four, seven = sms
    rows = (
        (PROFILE_1_SLICE, 1, 7, one, _ONE),
        (PROFILE_1_SLICE_REV1, 1, 1, one, _ONE),
        (PROFILE_1_SLICE_REV2, 1, 4, one, _ONE_DOUBLE),
        (PROFILE_2_SLICE, 2, 3, two, _TWO),
        (PROFILE_3_SLICE, 3, 2, three, _THREE),
        (PROFILE_4_SLICE, 4, 1, four, _FOUR),
        (PROFILE_7_SLICE, 7, 1, seven, _SEVEN),
    )
    return tuple(
        GpuInstanceProfile(pid, f"MIG {name}", slices, count, mps, mb, places)
        for (pid, slices, count, mps, places), name, mb in zip(rows, names, memory, strict=True)
    )


_A100_SMS = (14, 28, 42, 56, 98)
_H100_SMS = (16, 32, 60, 64, 132)

# By the model word NVML names the GPU with (a substring of nvmlDeviceGetName).
MIG_PROFILES: dict[str, tuple[GpuInstanceProfile, ...]] = {
    "A100-SXM4-40GB": _table(
        _A100_SMS,
        ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        (4864, 4864, 9856, 9856, 19968, 19968, 40192),
    ),
    "A100-SXM4-80GB": _table(
        _A100_SMS,
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (9728, 9728, 19968, 19968, 40192, 40192, 80896),
    ),
    "H100 80GB HBM3": _table(
        _H100_SMS,
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (9984, 9984, 20096, 20096, 40448, 40448, 81152),
    ),
    "H200": _table(
        _H100_SMS,
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        (16640, 16640, 33792, 33792, 69888, 69888, 143360),
    ),
}


def profiles_for(model: str) -> tuple[GpuInstanceProfile, ...]:
    """The profile table of the GPU named ``model``; none for a GPU without MIG."""
    for word, table in MIG_PROFILES.items():
        if word in model:
            return table
    return ()
