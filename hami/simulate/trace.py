"""The openb trace formats (alibaba/clusterdata ``cluster-trace-gpu-v2023``) and the
paper's arrival model.

Nodes: ``sn,cpu_milli,memory_mib,gpu,model``. Pods: ``name,cpu_milli,memory_mib,num_gpu,
gpu_milli[,gpu_spec,...]``; empty cells read as 0 / no constraint (the multi-GPU variants
have no ``gpu_spec`` column at all). Reading takes text, not paths: the caller does I/O.
"""

from __future__ import annotations

import csv
import io
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

DEFAULT_TUNE = 1.3


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU: < 1000 is a share of one GPU
    gpu_spec: tuple[str, ...] = ()  # allowed models; empty: any

    @property
    def demand(self) -> int:
        """Requested GPU milli (what ``arrived`` adds up)."""
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0


class TraceError(ValueError):
    """A trace row that cannot be read; the message names the row."""


def _int(row: dict[str, str], column: str, where: str) -> int:
    text = (row.get(column) or "").strip()
    if not text:
        return 0
    try:
        return int(float(text))
    except ValueError:
        raise TraceError(f"{where}: {column}={text!r} is not a number") from None


def read_nodes(text: str) -> list[TraceNode]:
    nodes = []
    for number, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        where = f"node row {number}"
        name = (row.get("sn") or row.get("name") or "").strip()
        if not name:
            raise TraceError(f"{where}: no sn")
        gpus = _int(row, "gpu", where)
        model = (row.get("model") or "").strip()
        if gpus and not model:
            raise TraceError(f"{where}: {gpus} GPUs without a model")
        nodes.append(
            TraceNode(
                name, _int(row, "cpu_milli", where), _int(row, "memory_mib", where), gpus, model
            )
        )
    return nodes


def read_pods(text: str) -> list[TracePod]:
    pods = []
    for number, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        where = f"pod row {number}"
        num_gpu = _int(row, "num_gpu", where)
        gpu_milli = _int(row, "gpu_milli", where)
        if num_gpu and not gpu_milli:
            gpu_milli = 1000  # a count with no share asked: whole GPUs
        if not 0 <= gpu_milli <= 1000 or num_gpu < 0 or (num_gpu > 1 and gpu_milli != 1000):
            raise TraceError(f"{where}: num_gpu={num_gpu} gpu_milli={gpu_milli} unsupported")
        spec = tuple(s.strip() for s in (row.get("gpu_spec") or "").split("|") if s.strip())
        pods.append(
            TracePod(
                (row.get("name") or "").strip() or f"pod-row-{number}",
                _int(row, "cpu_milli", where),
                _int(row, "memory_mib", where),
                num_gpu,
                gpu_milli if num_gpu else 0,
                spec,
            )
        )
    return pods


def gpu_capacity(nodes: Iterable[TraceNode]) -> int:
    """The cluster's GPU milli: 1000 per GPU."""
    return sum(node.gpus for node in nodes) * 1000


def arrivals(
    pods: Sequence[TracePod], capacity: int, *, seed: int, tune: float = DEFAULT_TUNE
) -> list[TracePod]:
    """The paper's arrival model: the trace shuffled with ``seed``, then rows drawn again
    (with the same generator, uniformly, with replacement) until the requested GPU demand
    reaches ``tune`` x capacity; a trace that already asks for more is cut where it
    reaches it. Drawn copies are renamed ``NAME-rN`` so every pod has its own name."""
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    target = tune * capacity
    out: list[TracePod] = []
    demand = 0
    for pod in order:
        if demand >= target:
            return out
        out.append(pod)
        demand += pod.demand
    if not any(pod.demand for pod in pods):
        return out  # nothing asks for a GPU: no draw could reach the target
    draws = 0
    while demand < target:
        draws += 1
        pick = rng.choice(pods)
        out.append(replace(pick, name=f"{pick.name}-r{draws}"))
        demand += pick.demand
    return out
