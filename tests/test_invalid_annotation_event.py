"""A pod whose device decision cannot be read gets a Warning Event naming the key, what it
is counted as holding and the fix (issue 18 item 3), once per change of the value; on the
real API server through a running scheduler role."""

from __future__ import annotations

from typing import Any

import pytest
from _sched_helpers import (
    FakeClock,
    create_node,
    create_pod,
    delete_nodes,
    gpu_pod,
    register,
    running_scheduler,
    unique,
)

from hami.kube.client import Kube
from hami.protocol import keys
from hami.testkit.cluster import poll

pytestmark = pytest.mark.controlplane

ALLOCATED = "hami.io/vgpu-devices-allocated"


async def _warnings(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    found, _ = await kube.list_all(
        f"/api/v1/namespaces/{namespace}/events",
        query=(("fieldSelector", f"involvedObject.name={name},reason=InvalidDeviceAnnotation"),),
    )
    return [e for e in found if e.get("type") == "Warning"]


async def test_an_unreadable_decision_is_reported_on_the_pod(kube: Kube, namespace: str) -> None:
    node = unique("bad")
    await create_node(kube, node, {"hami.io/node-nvidia-register": register([f"GPU-{node}-0"])})
    try:
        async with running_scheduler(kube, FakeClock()):
            pod = gpu_pod("broken", annotations={keys.VGPU_NODE: node, ALLOCATED: "not a value"})
            await create_pod(kube, namespace, pod)

            async def reported() -> bool:
                return bool(await _warnings(kube, namespace, "broken"))

            await poll(reported, 30, "the InvalidDeviceAnnotation Event")
            (event,) = await _warnings(kube, namespace, "broken")
            message = str(event.get("message"))
            assert ALLOCATED in message, message
            assert "counted as holding" in message and "fix" in message, message
    finally:
        await delete_nodes(kube, [node])
