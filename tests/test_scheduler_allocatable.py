"""Issue 9 item 6 on the real control plane: kubelet's allocatable says no before the
handshake does (protocol.md §2 "kubelet's word wins when it says no")."""

from __future__ import annotations

from _sched_helpers import (
    FakeClock,
    create_node,
    create_pod,
    delete_nodes,
    gpu_pod,
    post,
    register,
    running_scheduler,
    unique,
)

from hami.kube.client import Kube
from hami.kube.raw import MERGE_PATCH
from hami.testkit.cluster import poll


async def set_gpu_status(kube: Kube, name: str, capacity: str, allocatable: str) -> None:
    """What kubelet writes: the status subresource, as a merge patch."""
    body = {
        "status": {
            "capacity": {"cpu": "8", "pods": "110", "nvidia.com/gpu": capacity},
            "allocatable": {"cpu": "8", "pods": "110", "nvidia.com/gpu": allocatable},
        }
    }
    await kube.request("PATCH", f"/api/v1/nodes/{name}/status", body=body, content_type=MERGE_PATCH)


async def test_kubelet_dropping_the_count_resource_makes_filter_skip_the_node(
    kube: Kube, namespace: str
) -> None:
    fake = FakeClock()
    name = unique("alloc")
    annotations = {
        "hami.io/node-nvidia-register": register([f"GPU-{name}-0"]),
        "hami.io/node-handshake-nvidia": "Reported_2024-05-20 09:59:50",
    }
    await create_node(kube, name, annotations)
    try:
        await set_gpu_status(kube, name, "1", "1")
        async with running_scheduler(kube, fake) as role:
            cluster = role.scheduler.cluster
            await poll(
                lambda: name in cluster.nodes and cluster.nodes[name].types["nvidia"].available
            )
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=100))
            # the device plugin's socket went away: kubelet keeps capacity, allocatable 0;
            # the handshake is still fresh, so only kubelet's word can turn the node off
            await set_gpu_status(kube, name, "1", "0")
            await poll(lambda: not cluster.nodes[name].types["nvidia"].available)
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == []
            assert "nvidia.com/gpu" in answer["FailedNodes"][name], answer
            # the plugin registered again
            await set_gpu_status(kube, name, "1", "1")
            await poll(lambda: cluster.nodes[name].types["nvidia"].available)
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == [name], answer
    finally:
        await delete_nodes(kube, [name])
