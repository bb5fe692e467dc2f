"""Host-level device usage (whole GPUs, every process), through NVML.

Only the NVIDIA backend has NVML; other backends export no host series. Read in a worker
thread (NVML calls block); a device NVML cannot read is left out of this round with one
warning, a value NVML does not support (e.g. memory on unified-memory parts) is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hami import log
from hami.backends import _nvml
from hami.backends.base import Backend, BackendError
from hami.backends.nvidia import NvidiaBackend

_log = log.get(__name__)


@dataclass(frozen=True, slots=True)
class HostGpu:
    index: int
    uuid: str
    device_type: str  # "NVIDIA-" + NVML's name, as Go HAMi labels it
    memory_used: int | None  # bytes
    utilization: int | None  # percent, SM busy
    memory_utilization: int | None  # percent, memory controller busy


class NvmlHost:
    """Reads every GPU NVML sees, through the backend's own NVML session."""

    def __init__(self, backend: NvidiaBackend) -> None:
        self.backend = backend
        self._warned: set[str] = set()

    def read(self) -> list[HostGpu]:
        try:
            # the backend's initialised session: one nvmlInit per process, shut down by it
            nvml = self.backend._start()
        except BackendError as exc:
            self._warn("init", str(exc))
            return []
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._warn("count", f"nvmlDeviceGetCount: {exc}")
            return []
        found = []
        for index in range(count):
            gpu = self._device(nvml, index)
            if gpu is not None:
                found.append(gpu)
        return found

    def _device(self, nvml: Any, index: int) -> HostGpu | None:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _nvml.text(nvml.nvmlDeviceGetUUID(handle))
            name = _nvml.text(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError as exc:
            self._warn(f"device{index}", f"GPU {index}: {exc}")
            return None
        memory_used: int | None = None
        utilization = memory_utilization = None
        try:
            memory_used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        except nvml.NVMLError as exc:
            self._warn(f"memory{index}", f"GPU {index} ({uuid}) memory: {exc}")
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            utilization, memory_utilization = int(rates.gpu), int(rates.memory)
        except nvml.NVMLError as exc:
            self._warn(f"util{index}", f"GPU {index} ({uuid}) utilization: {exc}")
        return HostGpu(index, uuid, f"NVIDIA-{name}", memory_used, utilization, memory_utilization)

    def _warn(self, what: str, error: str) -> None:
        """Once per kind of failure: NVML errors repeat every round."""
        if what not in self._warned:
            self._warned.add(what)
            _log.warning("monitor.host_usage_unreadable", error=error)


def host_readers(backends: list[Backend]) -> list[NvmlHost]:
    return [NvmlHost(b) for b in backends if isinstance(b, NvidiaBackend)]
