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
    operating_mode: hami-core   # or mig: GPUs in MIG mode served as MIG instances only;
                                # or mps: GPUs shared through NVIDIA MPS (hami.backends.mps)
    mig_profile_allowlist:      # (mig) the profiles GPUs in MIG mode register (Go's
      - models: [A100-SXM4-40GB]  # migProfileAllowlist; needs register_format: json)
        profiles: [1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb]
    mig_state_file: <containers_dir's parent>/hami-mig-instances.json  # instances it made
    mps: {pipe_dir: ..., log_dir: ..., shm_dir: ..., control: ..., daemon: start|attach}

Topology: when the set of GPUs changes, the link score of every pair is read from NVML
(the common PCIe ancestor, NVLinks direct or through NVSwitch) as Go HAMi's plugin scores
it, and written with the register value as ``hami.io/node-nvidia-score`` in Go HAMi's
JSON form, so either scheduler can place ``topology-aware`` pods by it.

Details: each enumeration also reads what the DRA mode publishes as attributes (product
name, architecture, compute capability, driver and CUDA driver versions, PCI address and
PCIe root complex from sysfs; ``_nvml_details``); what NVML does not support is left out.

MIG (protocol.md §10, docs/node.md "MIG GPUs"): with ``operating_mode: mig`` a GPU whose
MIG mode is on registers as Go HAMi 2.10's plugin registers it: mode ``mig``, the allowed
GPU instance profiles NVML offers with their legal placements, as many slots as the largest
profile allows instances; Allocate makes the reserved instance (``mig_allocate``,
``mig_instances``) and answers with its MIG UUID. A GPU not in MIG mode, or with no allowed
profile, is not registered then; in ``hami-core`` mode a GPU in MIG mode is not registered
(HAMi-core cannot share it). MIG mode itself is never changed here.

MPS (docs/node.md "MPS"): with ``operating_mode: mps`` the GPUs register with mode ``mps``
(JSON form), the agent runs or attaches to the MPS control daemon (a GPU is reported
unhealthy while none answers), and Allocate answers with MPS's client limits instead of
HAMi-core's (``hami.backends.mps``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from hami.backends import _nvml, health
from hami.backends._nvml_details import read_details, read_system
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
from hami.backends.hamicore import (
    HamiCorePaths,
    hamicore_admin_allocation,
    hamicore_allocation,
)
from hami.backends.mig_allocate import active_pods, mig_allocation, refuse_mig_reservation
from hami.backends.mig_instances import MigInstances
from hami.backends.mig_ledger import MigLedger
from hami.backends.mps import MpsDaemon, MpsSettings, mps_allocation
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
    "operating_mode",
    "mig_state_file",
    "mps",
}
HAMI_CORE = "hami-core"
MIG = "mig"
MPS = "mps"
OPERATING_MODES = (HAMI_CORE, MIG, MPS)


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
        self.operating_mode = _operating_mode(options.get("operating_mode", HAMI_CORE))
        self.mig_allowlist = _mig_allowlist(
            options.get("mig_profile_allowlist", []),
            self.settings.register_format if self.operating_mode == MIG else register.JSON,
        )
        if self.operating_mode == MIG and not self.mig_allowlist:
            raise BackendError(
                "nvidia: operating_mode mig needs mig_profile_allowlist (the profiles the "
                'GPUs in MIG mode offer; docs/node.md "MIG GPUs")'
            )
        if self.operating_mode == MPS and self.settings.register_format != register.JSON:
            raise BackendError(
                "nvidia: operating_mode mps needs register_format: json (the register's "
                "mode field, which keeps pods that ask for HAMi-core off MPS GPUs and sends "
                "those that ask for MPS to them, travels only in the JSON form)"
            )
        mps_settings = MpsSettings.from_option(options.get("mps"))
        self.mps = MpsDaemon(mps_settings) if self.operating_mode == MPS else None
        # mig: NVML makes instances; mps: the daemon is asked whether it answers
        self.allocate_does_io = self.operating_mode in (MIG, MPS)
        state_file = options.get(
            "mig_state_file",
            os.path.join(os.path.dirname(self.paths.containers_dir), "hami-mig-instances.json"),
        )
        self.mig = MigInstances(self._start, MigLedger(str(state_file)))
        self._mig_held = len(self.mig.ledger)  # for the "all removed" line in hami-core mode
        # hami.io/node-nvidia-score for the GPUs it was computed for (topology is fixed:
        # computed again only when the set of GPUs changes)
        self._scored: tuple[str, ...] | None = None
        self._score_value: str | None = None
        self._nvml = nvml
        self._init_lock = threading.Lock()
        self._started = False
        self._unhealthy: dict[str, str] = {}  # uuid -> cause (hami.backends.health)
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
        if self.mps is not None:
            await asyncio.to_thread(self.mps.stop)  # only a daemon this agent started
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
        system = read_system(nvml)  # driver and CUDA versions, for every GPU's details
        devices = [d for d in (self._read(nvml, index, system) for index in range(count)) if d]
        devices.sort(key=lambda d: d.index)
        if self.topology_score:
            self._score_topology(nvml, devices)
        if self.mps is not None and devices and self.mps.ensure() is not None:
            # without a daemon a container's CUDA runs without MPS, unlimited: nothing new
            # goes to these GPUs until it answers (next enumeration)
            devices = [
                d
                if not d.healthy
                else dataclasses.replace(d, healthy=False, unhealthy_reason=health.MPS_DAEMON_DOWN)
                for d in devices
            ]
        return devices

    def to_node_devices(self, devices: Sequence[Device]) -> list[register.NodeDevice]:
        """As every backend registers them; on an mps node with mode ``mps``, as Go HAMi's
        plugin registers its operating mode."""
        out = super().to_node_devices(devices)
        if self.operating_mode != MPS:
            return out
        return [d if d.mig_profiles else dataclasses.replace(d, mode=MPS) for d in out]

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

    def _read(self, nvml: Any, index: int, system: tuple[str | None, str | None]) -> Device | None:
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
        if self._skipped_for_mode(mig_enabled(nvml, handle), index, uuid):
            return None
        if self.operating_mode == MIG:
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
            unhealthy_reason=self._unhealthy.get(uuid, ""),
            mig=mig,
            details=read_details(
                nvml, handle, name=name, bus_id=bus_id, sysfs_root=self.sysfs_root, system=system
            ),
        )
        self._by_index[index] = device
        return device

    def _skipped_for_mode(self, in_mig_mode: bool, index: int, uuid: str) -> bool:
        """A GPU the operating mode cannot serve is not registered: one in MIG mode on a
        hami-core node, one not in MIG mode on a mig node. Said at each enumeration."""
        if in_mig_mode == (self.operating_mode == MIG):
            return False
        if in_mig_mode:
            sharer = "MPS mode" if self.operating_mode == MPS else "HAMi-core"
            hint = (
                f"{sharer} cannot share a GPU in MIG mode: set operating_mode: mig (with "
                f"mig_profile_allowlist) or disable MIG (nvidia-smi -i {index} -mig 0)"
            )
        else:
            hint = (
                "operating_mode is mig and this GPU is not in MIG mode: enable it "
                f"(nvidia-smi -i {index} -mig 1, then reset the GPU) or set "
                "operating_mode: hami-core"
            )
        log.warning("nvidia.device_skipped_for_mode", index=index, uuid=uuid, hint=hint)
        return True

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
        cause = self._unhealthy.setdefault(uuid, health.NVML_UNREADABLE)
        if known is not None and known.uuid == uuid:
            return dataclasses.replace(known, healthy=False, unhealthy_reason=cause)
        return Device(uuid, index, "NVIDIA-unknown", 0, 0, healthy=False, unhealthy_reason=cause)

    # Allocation

    def allocate(self, request: AllocationRequest) -> ContainerAllocation:
        if self.operating_mode == MIG:
            return mig_allocation(request, self.mig)  # in a worker thread: allocate_does_io
        refuse_mig_reservation(request, self.operating_mode)
        if self.mps is not None:
            problem = self.mps.check()  # in a worker thread: allocate_does_io
            if problem is not None:
                raise BackendError(
                    f"this node shares its GPUs through MPS and {problem}; without the daemon "
                    "the container would run without any limit, so it is refused (the agent "
                    "checks, and with mps.daemon: start starts, the daemon at each "
                    'enumeration; docs/node.md "MPS")'
                )
            return mps_allocation(
                request, self.mps.settings, priority_resource=self.priority_resource
            )
        return hamicore_allocation(request, self.paths, priority_resource=self.priority_resource)

    def admin_allocation(self, request: AllocationRequest) -> ContainerAllocation:
        # the physical GPUs, in MIG mode too: a monitor sees every instance on them
        return hamicore_admin_allocation(request)

    def wants_pod_reconcile(self) -> bool:
        """In mig mode always; in the other modes while instances made in mig mode remain."""
        return self.operating_mode == MIG or len(self.mig.ledger) > 0

    async def reconcile_pods(self, pods: Sequence[Mapping[str, Any]]) -> None:
        """Destroy the MIG instances made for pods no longer on the node."""
        if not self.wants_pod_reconcile():
            return
        kept = await asyncio.to_thread(self.mig.reconcile, active_pods(pods))
        held = len(self.mig.ledger)
        if self.operating_mode != MIG and held:
            log.warning(
                "nvidia.mig_instances_remain",
                instances=held,
                hint=f"operating_mode is {self.operating_mode}: the MIG instances made for "
                "pods still on this node are removed when those pods go; disable MIG only "
                "after that",
                kept=kept,
            )
        elif self.operating_mode != MIG and self._mig_held:
            log.info(
                "nvidia.mig_instances_cleared",
                hint="no MIG instance made by this agent is left: MIG mode can be disabled "
                "(nvidia-smi -i <index> -mig 0)",
            )
        self._mig_held = held

    # Health

    async def watch_health(self, devices: Sequence[Device], on_change: HealthCallback) -> None:
        if not self.health_checks:
            log.info("nvidia.health_checks_disabled")
            return
        loop = asyncio.get_running_loop()
        reported: set[str] = set()

        def mark_unhealthy(uuid: str, reason: str, cause: str) -> None:  # in the worker thread
            if uuid in reported:
                return
            reported.add(uuid)
            self._unhealthy.setdefault(uuid, cause)  # the first cause is the one to fix
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


def _operating_mode(value: Any) -> str:
    if value not in OPERATING_MODES:
        raise BackendError(
            f"nvidia: option 'operating_mode' must be one of {', '.join(OPERATING_MODES)} "
            f"(HAMi-core shares, MIG instances, MPS clients), got {value!r}"
        )
    return str(value)


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
