"""Recorded node layouts for the fake NVML (``hami.testkit.fake_nvml``, re-exported here),
shared by the NVIDIA backend tests and the gpu-check tests."""

from __future__ import annotations

import json
from pathlib import Path

from hami.backends._nvml import sysfs_bus_id
from hami.testkit.fake_nvml import XID, FakeGpu, FakeNvml, Handle, nvml_error
from hami.testkit.fake_nvml_mig import MigHandle

FIXTURES = Path(__file__).parent / "fixtures"

__all__ = ["XID", "FakeGpu", "FakeNvml", "Handle", "MigHandle", "load_node", "nvml_error"]


def load_node(name: str, sysfs: Path) -> list[FakeGpu]:
    """The fixture's GPUs, with their numa_node files written under a sysfs tree."""
    gpus = [FakeGpu(**d) for d in json.loads((FIXTURES / name).read_text())["devices"]]
    for gpu in gpus:
        if gpu.numa_node is not None:
            entry = sysfs / "bus/pci/devices" / sysfs_bus_id(gpu.bus_id)
            entry.mkdir(parents=True)
            (entry / "numa_node").write_text(f"{gpu.numa_node}\n")
    return gpus
