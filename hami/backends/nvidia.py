"""NVIDIA GPUs through NVML (``nvidia-ml-py``, module ``pynvml``), answered with HAMi-core.

Every NVML call runs in a worker thread. NVML starts once, lazily, on first use (a failed
start is retried on the next call, so a driver installed later is picked up) and shuts
down in ``close()``. A device NVML cannot read is reported unhealthy when its uuid is known
(from this call or an earlier enumeration at the same index) and skipped with a warning
otherwise; the other devices are unaffected.

Health: ``watch_health`` waits for NVML Xid critical error events. A device with a
critical Xid (other than the application Xids in ``ignored_xids``) is marked unhealthy and
**stays unhealthy until the node agent restarts**, as with the NVIDIA device plugin: Xids
such as 48 (double-bit ECC) or 79 (fell off the bus) need a GPU reset or a reboot, and a
restarted agent enumerates afresh. Later enumerations keep reporting it unhealthy.

Options (``BackendSettings.options``):

    sysfs_root: /sys            # where PCI devices are read for their NUMA node
    ignored_xids: [13, 31, 43, 45, 68, 109]   # application Xids that leave a GPU healthy
    health_checks: true         # false: no health watching at all
    event_timeout_ms: 1000      # NVML event wait; bounds how long a stop takes
    hamicore: {...}             # HAMi-core paths, see hami.backends.hamicore
    topology_score: true        # write hami.io/node-nvidia-score (link scores between
                                # GPUs from NVML: NVLink, PCIe path) for topology-aware
    mig_profile_allowlist:      # GPUs in MIG mode register their allowed profiles (Go's
      - models: [A100-SXM4-40GB]  # migProfileAllowlist; needs register_format: json)
        profiles: [1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb]

Topology: when the set of GPUs changes, the link score of every pair is read from NVML
(the common PCIe ancestor, NVLinks direct or through NVSwitch) as Go HAMi's plugin scores
it, and written with the register value as ``hami.io/node-nvidia-score`` in Go HAMi's
JSON form, so either scheduler can place ``topology-aware`` pods by it.

MIG (protocol.md §10): with ``mig_profile_allowlist`` set, a GPU whose MIG mode is on
registers as Go HAMi 2.10's plugin registers it: mode ``mig``, the allowed GPU instance
profiles NVML offers with their legal placements, as many slots as the largest profile
allows instances. A GPU in MIG mode with no allowed profile is not registered (as in Go).
Only reads: nothing here changes MIG mode or creates instances (not done yet: issue 23).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import threading
from collections.abc import Sequence
from typing import Any

import structlog

from hami.backends import _nvml
from hami.backends._nvml_health import watch_events
from hami.backends._nvml_mig import mig_enabled, read_mig_profiles
from hami.backends.base import (
    AllocationRequest,
    Backend,
    BackendError,
    BackendSettings,
    ContainerAllocation,
    Device,
    HealthCallback,
    MigCapability,
)
from hami.backends.hamicore import HamiCorePaths, hamicore_allocation
from hami.backends.nvidia_names import (
    NVIDIA_ALLOCATED,
    NVIDIA_PRIORITY,
    NVIDIA_RESOURCES,
    NVIDIA_TO_ALLOCATE,
)
from hami.core.topology import encode_pair_scores, score_key
from hami.protocol import register
from hami.protocol.mig import AllowedMigProfiles, validate_mig_profile_allowlist

log = structlog.get_logger(__name__)

_OPTIONS = {
    "sysfs_root",
    "ignored_xids",
    "health_checks",
    "event_timeout_ms",
    "hamicore",
    "topology_score",
    "mig_profile_allowlist",
}


class NvidiaBackend(Backend):
    type_word = "nvidia"
    vendor_word = "NVIDIA"
    default_resources = NVIDIA_RESOURCES
    allocated_key = NVIDIA_ALLOCATED
    to_allocate_key = NVIDIA_TO_ALLOCATE
    priority_resource = NVIDIA_PRIORITY
    known_options = frozenset(_OPTIONS)

    def __init__(self, settings: BackendSettings | None = None, *, nvml: Any = None) -> None:
        """``nvml``: an object with pynvml's functions and error classes (tests pass a fake)."""
        super().__init__(settings)
        options = self.settings.options
        unknown = set(options) - _OPTIONS
        if unknown:
            raise BackendError(
                f"nvidia: unknown option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}"
            )
        self.paths = HamiCorePaths.from_options(options)
        self.sysfs_root = str(options.get("sysfs_root", "/sys"))
        self.ignored_xids = _xids(options.get("ignored_xids", sorted(_nvml.DEFAULT_IGNORED_XIDS)))
        self.health_checks = options.get("health_checks", True)
        if not isinstance(self.health_checks, bool):
            raise BackendError("nvidia: option 'health_checks' must be true or false")
        timeout = options.get("event_timeout_ms", 1000)
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
            raise BackendError(
                f"nvidia: option 'event_timeout_ms' must be an integer >= 1, got {timeout!r}"
            )
        self.event_timeout_ms = timeout
        self.topology_score = options.get("topology_score", True)
        if not isinstance(self.topology_score, bool):
            raise BackendError("nvidia: option 'topology_score' must be true or false")
        self.mig_allowlist = _mig_allowlist(
            options.get("mig_profile_allowlist", []), self.settings.register_format
        )
        # hami.io/node-nvidia-score for the GPUs it was computed for (topology is fixed:
        # computed again only when the set of GPUs changes)
        self._scored: tuple[str, ...] | None = None
        self._score_value: str | None = None
        self._nvml = nvml
        self._init_lock = threading.Lock()
        self._started = False
        self._unhealthy: set[str] = set()
        self._by_index: dict[int, Device] = {}  # last good reading, for a device lost later
        self._watchers: list[tuple[threading.Event, threading.Event]] = []  # (stop, done)

    # NVML start and stop, in worker threads

    def _start(self) -> Any:
        with self._init_lock:
            if self._nvml is None:
                try:
                    self._nvml = importlib.import_module("pynvml")
                except ImportError as exc:
                    raise BackendError(
                        "nvidia: the pynvml module is missing; install nvidia-ml-py"
                    ) from exc
            nvml = self._nvml
            if not self._started:
                try:
                    nvml.nvmlInit()
                except nvml.NVMLError as exc:
                    # raised, not logged as well: the caller says it (the CLI prints it,
                    # the node agent logs it), once
                    raise BackendError(_nvml.init_error_message(nvml, exc)) from exc
                self._started = True
            return nvml

    async def close(self) -> None:
        for stop, _ in self._watchers:
            stop.set()
        # NVML must not shut down under a thread still waiting on an event set.
        for _, done in self._watchers:
            await asyncio.to_thread(done.wait, self.event_timeout_ms / 1000 + 5)
        self._watchers.clear()
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        with self._init_lock:
            if not self._started:
                return
            self._started = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.warning("nvidia.nvml_shutdown_failed", error=str(exc))

    # Enumeration

    async def enumerate(self) -> list[Device]:
        return await asyncio.to_thread(self._enumerate)

    def _enumerate(self) -> list[Device]:
        nvml = self._start()
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise BackendError(f"NVML could not count the GPUs on this node: {exc}") from exc
        devices = [d for d in (self._read(nvml, index) for index in range(count)) if d]
        devices.sort(key=lambda d: d.index)
        if self.topology_score:
            self._score_topology(nvml, devices)
        return devices

    def _score_topology(self, nvml: Any, devices: Sequence[Device]) -> None:
        uuids = tuple(d.uuid for d in devices)
        if uuids == self._scored:
            return
        self._scored, self._score_value = uuids, None
        handles: list[tuple[str, Any]] = []
        for device in devices:
            try:
                handles.append((device.uuid, nvml.nvmlDeviceGetHandleByIndex(device.index)))
            except nvml.NVMLError:
                continue  # a lost GPU has no links to score; the others still do
        try:
            scores = _nvml.gpu_pair_scores(nvml, handles)
        except nvml.NVMLError as exc:
            log.warning(
                "nvidia.topology_unreadable",
                error=str(exc),
                hint="no hami.io/node-nvidia-score: topology-aware pods are placed here "
                "without link scores",
            )
            return
        self._score_value = encode_pair_scores([uuid for uuid, _ in handles], scores)

    def node_annotations(self, devices: Sequence[Device]) -> dict[str, str]:
        """``hami.io/node-nvidia-score`` (Go HAMi's format) for the enumerated GPUs."""
        if self._score_value is None or self._scored != tuple(d.uuid for d in devices):
            return {}
        return {score_key(self.type_word): self._score_value}

    def _read(self, nvml: Any, index: int) -> Device | None:
        uuid: str | None = None
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _nvml.text(nvml.nvmlDeviceGetUUID(handle))
            name = _nvml.text(nvml.nvmlDeviceGetName(handle))
            memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20
            bus_id = _nvml.text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except nvml.NVMLError as exc:
            return self._unreadable(index, uuid, exc)
        model = _nvml.model_name(name)
        mig = None
        if self.mig_allowlist and mig_enabled(nvml, handle):
            mig = self._mig(nvml, handle, index, uuid, model)
            if mig is None:
                return None
        device = Device(
            uuid=uuid,
            index=index,
            model=model,
            memory_mib=memory,
            numa=_nvml.numa_node(self.sysfs_root, bus_id),
            healthy=uuid not in self._unhealthy,
            mig=mig,
        )
        self._by_index[index] = device
        return device

    def _mig(
        self, nvml: Any, handle: Any, index: int, uuid: str, model: str
    ) -> MigCapability | None:
        """The allowed profiles of a GPU in MIG mode; None (not registered) without any."""
        profiles, instances, skipped = read_mig_profiles(nvml, handle, model, self.mig_allowlist)
        for reason in skipped:
            log.info("nvidia.mig_profile_skipped", index=index, uuid=uuid, reason=reason)
        if not profiles:
            log.warning(
                "nvidia.mig_device_skipped",
                index=index,
                uuid=uuid,
                model=model,
                hint="the GPU is in MIG mode and mig_profile_allowlist allows none of its "
                "profiles for this model: add an entry naming the model, or disable MIG",
            )
            return None
        return MigCapability(profiles, instances)

    def _unreadable(self, index: int, uuid: str | None, exc: BaseException) -> Device | None:
        known = self._by_index.get(index)
        if uuid is None and known is not None:
            uuid = known.uuid
        if uuid is None:
            log.warning("nvidia.device_skipped", index=index, error=str(exc))
            return None
        log.warning("nvidia.device_unhealthy", index=index, uuid=uuid, error=str(exc))
        self._unhealthy.add(uuid)
        if known is not None and known.uuid == uuid:
            return Device(uuid, index, known.model, known.memory_mib, known.numa, False, known.mig)
        return Device(uuid, index, "NVIDIA-unknown", 0, 0, healthy=False)

    # Allocation

    def allocate(self, request: AllocationRequest) -> ContainerAllocation:
        return hamicore_allocation(request, self.paths, priority_resource=self.priority_resource)

    # Health

    async def watch_health(self, devices: Sequence[Device], on_change: HealthCallback) -> None:
        if not self.health_checks:
            log.info("nvidia.health_checks_disabled")
            return
        loop = asyncio.get_running_loop()
        reported: set[str] = set()

        def mark_unhealthy(uuid: str, reason: str) -> None:  # in the worker thread
            if uuid in reported:
                return
            reported.add(uuid)
            self._unhealthy.add(uuid)
            log.warning("nvidia.device_unhealthy", uuid=uuid, reason=reason)
            # RuntimeError: the loop has closed, nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(on_change, uuid, False)

        stop, done = threading.Event(), threading.Event()
        self._watchers.append((stop, done))

        def run() -> None:
            try:
                nvml = self._start()
                try:
                    watch_events(
                        nvml,
                        list(devices),
                        ignored_xids=self.ignored_xids,
                        timeout_ms=self.event_timeout_ms,
                        stop=stop,
                        mark_unhealthy=mark_unhealthy,
                    )
                except nvml.NVMLError as exc:
                    raise BackendError(f"NVML health watching failed: {exc}") from exc
            finally:
                done.set()

        try:
            await asyncio.to_thread(run)
        finally:
            stop.set()  # on cancellation the thread sees it within event_timeout_ms
            if done.is_set():
                self._watchers.remove((stop, done))


def _mig_allowlist(value: Any, register_format: str) -> tuple[AllowedMigProfiles, ...]:
    if not isinstance(value, list | tuple):
        raise BackendError(
            "nvidia: option 'mig_profile_allowlist' must be a list of "
            f"{{models: [...], profiles: [...]}}, got {value!r}"
        )
    try:
        allowed = validate_mig_profile_allowlist(value)
    except ValueError as exc:
        raise BackendError(f"nvidia: option 'mig_profile_allowlist': {exc}") from None
    if allowed and register_format != register.JSON:
        raise BackendError(
            "nvidia: MIG profiles travel only in the JSON register form: set "
            "register_format: json beside mig_profile_allowlist"
        )
    return allowed


def _xids(value: Any) -> frozenset[int]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in value
    ):
        raise BackendError(
            f"nvidia: option 'ignored_xids' must be a list of integers, got {value!r}"
        )
    return frozenset(value)
