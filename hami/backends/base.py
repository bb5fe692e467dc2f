"""What a device backend supplies, and the plain data it exchanges with the roles.

A backend is one vendor's knowledge: its words, resource names and annotation keys, how
to enumerate devices, and what a container receives from kubelet's ``Allocate``. The
roles do all Kubernetes and gRPC I/O; a backend only enumerates hardware and answers
with plain data, so most of it is testable without a cluster.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hami.backends.details import DeviceDetails
from hami.core.requests import NO_ANNOTATIONS, ContainerEnv, NodeReader, PodAnnotator
from hami.protocol import (
    ContainerDevice,
    NodeDevice,
    decode_node_devices,
    handshake,
    keys,
    register,
)
from hami.protocol.mig import MIG_MODE, MigProfile
from hami.protocol.objects import annotations_of
from hami.protocol.resources import ResourceNames as ResourceNames  # re-exported: its old home


class BackendError(Exception):
    """A backend cannot enumerate or serve its devices; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class MigCapability:
    """A GPU in MIG mode: the allowed GPU instance profiles NVML offers on it, and the most
    instances any of them allows (what the register's count says, as Go HAMi's plugin)."""

    profiles: tuple[MigProfile, ...]
    instances: int


@dataclass(frozen=True, slots=True)
class Device:
    """One physical device as enumeration finds it, before scaling and splitting."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    numa: int = 0
    healthy: bool = True
    mig: MigCapability | None = None  # registered as a MIG GPU (protocol.md §10)
    # product, architecture, versions, PCIe place: published as DRA attributes only
    details: DeviceDetails = field(default_factory=DeviceDetails)
    # why it is unhealthy, one word (``xid-79``; hami.backends.health): the DRA taint value
    unhealthy_reason: str = ""


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """Settings every backend shares; ``options`` holds the backend's own keys."""

    split_count: int = 10
    memory_scaling: float = 1.0
    core_scaling: float = 1.0
    resources: ResourceNames | None = None  # None: the backend's defaults
    options: Mapping[str, Any] = field(default_factory=dict)
    # seed (the 7-field form) or json (Go HAMi >= 2.8 reads NVIDIA only as JSON)
    register_format: str = register.SEED


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceNode:
    host_path: str
    container_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """The answer to kubelet for one container, plus host directories to create first."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mount] = ()
    devices: Sequence[DeviceNode] = ()
    host_dirs: Sequence[str] = ()  # created with mode 0777 before answering
    # pod annotations written with the answer (NVIDIA MIG: the completed reservations); a
    # later container of the same Allocate sees them in AllocationRequest.pod_annotations
    pod_annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AllocationRequest:
    """Everything a backend may need to answer ``Allocate`` for one container."""

    pod_namespace: str
    pod_name: str
    pod_uid: str
    container_name: str
    container_index: int  # the container's position in the pod: init containers first
    devices: Sequence[ContainerDevice]
    node_devices: Sequence[Device]  # what this node enumerated, to map uuid -> index
    container_env: Mapping[str, str] = field(default_factory=dict)
    container_limits: Mapping[str, Any] = field(default_factory=dict)  # resources.limits
    pod_annotations: Mapping[str, str] = field(default_factory=dict)


HealthCallback = Callable[[str, bool], None]
"""Called with (uuid, healthy) when a device's health changes."""


class Backend(abc.ABC):
    """Base class for a device backend, found through the ``hami.backends`` entry points."""

    # Subclasses set these as class attributes; an instance may override them from options.
    type_word: str  # lower case, in node annotation keys: nvidia, mlu
    vendor_word: str  # upper case, in pod device values: NVIDIA, MLU
    default_resources: ResourceNames
    allocated_key: str  # pod annotation with the lasting decision
    to_allocate_key: str  # pod annotation the node consumes entry by entry
    # Core percent a request without a cores resource asks for (the scheduler's default):
    # 0 = no core share (NVIDIA), 100 = the whole device (Cambricon MLU).
    default_cores: int = 0
    # The option keys a config section may carry besides the shared ones (split_count, ...);
    # config reports any other key as a typo. None: the backend checks its options itself.
    known_options: frozenset[str] | None = None
    # A container limit passed to the device runtime as the task priority (not a device
    # count): managed by hami, ignored by kube-scheduler. None: the backend has none.
    priority_resource: str | None = None
    # The words in the selector annotations' keys, (type, uuid), where Go HAMi's differ from
    # the count resource's (DeviceKind.selector_words); empty: derived from it.
    selector_words: tuple[str, ...] = ()
    # Whether the cores resource names the cores of all of a container's devices together
    # (DeviceKind.cores_per_container: Iluvatar, Moore Threads) rather than of each one.
    cores_per_container: bool = False
    # The same for the memory resource (DeviceKind.memory_per_container: Moore Threads).
    memory_per_container: bool = False
    # Whether binding a pod of this type takes the node lock (DeviceKind.node_lock): False
    # where Go HAMi's LockNode for the type does nothing and the node's plug-in releases none.
    node_lock: bool = True
    # The annotation of Go HAMi's own node lock for the type (DeviceKind.vendor_lock), taken
    # by a bind and removed by the vendor's plug-in after Allocate; "" where Go takes none.
    vendor_lock: str = ""

    def __init__(self, settings: BackendSettings | None = None) -> None:
        self.settings = settings or BackendSettings()
        if self.settings.split_count < 1:
            raise BackendError(f"{self.type_word}: split_count must be >= 1")
        if self.settings.register_format not in register.REGISTER_FORMATS:
            raise BackendError(
                f"{self.type_word}: register_format must be seed or json, "
                f"got {self.settings.register_format!r}"
            )
        self.resources = self.settings.resources or self.default_resources

    @property
    def register_key(self) -> str:
        return keys.node_register(self.type_word)

    @property
    def handshake_key(self) -> str:
        return keys.node_handshake(self.type_word)

    @property
    def handshake_keys(self) -> tuple[str, ...]:
        """Every key the heartbeat goes to: NVIDIA also writes Go HAMi's own key."""
        return keys.handshake_keys(self.type_word)

    # Scheduler side: how a node's devices are read and what a decision adds to the pod

    def devices_from_node(self, node: Mapping[str, Any]) -> list[NodeDevice] | None:
        """This type's devices on a Node object (a dict), as Go HAMi's ``GetNodeDevices``
        reads them; None when the node has none. The default decodes the register annotation;
        capacity-based vendors read ``status.capacity``. Pure; raises ProtocolError when what
        it reads is malformed."""
        value = annotations_of(node).get(self.register_key)
        return None if value is None else decode_node_devices(value)

    @property
    def node_reader(self) -> NodeReader | None:
        """``devices_from_node`` when this backend reads nodes its own way, else None: the
        scheduler then reads only the register value, decoding it only when it changes."""
        if type(self).devices_from_node is Backend.devices_from_node:
            return None
        return self.devices_from_node

    def pod_annotations(
        self,
        containers: Sequence[Sequence[ContainerDevice]],
        index_of: Callable[[str], int],
        annotations: Mapping[str, str] = NO_ANNOTATIONS,
    ) -> dict[str, str]:
        """Pod annotations written beside the devices values of a decision that gives this
        type ``containers`` (per container; ``index_of(uuid)`` is a device's index on its
        node; ``annotations`` the pod's own), as Go HAMi's ``PatchAnnotations`` adds them.
        Pure; the default adds none."""
        return {}

    @property
    def pod_annotator(self) -> PodAnnotator | None:
        """``pod_annotations`` when this backend adds any, else None."""
        if type(self).pod_annotations is Backend.pod_annotations:
            return None
        return self.pod_annotations

    def container_env(self, container: Mapping[str, Any]) -> dict[str, str]:
        """Environment variables the webhook sets in a container that names this type's
        count resource in its limits (the container as a dict), unless the container sets
        them itself, as Go HAMi's webhook adds them (Iluvatar: ``SOL_CONTINER_NAME``). Pure;
        the default adds none."""
        return {}

    @property
    def env_writer(self) -> ContainerEnv | None:
        """``container_env`` when this backend adds any, else None."""
        if type(self).container_env is Backend.container_env:
            return None
        return self.container_env

    @abc.abstractmethod
    async def enumerate(self) -> list[Device]:
        """The devices on this machine, ordered by index. Raises BackendError."""

    def core_limit(self, device: Device) -> int:
        """Schedulable percent of compute before scaling; 0 means no core limiter."""
        return 100

    def to_node_devices(self, devices: Sequence[Device]) -> list[NodeDevice]:
        """Apply split count and scaling: what the node registers for the scheduler. A MIG
        GPU registers as Go HAMi's plugin registers it: mode ``mig``, its profiles, as many
        slots as instances and all its cores (protocol.md §10)."""
        out: list[NodeDevice] = []
        for d in sorted(devices, key=lambda d: d.index):
            node = NodeDevice(
                uuid=d.uuid,
                count=self.settings.split_count,
                memory=int(d.memory_mib * self.settings.memory_scaling),
                cores=int(self.core_limit(d) * self.settings.core_scaling),
                model=d.model,
                numa=d.numa,
                healthy=d.healthy,
                index=d.index,
            )
            if d.mig is not None:
                node = dataclasses.replace(
                    node,
                    count=d.mig.instances,
                    cores=100,
                    mode=MIG_MODE,
                    mig_profiles=d.mig.profiles,
                )
            out.append(node)
        return out

    def register_value(self, node_devices: Sequence[NodeDevice]) -> str:
        """The register annotation's value in the configured ``register_format``."""
        return register.encode_register(node_devices, self.settings.register_format)

    def registration(self, node_devices: Sequence[NodeDevice], now: datetime) -> dict[str, str]:
        """The node annotations one registration writes: the register value and the
        heartbeat under every heartbeat key (protocol.md §1)."""
        annotations = {self.register_key: self.register_value(node_devices)}
        for key in self.handshake_keys:
            annotations[key] = handshake.reported(now)
        return annotations

    def node_annotations(self, devices: Sequence[Device]) -> dict[str, str]:
        """Further Node annotations written with the register value (NVIDIA: the link
        scores ``hami.io/node-nvidia-score``), from what ``enumerate`` found. Pure."""
        return {}

    def capacity_units(self, device: Device) -> dict[str, int]:
        """Further kubelet resources the node agent advertises for ``device`` (name -> units
        of it), each through a device plugin of its own whose Allocate adds nothing: the
        capacities Go HAMi's scheduler reads for vendors it models without a register value
        (Cambricon). Pure; the default advertises none."""
        return {}

    # allocate() blocks on the hardware (NVIDIA MIG mode makes instances): the node agent
    # then calls it in a worker thread
    allocate_does_io: bool = False

    @abc.abstractmethod
    def allocate(self, request: AllocationRequest) -> ContainerAllocation:
        """The container's environment, mounts and device nodes. Pure unless
        ``allocate_does_io``; raises BackendError."""

    def decision_devices(
        self,
        devices: Sequence[ContainerDevice],
        node_devices: Sequence[Device],
        node: str,
        annotations: Mapping[str, str],
    ) -> list[ContainerDevice]:
        """One container's devices from the pod's decision with each device named by its
        uuid on this node (``node``; ``annotations`` the pod's), before they are checked
        and allocated. The default keeps them: a scheduler names devices as registered.
        Cambricon: Go HAMi names cards it reads from kubelet capacity by their position.
        Pure; raises BackendError naming what is wrong with an unreadable name."""
        return list(devices)

    def admin_allocation(self, request: AllocationRequest) -> ContainerAllocation:
        """The answer for a DRA admin-access claim (monitoring, debugging; docs/dra.md
        "Admin access"): ``request.devices`` made visible to the container and nothing
        that limits it or counts it as a tenant of them (no memory or core limits, no
        usage-cache directory). Pure. The default refuses, so a backend that has not said
        which of its edits only give visibility never caps the workloads it would observe."""
        raise BackendError(
            f"the {self.type_word} backend does not prepare admin-access claims "
            "(no admin_allocation)"
        )

    def wants_pod_reconcile(self) -> bool:
        """Whether the node agent should hand it the node's pods now (``reconcile_pods``):
        it holds something made for pods (NVIDIA: MIG instances) to release when they go."""
        return False

    async def reconcile_pods(self, pods: Sequence[Mapping[str, Any]]) -> None:
        """Release what was made for pods not among ``pods`` (every pod bound to the node,
        freshly listed). Called before each Allocate and periodically while
        ``wants_pod_reconcile``; the default has nothing to release."""
        return None

    async def watch_health(self, devices: Sequence[Device], on_change: HealthCallback) -> None:
        """Report health changes until cancelled. The default has no health source."""
        return None

    async def close(self) -> None:
        """Release what enumeration opened (a library handle, a subprocess)."""
        return None
