"""The Ascend node-side tests' helpers: the stand-in ``npu-smi`` lives in
hami.testkit.fake_npu_smi (``hami demo`` runs it too); ``request`` builds an Allocate."""

from __future__ import annotations

from typing import Any

from hami.backends import AllocationRequest
from hami.protocol import ContainerDevice
from hami.testkit.fake_npu_smi import (
    FIXTURES,
    FakeChip,
    answers,
    b3_node,
    fake_npu_smi,
    fixture,
    mapping,
    set_fields,
)

__all__ = [
    "FIXTURES",
    "FakeChip",
    "answers",
    "b3_node",
    "fake_npu_smi",
    "fixture",
    "mapping",
    "request",
    "set_fields",
]


def request(
    devices: list[ContainerDevice], annotations: dict[str, str], node_devices: list[Any]
) -> AllocationRequest:
    return AllocationRequest(
        pod_namespace="ml",
        pod_name="train-0",
        pod_uid="77aa",
        container_name="main",
        container_index=0,
        devices=devices,
        node_devices=node_devices,
        pod_annotations=annotations,
    )
