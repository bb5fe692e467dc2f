"""Shared builders for the scheduler core tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hami.backends.base import ResourceNames
from hami.backends.nvidia_names import NVIDIA_ALLOCATED, NVIDIA_RESOURCES, NVIDIA_TO_ALLOCATE
from hami.core.requests import DeviceKind
from hami.testkit.cluster import limits

NVIDIA = DeviceKind("nvidia", "NVIDIA", NVIDIA_RESOURCES, NVIDIA_ALLOCATED, NVIDIA_TO_ALLOCATE)
MLU = DeviceKind(
    "mlu",
    "MLU",
    ResourceNames(
        count="cambricon.com/vmlu",
        memory="cambricon.com/mlu.smlu.vmemory",
        cores="cambricon.com/mlu.smlu.vcore",
        memory_unit_mib=256,
    ),
    "hami.io/cambricon-mlu-devices-allocated",
    "hami.io/cambricon-mlu-devices-to-allocate",
    default_cores=100,
)
NOW = datetime(2024, 5, 20, 10, 0, 0, tzinfo=UTC)


def gpu(
    name: str = "c",
    count: int | None = 1,
    mem: int | None = None,
    pct: int | None = None,
    cores: int | None = None,
) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits(count, mem=mem, pct=pct, cores=cores)}}


def pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    name: str = "p",
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
    uid: str = "uid-p",
    node_name: str | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def register(
    uuids: list[str],
    *,
    memory: int = 32768,
    cores: int = 100,
    count: int = 10,
    model: str = "NVIDIA-Tesla V100-PCIE-32GB",
    numa: list[int] | None = None,
    healthy: list[bool] | None = None,
) -> str:
    parts = []
    for i, uuid in enumerate(uuids):
        n = numa[i] if numa else 0
        h = "true" if (healthy[i] if healthy else True) else "false"
        parts.append(f"{uuid},{count},{memory},{cores},{model},{n},{h}:")
    return "".join(parts)


def node(
    name: str,
    value: str | None,
    *,
    type_word: str = "nvidia",
    shake: str | None = "Reported_2024-05-20 09:59:00",
    rv: str = "1",
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    annotations: dict[str, str] = dict(extra or {})
    if value is not None:
        annotations[f"hami.io/node-{type_word}-register"] = value
    if shake is not None:
        annotations[f"hami.io/node-handshake-{type_word}"] = shake
    return {"metadata": {"name": name, "resourceVersion": rv, "annotations": annotations}}
