"""A leader that loses its Lease while its binds wait on a held node lock (issue 18 item 1),
with real processes: two scheduler "pods" (``hami run --role scheduler`` + kube-scheduler,
both leader-elected) on the real control plane, one simulated GPU node.

The leading pod is frozen (SIGSTOP) while two of its binds wait for a node lock another pod
holds; the standby takes both Leases, places a third pod (higher priority, so it goes
first) and one of the first two; the lock is released and those two run. Then the old
leader resumes with its two binds still under way. Before the bind fence it completed the
one kube-scheduler had not re-placed: 3 x 4000 MiB on a 10000 MiB device. Now: nothing over
capacity, counted from the annotations and from the Allocate answers, and the two pods
that fit run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _cluster_checks import answered_holds, assert_within_devices, holds
from _replicas import Replica, _holder, _is, _is_value, _truthy, hand_over_to_processes
from _sched_helpers import unique

from hami.kube.client import Kube
from hami.kube.raw import NotFound
from hami.protocol import NodeLock, keys
from hami.scheduler.service import utcnow
from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, gpu_pod, limits, phase_of, poll
from hami.testkit.controlplane import ControlPlane

pytestmark = pytest.mark.controlplane

MEMORY, SPLIT = 10000, 10
NODE = "sb-0"
NODES = (NodeSpec(NODE, ({"count": 1, "model": "NVIDIA-Tesla T4", "memory": MEMORY},), SPLIT),)
POD_MEMORY = 4000  # two fit
TIMING = Timing(handshake_timeout=3.0, bind_lock_wait=20.0)
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


@pytest.fixture
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(NODES, plane=controlplane, timing=TIMING) as c:
        yield c


async def _metric_at_least(replica: Replica, line: str, floor: float) -> bool:
    try:
        return (await replica.metric(line) or 0) >= floor
    except Exception:
        return False


async def _binds_answered(replica: Replica) -> float:
    total = 0.0
    for reason in ("node_locked", "binding", "wrong_node", "refused", "standby", "error"):
        total += await replica.metric(f'hami_bind_total{{outcome="failed",reason="{reason}"}}') or 0
    return total + (await replica.metric('hami_bind_total{outcome="success",reason="bound"}') or 0)


async def test_a_frozen_leader_never_completes_binds_after_losing_its_lease(
    cluster: LocalCluster, controlplane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    base = await hand_over_to_processes(cluster, controlplane)

    hami_lease, ks_lease = unique("sb-hami"), unique("sb-ks")
    high = unique("sb-high")
    await kube.create(
        PRIORITY_CLASSES,
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": high},
            "value": 1000,
        },
    )
    a, b = Replica("sb-a", tmp_path), Replica("sb-b", tmp_path)
    try:
        await a.start_hami(controlplane, cluster, hami_lease)
        await poll(lambda: _is(a.readyz(), "ok"), 60, "pod-a's hami leads")
        await a.start_kube_scheduler(controlplane, base, cluster.namespace, ks_lease)
        await poll(
            lambda: _truthy(_holder(kube, cluster.namespace, ks_lease)),
            30,
            "a kube-scheduler leads",
        )
        await b.start_hami(controlplane, cluster, hami_lease)
        await poll(lambda: _is(b.readyz(), "ok: standby"), 60, "pod-b's hami on standby")
        await b.start_kube_scheduler(controlplane, base, cluster.namespace, ks_lease)

        # another pod holds the node lock (alive, within its bind window)
        holder = await cluster.create_pod(gpu_pod("holder", [{}], scheduler_name="nobody"))
        lock = NodeLock(utcnow(), holder["metadata"]["namespace"], "holder").encode()
        await kube.patch_node_annotations(NODE, {keys.NODE_LOCK: lock})

        for name in ("p1", "p2"):
            await cluster.create_pod(gpu_pod(name, [limits(1, mem=POD_MEMORY)]))
        scheduled = 'hami_filter_total{outcome="scheduled"}'
        await poll(lambda: _metric_at_least(a, scheduled, 2), 60, "pod-a placed p1 and p2")
        await asyncio.sleep(0.5)  # kube-scheduler sends both binds; they wait on the lock
        await a.pause()

        p3 = gpu_pod("p3", [limits(1, mem=POD_MEMORY)])
        p3["spec"]["priorityClassName"] = high
        await cluster.create_pod(p3)
        await poll(lambda: _is_value(b.metric("hami_leader"), 1), 60, "pod-b's hami leads")
        await poll(lambda: _metric_at_least(b, scheduled, 2), 60, "pod-b placed two pods")
        await kube.patch_node_annotations(NODE, {keys.NODE_LOCK: None})  # the holder is done

        async def running_count() -> int:
            return sum(phase_of(p) == "Running" for p in await cluster.list_pods())

        await poll(lambda: _at_least(running_count(), 2), 90, "pod-b's two pods running")
        await a.resume()
        # the old leader answers the two binds it had under way (refused, never bound)
        await poll(lambda: _at_least(_binds_answered(a), 2), 60, "pod-a's binds answered")
        await asyncio.sleep(2.0)  # a Binding that went through would show by now

        pods = {p["metadata"]["name"]: p for p in await cluster.list_pods()}
        placed = {n: p for n, p in pods.items() if p["spec"].get("nodeName")}
        # the device as the node registers it (the test's own roles are processes)
        device = {uuid: (SPLIT, MEMORY, 100) for uuid in cluster.nodes[NODE].uuids}
        assert_within_devices(device, holds(placed), "annotations")
        assert_within_devices(device, answered_holds(cluster), "Allocate")
        assert len(placed) == 2, sorted(placed)
        assert await running_count() == 2
        assert (await a.metric('hami_bind_total{outcome="success",reason="bound"}') or 0) == 0
    finally:
        for replica in (a, b):
            await replica.resume()
            await replica.stop(controlplane)
        await cluster.delete_pods(wait=False)
        with contextlib.suppress(NotFound):
            await kube.delete(f"{PRIORITY_CLASSES}/{high}")


async def _at_least(value: Any, floor: float) -> bool:
    return bool((await value or 0) >= floor)
