"""The NVIDIA backend of a simulated node in ``operating_mode: mig``: the real backend over
the fake NVML (``hami.testkit.fake_nvml``), its GPUs in MIG mode with the profile table of
their model (``hami.backends.mig_tables``: A100 40/80 GB, H100, H200), so the node agent
registers MIG capability and makes GPU and compute instances on Allocate exactly as it
does on hardware.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hami.backends.base import BackendSettings
from hami.backends.mig_tables import profiles_for
from hami.backends.nvidia import MIG, NvidiaBackend
from hami.protocol import register
from hami.testkit.fake_nvml import FakeGpu, FakeNvml

#: what the simulated MIG GPUs offer (Go's migProfileAllowlist form): the A100 40 GB's
#: profiles of 1, 2, 3 and 7 compute slices
MIG_ALLOWLIST = (
    {"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]},
)


def mig_gpus(groups: Sequence[Mapping[str, Any]], uuid_prefix: str) -> list[FakeGpu]:
    """One fake GPU in MIG mode per device of ``groups`` (count, model, memory MiB), with
    uuids ``{uuid_prefix}-{i}`` as the fake backend numbers them."""
    gpus: list[FakeGpu] = []
    for group in groups:
        model = str(group["model"])
        name = model.removeprefix("NVIDIA-")
        if not profiles_for(name):
            raise ValueError(f"{model}: the fake NVML has no MIG profile table for it")
        for _ in range(int(group.get("count", 1))):
            i = len(gpus)
            gpus.append(
                FakeGpu(
                    index=i,
                    uuid=f"{uuid_prefix}-{i}",
                    name=name,
                    memory_total_bytes=int(group["memory"]) * 2**20,
                    bus_id=f"00000000:{0x10 + i:02x}:00.0",
                    mig_mode=1,
                )
            )
    return gpus


def mig_backend(
    groups: Sequence[Mapping[str, Any]],
    uuid_prefix: str,
    workdir: Path,
    allowlist: Sequence[Mapping[str, Any]] = MIG_ALLOWLIST,
) -> NvidiaBackend:
    """The NVIDIA backend in MIG mode over fake GPUs, offering the profiles ``allowlist``
    allows; its files (MIG ledger, HAMi-core directory) under ``workdir``."""
    options: dict[str, Any] = {
        "sysfs_root": str(workdir / "sys"),  # no NUMA files: none is reported
        "topology_score": False,
        "health_checks": False,
        "operating_mode": MIG,
        "mig_profile_allowlist": [dict(entry) for entry in allowlist],
        "hamicore": {"containers_dir": str(workdir / "vgpu" / "containers")},
    }
    settings = BackendSettings(split_count=7, options=options, register_format=register.JSON)
    return NvidiaBackend(settings, nvml=FakeNvml(mig_gpus(groups, uuid_prefix)))
