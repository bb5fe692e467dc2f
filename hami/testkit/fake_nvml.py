"""A fake NVML: the slice of pynvml's functions and errors the NVIDIA backend calls, over
GPUs described in code, with call records. The NVIDIA backend tests drive it, and
``hami demo``'s MIG node runs its agent on it (GPU and compute instances:
``hami.testkit.fake_nvml_mig``)."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from hami.backends.mig_tables import profiles_for
from hami.testkit.fake_nvml_mig import FakeMigInstances, MigHandle

XID = pynvml.nvmlEventTypeXidCriticalError


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # maps to the subclass, e.g. NVMLError_GpuIsLost


@dataclass
class FakeGpu:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    bus_id: str
    numa_node: int | None = None
    lost: str | None = None  # "handle": lost before its uuid is read; "after_uuid": after
    # NVLinks by link number: (far end's PCI address, NVML remote device type), None for a
    # disabled link; links past the list do not exist (NVML: invalid argument)
    nvlinks: list[tuple[str, int] | None] = field(default_factory=list)
    # MIG mode, current and pending: None on a GPU without MIG (NVML: not supported). The
    # profiles are hami.backends.mig_tables' for the GPU's name.
    mig_mode: int | None = None
    # details (DRA attributes): None is NVML's "not supported" for this GPU
    architecture: int | None = None  # nvmlDeviceArchitecture_t
    compute_capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class Handle:
    index: int


class FakeNvml(FakeMigInstances):
    """The slice of pynvml the backend uses, with call records (GPU and compute instances:
    ``hami.testkit.fake_nvml_mig``)."""

    NVMLError = pynvml.NVMLError
    nvmlEventTypeXidCriticalError = XID
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0
        self.threads: set[int] = set()
        self.events: queue.Queue[Any] = queue.Queue()
        self.registered: list[str] = []
        self.freed = 0
        self.count_error: int | None = None
        # topology: level by GPU index pair (default: NODE on one NUMA node, else SYSTEM)
        self.ancestors: dict[frozenset[int], int] = {}
        self.topology_error: int | None = None
        self.topology_calls = 0
        self.mig_calls = 0  # MIG mode, profile and placement queries
        self.placements_error: dict[int, int] = {}  # profile id -> NVML error code
        # the machine's driver (None: not supported) and an NVML error per detail call
        self.driver_version: str | None = "550.54.15"
        self.cuda_driver_version: int | None = 12040
        self.detail_errors: dict[str, int] = {}
        self._mig_init()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVMLError_"):  # every error class pynvml has
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _call(self) -> None:
        self.threads.add(threading.get_ident())

    def _gpu(self, handle: Handle, stage: str) -> FakeGpu:
        gpu: FakeGpu = self.gpus[handle.index]
        if gpu.lost == stage:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def nvmlInit(self) -> None:
        self._call()
        self.init_calls += 1
        if self.init_error is not None:
            raise nvml_error(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        self._call()
        if self.count_error is not None:
            raise nvml_error(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._call()
        if self.gpus[index].lost == "handle":
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return Handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        self._call()
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return Handle(gpu.index)
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        return handle.index

    def nvmlDeviceGetUUID(self, handle: Handle | MigHandle) -> str:
        self._call()
        if isinstance(handle, MigHandle):
            return self.mig_uuid(handle)
        return str(self.gpus[handle.index].uuid)

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._call()
        return self._gpu(handle, "after_uuid").name

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> SimpleNamespace:
        total = self._gpu(handle, "after_uuid").memory_total_bytes
        return SimpleNamespace(total=total, free=total - 2**30, used=2**30)

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        """An idle GPU; in MIG mode the driver has no GPU-wide rates (not supported)."""
        self._call()
        if self._gpu(handle, "after_uuid").mig_mode == 1:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=0, memory=0)

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        # Real pynvml decodes busId to str; older bindings gave bytes: exercise that path.
        return SimpleNamespace(busId=self._gpu(handle, "after_uuid").bus_id.encode())

    def _detail(self, call: str, value: Any) -> Any:
        self._call()
        if call in self.detail_errors:
            raise nvml_error(self.detail_errors[call])
        if value is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self._detail("driver", self.driver_version))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self._detail("cuda", self.cuda_driver_version))

    def nvmlDeviceGetArchitecture(self, handle: Handle) -> int:
        return int(self._detail("architecture", self._gpu(handle, "after_uuid").architecture))

    def nvmlDeviceGetCudaComputeCapability(self, handle: Handle) -> tuple[int, int]:
        found = self._detail("capability", self._gpu(handle, "after_uuid").compute_capability)
        return (int(found[0]), int(found[1]))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        return int(XID | pynvml.nvmlEventTypeSingleBitEccError)

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, event_set: object) -> None:
        self._call()
        assert types == XID
        self.registered.append(self.gpus[handle.index].uuid)

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.freed += 1

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> Any:
        self._call()
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlDeviceGetTopologyCommonAncestor(self, one: Handle, other: Handle) -> int:
        self._call()
        self.topology_calls += 1
        if self.topology_error is not None:
            raise nvml_error(self.topology_error)
        level = self.ancestors.get(frozenset((one.index, other.index)))
        if level is not None:
            return level
        same = self.gpus[one.index].numa_node == self.gpus[other.index].numa_node
        return int(pynvml.NVML_TOPOLOGY_NODE if same else pynvml.NVML_TOPOLOGY_SYSTEM)

    def _link(self, handle: Handle, link: int) -> tuple[str, int] | None:
        links = self._gpu(handle, "after_uuid").nvlinks
        if link >= len(links):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        self._call()
        found = self._link(handle, link)
        return int(pynvml.NVML_FEATURE_ENABLED if found else pynvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> SimpleNamespace:
        found = self._link(handle, link)
        assert found is not None, "NVML is not asked about a disabled link"
        return SimpleNamespace(busId=found[0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:
        found = self._link(handle, link)
        assert found is not None, "NVML is not asked about a disabled link"
        return found[1]

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        self._call()
        self.mig_calls += 1
        gpu = self._gpu(handle, "after_uuid")
        if gpu.mig_mode is None or not profiles_for(gpu.name):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def _gi_profile(self, handle: Handle, profile_id: int) -> Any:
        gpu = self._gpu(handle, "after_uuid")
        for profile in profiles_for(gpu.name) if gpu.mig_mode is not None else ():
            if profile.profile_id == profile_id:
                return profile
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: Handle, profile_id: int, version: int = 2
    ) -> SimpleNamespace:
        self._call()
        self.mig_calls += 1
        p = self._gi_profile(handle, profile_id)
        return SimpleNamespace(
            id=p.profile_id,
            sliceCount=p.slice_count,
            instanceCount=p.instance_count,
            multiprocessorCount=p.multiprocessor_count,
            memorySizeMB=p.memory_mb,
            name=p.name,
        )

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Handle, profile_id: int, placements: Any, count_ref: Any
    ) -> int:
        """pynvml's low-level form: ``placements`` NULL asks how many; else an array of
        c_nvmlGpuInstancePlacement_t as long as ``count_ref`` (a byref c_uint) says."""
        self._call()
        self.mig_calls += 1
        if profile_id in self.placements_error:
            raise nvml_error(self.placements_error[profile_id])
        found = self._gi_profile(handle, profile_id).placements
        count = count_ref._obj  # the c_uint behind byref()
        if placements is not None:
            if count.value < len(found) or len(placements) < len(found):
                raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, placement in enumerate(found):
                placements[i].start, placements[i].size = placement.start, placement.size
        count.value = len(found)
        return int(pynvml.NVML_SUCCESS)

    def push_xid(self, xid: int, index: int | None, event_type: int = XID) -> None:
        device = Handle(index) if index is not None else None  # None: a null handle
        self.events.put(SimpleNamespace(device=device, eventType=event_type, eventData=xid))
