"""One simulated cluster: the scheduler's ``Cluster`` fed trace nodes, asked about pods one
at a time, each pod placed (``decide`` + ``reserve``, as filter does) before the next is
looked at.

Nothing here is a policy of its own. A GPU pod becomes the Pod JSON a user would write
(``nvidia.com/*`` limits, CPU and memory requests, the type selector annotation), is read
with ``parse_pod`` and placed by ``Cluster.decide`` among the nodes whose CPU and memory
still cover it: that is kube-scheduler's NodeResourcesFit filter, which runs before it
asks the extender. A CPU-only pod never reaches the extender (it asks for no managed
resource); it goes where kube-scheduler's default score (LeastAllocated) puts it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hami.backends.nvidia_names import NVIDIA_ALLOCATED, NVIDIA_RESOURCES, NVIDIA_TO_ALLOCATE
from hami.core.cluster import Cluster
from hami.core.defragpolicy import DEFRAG
from hami.core.fit import BINPACK, SPREAD
from hami.core.noderesources import NodeResources, RoomLedger, node_allocatable, pod_requests
from hami.core.requests import DeviceKind, parse_pod
from hami.protocol import handshake
from hami.protocol.objects import metadata_of, pod_key
from hami.simulate.trace import TraceNode, TracePod

NVIDIA = DeviceKind("nvidia", "NVIDIA", NVIDIA_RESOURCES, NVIDIA_ALLOCATED, NVIDIA_TO_ALLOCATE)
# The simulated clock: nodes heartbeat just before it, so every type is available.
NOW = datetime(2026, 1, 1, tzinfo=UTC)
NAMESPACE = "sim"
MEMORY_PERCENTAGE = "nvidia.com/gpumem-percentage"
CORES = "nvidia.com/gpucores"
# Device memory per openb model. Shares are asked as a percentage of the device's memory,
# so the size changes no fit; it only makes the register values realistic. G1-G3 are
# undisclosed models (32 GiB assumed).
GPU_MEMORY_MIB = {"P100": 16384, "T4": 15360, "V100M16": 16384, "V100M32": 32768, "A10": 23028}
DEFAULT_GPU_MEMORY_MIB = 32768
# HAMi's per-GPU share cap (nvidia deviceSplitCount) is 10, but openb shares go down to 50
# milli (20 per GPU): the simulator's default cap does not bind; 10 is reported beside it.
DEFAULT_SPLIT_COUNT = 100
HAMI_SPLIT_COUNT = 10


@dataclass(frozen=True, slots=True)
class Policy:
    node: str  # Cluster node_policy: binpack | spread | defrag
    device: str  # Cluster device_policy (hami.io/gpu-scheduler-policy words)

    @property
    def label(self) -> str:
        return f"node-{self.node}/gpu-{self.device}"

    @classmethod
    def parse(cls, text: str) -> Policy:
        """``binpack/spread``: node policy, then device policy."""
        node, _, device = text.partition("/")
        return cls(node.strip() or BINPACK, device.strip() or SPREAD)


DEFAULT_POLICY = Policy(BINPACK, SPREAD)  # the scheduler's defaults (= Go HAMi's)
CLASSIC_POLICIES = tuple(Policy(n, d) for n in (BINPACK, SPREAD) for d in (BINPACK, SPREAD))
# the recommended policy (docs/simulate.md): what ``hami simulate`` runs by default
DEFRAG_POLICY = Policy(DEFRAG, BINPACK)


@dataclass(frozen=True, slots=True)
class Placement:
    pod: str
    node: str | None
    devices: tuple[tuple[int, int], ...]  # (GPU index on the node, milli given)
    demand: int  # requested GPU milli
    arrived: int  # requested GPU milli of every pod so far, this one included
    used: int  # GPU milli allocated after this pod

    def as_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "node": self.node,
            "devices": [{"index": i, "milli": m} for i, m in self.devices],
        }


def node_object(node: TraceNode, split_count: int) -> dict[str, Any]:
    """The Node a HAMi node agent and kubelet would show for a trace node."""
    allocatable = {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi"}
    annotations: dict[str, str] = {}
    if node.gpus:
        memory = GPU_MEMORY_MIB.get(node.model, DEFAULT_GPU_MEMORY_MIB)
        annotations[f"hami.io/node-{NVIDIA.type_word}-register"] = "".join(
            f"{gpu_uuid(node.name, i)},{split_count},{memory},100,{node.model},0,true:"
            for i in range(node.gpus)
        )
        annotations[f"hami.io/node-handshake-{NVIDIA.type_word}"] = handshake.reported(
            NOW - timedelta(seconds=1)
        )
        allocatable[NVIDIA.resources.count] = str(node.gpus * split_count)
    return {
        "metadata": {"name": node.name, "resourceVersion": "1", "annotations": annotations},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def gpu_uuid(node: str, index: int) -> str:
    return f"{node}-gpu{index}"


def pod_object(pod: TracePod, name: str | None = None) -> dict[str, Any]:
    """The Pod a user would submit for a trace row (HAMi's resource names); ``name``
    overrides the row's (trace names may repeat, pods' may not)."""
    name = name or pod.name
    limits: dict[str, str] = {}
    if pod.num_gpu:
        # a share asks for the same fraction of cores and of memory; 1000 milli is the
        # whole GPU (100 % cores: exclusive)
        percent = math.ceil(pod.gpu_milli / 10)
        limits[NVIDIA.resources.count] = str(pod.num_gpu)
        limits[CORES] = str(percent)
        limits[MEMORY_PERCENTAGE] = str(percent)
    annotations = {}
    if pod.gpu_spec and pod.num_gpu:
        annotations[NVIDIA.annotation("use-type")] = ",".join(pod.gpu_spec)
    container = {
        "name": "main",
        "resources": {
            "limits": limits,
            "requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"},
        },
    }
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": name,
            "annotations": annotations,
        },
        "spec": {"containers": [container]},
        "status": {"phase": "Pending"},
    }


@dataclass
class Simulator:
    """A cluster under one policy; ``place`` one pod at a time. Built from trace nodes
    (``nodes``), or from Node and Pod objects, a live cluster's (``from_objects``)."""

    nodes: Sequence[TraceNode]
    policy: Policy = DEFAULT_POLICY
    split_count: int = DEFAULT_SPLIT_COUNT
    cluster: Cluster = field(init=False)
    resources: dict[str, NodeResources] = field(init=False)
    capacity: int = field(init=False)
    arrived: int = 0
    used: int = 0
    decided: int = 0  # Cluster.decide calls
    rows: int = 0  # pods placed so far: a row number makes every pod's name its own
    # pods without devices under the defrag policy: "hami" = routed to HAMi's scheduler,
    # which places them where they strand the least GPU; "kube" = kube-scheduler's
    # default score (LeastAllocated) places them, as it does under binpack and spread
    cpu_pods: str = "hami"

    def __post_init__(self) -> None:
        objects = [node_object(node, self.split_count) for node in self.nodes]
        for name, errors in self._load(objects, (), NOW).items():
            raise ValueError(f"node {name}: {errors}")

    @classmethod
    def from_objects(
        cls,
        nodes: Sequence[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        now: datetime,
        policy: Policy = DEFAULT_POLICY,
        *,
        cpu_pods: str = "hami",
    ) -> Simulator:
        """The start state of a live cluster: its Nodes (register annotations,
        heartbeats, allocatable CPU and memory) and its pods, the bound unfinished ones
        holding their devices, CPU and memory, as the scheduler reads them at ``now``.
        ``arrived`` and ``used`` start at the GPU milli the running pods hold."""
        sim = cls((), policy, cpu_pods=cpu_pods)
        sim._load(nodes, pods, now)
        sim.arrived = sim.used = sim.held_milli()
        return sim

    def _load(
        self, nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], now: datetime
    ) -> dict[str, list[str]]:
        """Start from these Nodes and pods; returns each node's register errors (a node
        with one has no devices)."""
        self.cluster = Cluster(
            [NVIDIA], node_policy=self.policy.node, device_policy=self.policy.device
        )
        rooms = RoomLedger()
        self._names: list[str] = []
        failed: dict[str, list[str]] = {}
        for obj in nodes:
            name = str(metadata_of(obj).get("name") or "")
            errors, _ = self.cluster.upsert_node(obj, now)
            if errors:
                failed[name] = errors
            rooms.set_node(name, obj)
            self._names.append(name)
        for pod in pods:
            key = pod_key(pod)
            rooms.upsert_pod(key, pod)
            self.cluster.upsert_pod(pod, now)
        self.resources = {}
        for name, obj in zip(self._names, nodes, strict=True):
            resources = self.resources[name] = node_allocatable(obj)
            free = rooms.free(name) or (resources.cpu_milli, resources.memory_mib)
            resources.take(resources.cpu_milli - free[0], resources.memory_mib - free[1])
        # a device's index in placements: its index on its node, as registered
        self._index = {
            uuid: device.index
            for name in self._names
            for uuid, device in self.cluster.nodes[name].devices.items()
        }
        self.capacity = len(self._index) * 1000
        self._position = {name: i for i, name in enumerate(self._names)}
        # free CPU and memory by node position, beside ``resources``: the one list scan
        # per pod (kube-scheduler's NodeResourcesFit) stays a comprehension over ints
        self._free_cpu = [self.resources[n].free_cpu_milli for n in self._names]
        self._free_mem = [self.resources[n].free_memory_mib for n in self._names]
        for name, cpu, memory in zip(self._names, self._free_cpu, self._free_mem, strict=True):
            self.cluster.set_node_room(name, cpu, memory)
        return failed

    def held_milli(self) -> int:
        """GPU milli held on the devices now: per device the larger of its cores and
        memory shares held, at most 1000."""
        total = 0
        for name in self._names:
            for device in self.cluster.nodes[name].devices.values():
                if not device.used:
                    continue
                cores = device.used_cores * 10 if device.total_cores else 0
                memory = (
                    device.used_memory * 1000 // device.total_memory if device.total_memory else 0
                )
                total += min(1000, max(cores, memory))
        return total

    def place(self, pod: TracePod) -> Placement:
        self.rows += 1
        name = f"{self.rows}-{pod.name}"
        obj = pod_object(pod, name)
        cpu, memory = pod_requests(obj)
        fitting = [
            n
            for n, free_cpu, free_mem in zip(
                self._names, self._free_cpu, self._free_mem, strict=True
            )
            if free_cpu >= cpu and free_mem >= memory
        ]
        self.arrived += pod.demand
        node: str | None = None
        devices: tuple[tuple[int, int], ...] = ()
        request = parse_pod(obj, [NVIDIA])
        if request is None:
            if self.policy.node == DEFRAG and self.cpu_pods == "hami":
                node = self.cluster.decide_room_only((cpu, memory), fitting)
                node = node or self._cpu_only(fitting, cpu, memory)
            else:
                node = self._cpu_only(fitting, cpu, memory)
        elif fitting:
            self.decided += 1
            candidates = None if len(fitting) == len(self._names) else fitting
            decision = self.cluster.decide(request, candidates, pod_room=(cpu, memory))
            if decision.node is not None and decision.fit is not None:
                node = decision.node
                self.cluster.reserve(f"{NAMESPACE}/{name}", name, node, decision.fit)
                milli = pod.gpu_milli if pod.num_gpu == 1 else 1000
                devices = tuple(
                    (self._index[d.uuid], milli)
                    for per_container in decision.fit.assignment.values()
                    for container in per_container
                    for d in container
                )
                self.used += sum(m for _, m in devices)
        if node is not None:
            self.resources[node].take(cpu, memory)
            at = self._position[node]
            self._free_cpu[at] -= cpu
            self._free_mem[at] -= memory
            self.cluster.set_node_room(node, self._free_cpu[at], self._free_mem[at])
        return Placement(pod.name, node, devices, pod.demand, self.arrived, self.used)

    def _cpu_only(self, fitting: Iterable[str], cpu: int, memory: int) -> str | None:
        best: tuple[float, str] | None = None
        for name in fitting:
            key = (-self.resources[name].least_allocated(cpu, memory), name)
            if best is None or key < best:
                best = key
        return None if best is None else best[1]

    def unallocated_percent(self) -> float:
        return unallocated(self.used, self.capacity)


def unallocated(used: int, capacity: int) -> float:
    """The paper's metric: 100 - 100 * used / (GPUs * 1000)."""
    return 100.0 - 100.0 * used / capacity if capacity else 0.0


def simulate(
    nodes: Sequence[TraceNode],
    pods: Iterable[TracePod],
    *,
    policy: Policy = DEFAULT_POLICY,
    split_count: int = DEFAULT_SPLIT_COUNT,
) -> list[Placement]:
    sim = Simulator(nodes, policy, split_count)
    return [sim.place(pod) for pod in pods]
