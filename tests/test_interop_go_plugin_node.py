"""Interop case (b) of issue 10, on the real control plane, no Go needed: this scheduler and
a Node annotated exactly as Go HAMi 2.10's NVIDIA device plugin leaves it.

Go HAMi >= 2.8's plugin writes its register value as JSON and never writes ``Reported_``;
the only heartbeat key on the Node is ``hami.io/node-handshake``, holding the
``Requesting_`` stamp Go HAMi's scheduler last wrote; kubelet advertises ``nvidia.com/gpu``
in status.allocatable (set here through the status subresource, as kubelet does). Such a
node must stay schedulable period after period (protocol.md §2 "Agents that never
heartbeat") and turn unavailable within one handshake period of kubelet dropping the
resource. Periods are short and the clock is the test's.
"""

from __future__ import annotations

from typing import Any

from _sched_helpers import (
    FakeClock,
    create_node,
    create_pod,
    delete_nodes,
    gpu_pod,
    post,
    running_scheduler,
    scheduler_config,
    unique,
)

from hami.kube.client import Kube
from hami.kube.raw import MERGE_PATCH
from hami.protocol import handshake, keys
from hami.protocol.register import NodeDevice, encode_node_devices_json
from hami.testkit.cluster import poll

PERIOD = 5  # seconds: handshake_period
TIMEOUT = 20  # seconds: handshake_timeout


def go_plugin_register(name: str) -> str:
    """What HAMi 2.10's plugin writes (MarshalNodeDevices, byte-exact per the vectors)."""
    devices = [
        NodeDevice(f"GPU-{name}-{i}", 10, 40960, 100, "NVIDIA-A100-SXM4-40GB", 0, True, i)
        for i in range(2)
    ]
    value = encode_node_devices_json(devices)
    assert value.startswith(f'[{{"id":"GPU-{name}-0","count":10,"devmem":40960,')
    return value


async def set_status(kube: Kube, name: str, gpus: str | None, capacity: str | None) -> None:
    """kubelet's status.capacity / status.allocatable for nvidia.com/gpu (None: absent)."""
    body = {
        "status": {
            "capacity": {"cpu": "8", "pods": "110", "nvidia.com/gpu": capacity},
            "allocatable": {"cpu": "8", "pods": "110", "nvidia.com/gpu": gpus},
        }
    }
    await kube.request("PATCH", f"/api/v1/nodes/{name}/status", body=body, content_type=MERGE_PATCH)


async def node_annotations(kube: Kube, name: str) -> dict[str, str]:
    node: dict[str, Any] = await kube.request("GET", f"/api/v1/nodes/{name}")
    annotations: dict[str, str] = node["metadata"].get("annotations") or {}
    return annotations


async def test_a_go_hami_plugin_node_stays_schedulable_until_kubelet_drops_the_gpus(
    kube: Kube, namespace: str
) -> None:
    fake = FakeClock()
    name = unique("goplugin")
    stamp = handshake.requesting(fake.now())  # Go HAMi's scheduler's last stamp
    await create_node(
        kube,
        name,
        {keys.node_register("nvidia"): go_plugin_register(name), keys.NVIDIA_HANDSHAKE: stamp},
    )
    cfg = scheduler_config(handshake_period=f"{PERIOD}s", handshake_timeout=f"{TIMEOUT}s")
    try:
        await set_status(kube, name, "20", "20")
        async with running_scheduler(kube, fake, cfg) as role:
            sched = role.scheduler
            state = lambda: sched.cluster.nodes[name].types["nvidia"]  # noqa: E731
            await poll(lambda: name in sched.cluster.nodes and state().kubelet_advertises)
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=3000))

            async def schedulable() -> bool:
                answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
                return bool(answer["NodeNames"] == [name])

            # Several periods, well past the stamp's expiry: it stays (before the allocatable
            # rule it turned "handshake timed out" after TIMEOUT and never came back).
            for _ in range(3 * TIMEOUT // PERIOD):
                fake.advance(PERIOD)
                await sched.handshake_pass()
                assert state().available, state().reason
                assert await schedulable()
            # The stale stamp is left alone and no key of this project's is invented.
            annotations = await node_annotations(kube, name)
            assert annotations[keys.NVIDIA_HANDSHAKE] == stamp
            assert keys.node_handshake("nvidia") not in annotations

            # kubelet drops the resource (plugin gone after its grace period): unavailable
            # within one period.
            await set_status(kube, name, None, None)
            await poll(lambda: not state().kubelet_advertises, what="the status to arrive")
            fake.advance(PERIOD)
            await sched.handshake_pass()
            assert not state().available
            assert state().reason == handshake.HANDSHAKE_TIMED_OUT
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == []
            assert handshake.HANDSHAKE_TIMED_OUT in answer["FailedNodes"][name], answer

            # The plugin registers again: schedulable at once.
            await set_status(kube, name, "20", "20")
            await poll(lambda: state().available, what="the node to come back")
            assert await schedulable()

            # kubelet's other way of saying no (capacity kept, allocatable 0): at once.
            await set_status(kube, name, "0", "20")
            await poll(lambda: not state().available, what="kubelet's 0 allocatable")
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert "nvidia.com/gpu" in answer["FailedNodes"][name], answer
    finally:
        await delete_nodes(kube, [name])
