"""Issue 9 item 5 on the real control plane: a decision whose bind never happened (the API
server was down) does not count as usage when a scheduler lists it."""

from __future__ import annotations

from datetime import timedelta

from _sched_helpers import (
    T0,
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
from hami.testkit.cluster import poll


async def test_a_listed_decision_that_was_never_bound_holds_nothing(
    kube: Kube, namespace: str
) -> None:
    name = unique("lapse")
    uuid = f"GPU-{name}-0"
    annotations = {
        "hami.io/node-nvidia-register": register([uuid], memory=10000, count=5),
        "hami.io/node-handshake-nvidia": "Reported_2024-05-20 09:59:50",
    }
    await create_node(kube, name, annotations)
    value = f"{uuid},NVIDIA,8000,0:;"
    lost = gpu_pod("lost", mem=8000)
    lost["metadata"]["annotations"] = {
        "hami.io/vgpu-node": name,
        "hami.io/vgpu-time": str(int((T0 - timedelta(minutes=10)).timestamp())),
        "hami.io/vgpu-devices-allocated": value,
        "hami.io/vgpu-devices-to-allocate": value,
        "hami.io/bind-phase": "allocating",
    }
    fresh = gpu_pod("fresh", mem=8000)
    fresh["metadata"]["annotations"] = {
        **lost["metadata"]["annotations"],
        "hami.io/vgpu-time": str(int((T0 - timedelta(seconds=10)).timestamp())),
    }
    try:
        await create_pod(kube, namespace, lost)
        async with running_scheduler(kube, FakeClock()) as role:
            cluster = role.scheduler.cluster
            await poll(lambda: f"{namespace}/lost" in cluster.lapsed and name in cluster.nodes)
            assert name not in cluster.usage_snapshot()
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=8000))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == [name], answer
        # a decision still inside its deadline (its bind may be running) does count:
        # "fresh"; "lost" still does not, and "p" was only reserved in the scheduler's
        # memory (filter writes nothing; bind writes the decision): a restart forgets it
        await create_pod(kube, namespace, fresh)
        async with running_scheduler(kube, FakeClock()) as role:
            cluster = role.scheduler.cluster
            await poll(lambda: f"{namespace}/fresh" in cluster.pods)
            assert cluster.usage_snapshot()[name] == {uuid: (1, 8000, 0)}
            assert f"{namespace}/p" not in cluster.pods
            assert f"{namespace}/lost" in cluster.lapsed
    finally:
        await delete_nodes(kube, [name])
