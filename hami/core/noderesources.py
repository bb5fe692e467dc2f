"""A node's CPU and memory: what its pods request against what it can allocate.

Pure. kube-scheduler checks CPU and memory (its NodeResourcesFit filter) before it asks the
extender, so the scheduler role never needed them; a placement that ignores them strands
GPUs on nodes whose CPU or memory is used up. ``hami simulate`` keeps them here, read from
the Node's ``status.allocatable`` and the pods' container requests, so the same numbers can
feed the scheduler later (issue 21).
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
