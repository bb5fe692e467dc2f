"""Ten one-slice pods that all go to one node, through the whole real path (issue 11 item
2): kube-scheduler with hami as its extender, the node agent and the kubelet emulator.
Their binds queue on the node inside the scheduler, each waiting for the previous pod's
lock to be released after its Allocate: all run, not one bind fails, and the lock is
not stormed (before the queue, every release set every waiting bind re-reading the Node
and trying its conditional write)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from _counting_kube import CountingKube

from hami import log
from hami.protocol import keys
from hami.scheduler.role import SchedulerRole
from hami.testkit.cluster import (
    LocalCluster,
    NodeSpec,
    Timing,
    annotations_of,
    gpu_pod,
    limits,
    phase_of,
)
from hami.testkit.controlplane import ControlPlane

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

NODE = "gpu-one"
PODS = 10


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    log.configure("warning", "console", stream=sys.__stderr__)
    spec = NodeSpec(NODE, ({"count": 1, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},))
    timing = Timing(register_period=1.0, handshake_period=1.0, handshake_timeout=3.0)
    async with LocalCluster((spec,), plane=controlplane, timing=timing) as c:
        yield c


async def counted_role(cluster: LocalCluster) -> CountingKube:
    """Replace the cluster's scheduler role (same extender port) with one whose requests
    are counted."""
    await cluster.stop_role()
    counting = CountingKube(cluster.kube)
    role = SchedulerRole(cluster.cfg, counting)
    await role.start()
    cluster.role = role  # stopped with the cluster
    await role.wait_ready()
    return counting


def failed_binds(cluster: LocalCluster) -> float:
    assert cluster.role is not None
    total = 0.0
    for metric in cluster.role.scheduler.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "hami_bind_total" and sample.labels.get("outcome") == "failed":
                total += sample.value
    return total


async def test_ten_pods_on_one_node_all_run_without_a_failed_bind(
    cluster: LocalCluster,
) -> None:
    counting = await counted_role(cluster)
    names = [f"slice-{i}" for i in range(PODS)]
    for name in names:  # one slice of the one device each: 10 fit exactly
        await cluster.create_pod(gpu_pod(name, [limits(1, mem=1000)]))
    pods = await cluster.wait_running(names, timeout=120)
    for name, pod in pods.items():
        assert phase_of(pod) == "Running", (name, pod.get("status"))
        assert pod["spec"]["nodeName"] == NODE
        assert annotations_of(pod)[keys.BIND_PHASE] == "success"
    assert failed_binds(cluster) == 0
    # one lock write per pod, plus the rare Conflict with a node agent or handshake write
    # that came in between (without the queue: about PODS * PODS / 2)
    assert PODS <= counting.lock_writes(NODE) <= 2 * PODS
    for name in names:
        reasons = {e["reason"] for e in await cluster.events(name)}
        assert "BindingFailed" not in reasons, (name, reasons)
