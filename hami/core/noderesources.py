"""A node's CPU and memory: what its pods request against what it can allocate.

Pure. kube-scheduler checks CPU and memory (its NodeResourcesFit filter) before it asks the
extender, so the scheduler role never needed them; a placement that ignores them strands
GPUs on nodes whose CPU or memory is used up. ``hami simulate`` keeps them here, read from
the Node's ``status.allocatable`` and the pods' container requests; under the ``defrag``
node policy the scheduler role keeps the same numbers from its watches (``RoomLedger``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.requests import parse_quantity
from hami.protocol.objects import pod_containers

MIB = 1024 * 1024


@dataclass(slots=True)
class NodeResources:
    """Allocatable and requested CPU (millicores) and memory (MiB) of one node."""

    cpu_milli: int
    memory_mib: int
    used_cpu_milli: int = 0
    used_memory_mib: int = 0

    @property
    def free_cpu_milli(self) -> int:
        return self.cpu_milli - self.used_cpu_milli

    @property
    def free_memory_mib(self) -> int:
        return self.memory_mib - self.used_memory_mib

    def fits(self, cpu_milli: int, memory_mib: int) -> bool:
        return cpu_milli <= self.free_cpu_milli and memory_mib <= self.free_memory_mib

    def take(self, cpu_milli: int, memory_mib: int, sign: int = 1) -> None:
        self.used_cpu_milli += sign * cpu_milli
        self.used_memory_mib += sign * memory_mib

    def least_allocated(self, cpu_milli: int, memory_mib: int) -> float:
        """kube-scheduler's default node score (NodeResourcesFit LeastAllocated, CPU and
        memory weighted equally), after the pod: the free share, higher is emptier."""
        cpu = (self.free_cpu_milli - cpu_milli) / self.cpu_milli if self.cpu_milli else 0.0
        mem = (self.free_memory_mib - memory_mib) / self.memory_mib if self.memory_mib else 0.0
        return (cpu + mem) / 2


def node_allocatable(node: Mapping[str, Any]) -> NodeResources:
    """CPU and memory from a Node's ``status.allocatable`` (0 when absent or unreadable)."""
    status = node.get("status")
    alloc = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(alloc, Mapping):
        alloc = {}
    return NodeResources(_milli(alloc.get("cpu")), _mib(alloc.get("memory")))


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU millicores, memory MiB) a pod requests: the app containers summed, or the
    largest init container when that is more (Kubernetes' effective request)."""
    containers, init_count = pod_containers(pod)
    app_cpu = app_mem = init_cpu = init_mem = 0
    for position, container in enumerate(containers):
        resources = container.get("resources")
        requests = resources.get("requests") if isinstance(resources, Mapping) else None
        if not isinstance(requests, Mapping):
            requests = {}
        cpu, mem = _milli(requests.get("cpu")), _mib(requests.get("memory"))
        if position < init_count:
            init_cpu, init_mem = max(init_cpu, cpu), max(init_mem, mem)
        else:
            app_cpu, app_mem = app_cpu + cpu, app_mem + mem
    return max(app_cpu, init_cpu), max(app_mem, init_mem)


def _milli(value: Any) -> int:
    if value is None:
        return 0
    text = str(value)
    try:
        if text.endswith("m"):
            return parse_quantity(text[:-1])
        return parse_quantity(text) * 1000
    except (ValueError, ArithmeticError):
        return 0


def _mib(value: Any) -> int:
    if value is None:
        return 0
    try:
        return parse_quantity(str(value)) // MIB
    except (ValueError, ArithmeticError):
        return 0


FINISHED = ("Succeeded", "Failed")


class RoomLedger:
    """Free CPU and memory per node, kept from watch events: the Node's allocatable minus
    the requests of the pods bound to it that have not finished (what kube-scheduler's
    NodeResourcesFit counts, without its assumed pods: a pod counts once it is bound).

    Each method returns the nodes whose free room changed.
    """

    def __init__(self) -> None:
        self._allocatable: dict[str, tuple[int, int]] = {}
        self._requested: dict[str, list[int]] = {}  # node -> [CPU, memory] of its pods
        self._pods: dict[str, tuple[str, int, int]] = {}  # pod key -> (node, CPU, memory)

    def set_node(self, name: str, node: Mapping[str, Any]) -> list[str]:
        resources = node_allocatable(node)
        allocatable = (resources.cpu_milli, resources.memory_mib)
        if self._allocatable.get(name) == allocatable:
            return []
        self._allocatable[name] = allocatable
        return [name]

    def drop_node(self, name: str) -> None:
        self._allocatable.pop(name, None)

    def upsert_pod(self, key: str, pod: Mapping[str, Any]) -> list[str]:
        spec = pod.get("spec")
        status = pod.get("status")
        node = spec.get("nodeName") if isinstance(spec, Mapping) else None
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if not isinstance(node, str) or not node or phase in FINISHED:
            return self.delete_pod(key)
        cpu, memory = pod_requests(pod)
        entry = (node, cpu, memory)
        old = self._pods.get(key)
        if old == entry:
            return []
        changed = self.delete_pod(key)
        self._pods[key] = entry
        totals = self._requested.setdefault(node, [0, 0])
        totals[0] += cpu
        totals[1] += memory
        return [*changed, node] if node not in changed else changed

    def delete_pod(self, key: str) -> list[str]:
        old = self._pods.pop(key, None)
        if old is None:
            return []
        node, cpu, memory = old
        totals = self._requested[node]
        totals[0] -= cpu
        totals[1] -= memory
        if totals == [0, 0]:
            del self._requested[node]
        return [node]

    def free(self, name: str) -> tuple[int, int] | None:
        """(CPU millicores, memory MiB) not requested; None: the Node is not known."""
        allocatable = self._allocatable.get(name)
        if allocatable is None:
            return None
        cpu, memory = self._requested.get(name, (0, 0))
        return allocatable[0] - cpu, allocatable[1] - memory
