"""The ``defrag`` node policy on the real control plane (kube-apiserver, kube-scheduler,
node agents with the kubelet emulator): the scheduler keeps every node's free CPU and
memory from its watches, and with ``scheduler.defrag_cpu_pods`` the webhook routes a pod
without devices to hami's scheduler, which puts it where it strands the least GPU. Left
to kube-scheduler's default score (LeastAllocated), the same pod would go to the emptier
node and take CPU from the GPUs a whole-device pod still needs."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from hami import log
from hami.testkit.cluster import (
    CLUSTER_LABEL,
    SCHEDULER_NAME,
    LocalCluster,
    NodeSpec,
    Timing,
    poll,
)
from hami.testkit.controlplane import ControlPlane

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

A, B = "gpu-a", "gpu-b"
NODES = (
    NodeSpec(A, ({"count": 2, "model": "NVIDIA-Tesla T4", "memory": 15360},)),
    NodeSpec(B, ({"count": 2, "model": "NVIDIA-Tesla T4", "memory": 15360},)),
)
TIMING = Timing(register_period=1.0, handshake_period=1.0, handshake_timeout=3.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    log.configure("warning", "console", stream=sys.__stderr__)
    async with LocalCluster(
        NODES,
        plane=controlplane,
        timing=TIMING,
        webhook=True,
        node_policy="defrag",
        device_policy="binpack",
        defrag_cpu_pods=True,
    ) as c:
        yield c


def pod(
    cluster: LocalCluster, name: str, cpu: str, gpus: int = 0, *, scheduler: str | None = None
) -> dict[str, Any]:
    """Labelled for the cluster's webhook (its object selector)."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus), "nvidia.com/gpucores": "100"}
    spec: dict[str, Any] = {
        "containers": [{"name": "c0", "image": "busybox", "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    metadata = {"name": name, "labels": {CLUSTER_LABEL: cluster.id}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


async def test_a_pod_without_devices_goes_where_it_strands_no_gpu(cluster: LocalCluster) -> None:
    scheduler = cluster.role.scheduler if cluster.role is not None else None
    assert scheduler is not None and scheduler.rooms is not None
    # one whole-device pod that takes most of a node's CPU (so that node's idle GPU is
    # already of no use to another such pod)
    await cluster.create_pod(pod(cluster, "big", "30", gpus=1))
    big = (await cluster.wait_running(["big"]))["big"]
    full = big["spec"]["nodeName"]
    empty = B if full == A else A

    async def room_known() -> bool:
        free = scheduler.rooms.free(full) if scheduler.rooms else None
        return free is not None and free[0] <= 2000

    await poll(room_known, 20, f"{full}'s free CPU seen by the scheduler")
    # a pod without devices, created without a scheduler name: the webhook routes it
    await cluster.create_pod(pod(cluster, "small", "1"))
    small = await cluster.get_pod("small")
    assert small["spec"]["schedulerName"] == SCHEDULER_NAME
    small = (await cluster.wait_running(["small"]))["small"]
    # kube-scheduler's LeastAllocated would pick the empty node; defrag keeps its 32 CPUs
    # for the next whole-device pod
    assert small["spec"]["nodeName"] == full
    await cluster.create_pod(pod(cluster, "big2", "30", gpus=1))
    big2 = (await cluster.wait_running(["big2"]))["big2"]
    assert big2["spec"]["nodeName"] == empty
    # a pod for another scheduler is left alone
    await cluster.create_pod(pod(cluster, "other", "1", scheduler="someone-else"))
    other = await cluster.get_pod("other")
    assert other["spec"]["schedulerName"] == "someone-else"
