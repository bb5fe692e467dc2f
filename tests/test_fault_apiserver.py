"""kube-apiserver dies for 20 s in the middle of a burst (issue 9's "Done when").

Real parts: etcd and kube-apiserver processes (the API server is SIGKILLed and started
again on the same port with the same data), kube-scheduler as a process with hami as its
extender, hami's scheduler role, node agents and kubelet emulators speaking the device
plugin gRPC. The check at the end is an invariant over everything the cluster shows:

- no device is over-committed, neither by the pods' decisions (annotations) nor by what
  the Allocate answers gave containers;
- every placeable pod runs within 90 s of the API server's return; the pod that fits
  nowhere is Pending with the scheduler's reason;
- no node lock is older than the allocation bound, and none is left once all is started.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from _cluster_checks import assert_answers_within_devices, assert_not_overcommitted, running

from hami import log
from hami.protocol import keys, parse_lock
from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, gpu_pod, limits, phase_of, poll
from hami.testkit.controlplane import ControlPlane

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

NODES = (
    NodeSpec("fa-a100", ({"count": 2, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},)),
    NodeSpec("fa-v100", ({"count": 2, "model": "NVIDIA-Tesla V100-PCIE-32GB", "memory": 32768},)),
    NodeSpec("fa-t4", ({"count": 2, "model": "NVIDIA-Tesla T4", "memory": 15360},)),
)
OUTAGE_SECONDS = 20.0
RECOVERY_SECONDS = 90.0  # issue 9: every placeable pod runs within 90 s of the return
# 30 pods x (1 slot, 2000 MiB, 20 % cores): 5 per device fill the cores of all 6 exactly.
BURST = [f"fa-{i:02d}" for i in range(30)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    log.configure("warning", "console", stream=sys.__stderr__)
    timing = Timing(register_period=1.0, handshake_period=1.0, handshake_timeout=5.0)
    async with LocalCluster(NODES, plane=controlplane, timing=timing) as c:
        yield c


async def _node_locks(cluster: LocalCluster) -> dict[str, str]:
    locks: dict[str, str] = {}
    for name in cluster.nodes:
        node = await cluster.kube.get_node(name)
        value = (node["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)
        if value:
            locks[name] = value
    return locks


async def test_apiserver_outage_mid_burst_overcommits_nothing_and_loses_no_pod(
    cluster: LocalCluster, controlplane: ControlPlane
) -> None:
    for name in BURST:
        await cluster.create_pod(gpu_pod(name, [limits(1, mem=2000, cores=20)]))
    await cluster.create_pod(gpu_pod("fa-nowhere", [limits(1, mem=60000)]))

    started = [0]

    async def some_running() -> bool:
        started[0] = sum(phase_of(p) == "Running" for p in await cluster.list_pods())
        return started[0] >= 3

    await poll(some_running, 60, "first pods running", interval=0.05)
    controlplane.kill_apiserver()
    try:
        await asyncio.sleep(OUTAGE_SECONDS)
    finally:
        controlplane.restart_apiserver()
    back = time.monotonic()
    assert started[0] < len(BURST), "the outage came after the burst, not in the middle"

    pods = await cluster.wait_running(BURST, timeout=RECOVERY_SECONDS)
    recovered = time.monotonic() - back
    not_running = {
        n: (phase_of(p), (p.get("status") or {}).get("message"))
        for n, p in pods.items()
        if phase_of(p) != "Running"
    }
    assert not not_running, f"placeable pods not running after the outage: {not_running}"
    assert recovered <= RECOVERY_SECONDS

    # Nothing over-committed: by the decisions, and by what containers were given.
    assert_not_overcommitted(cluster, running(pods))
    assert_answers_within_devices(cluster)

    # The pod that fits nowhere waits with the scheduler's reason. kube-scheduler may have
    # tried it last while hami refused to decide (its watches were down), so the reason can
    # take one more retry to show: kube-scheduler retries it on the next cluster event.
    # Once the burst is placed nothing else happens in the cluster, so a pod kube-scheduler
    # last saw refused with hami's "not ready" error can wait minutes for its retry: the
    # test supplies the cluster events a live cluster would, a Node label change and a
    # label change on the pod itself (kube-scheduler requeues on either, and its node
    # informer may still be reconnecting after the outage).
    seen: list[object] = []
    nudged = [0.0]

    async def waits_with_reason() -> bool:
        nowhere = await cluster.get_pod("fa-nowhere")
        assert phase_of(nowhere) == "Pending"
        conditions = (nowhere.get("status") or {}).get("conditions") or []
        seen[:] = conditions
        if any(c.get("reason") == "SchedulerError" for c in conditions) and (
            time.monotonic() - nudged[0] > 5
        ):
            nudged[0] = time.monotonic()
            label = {"metadata": {"labels": {"hami-test/nudge": str(int(nudged[0]))}}}
            node = next(iter(cluster.nodes))
            await cluster.kube.merge_patch(f"/api/v1/nodes/{node}", label)
            await cluster.kube.merge_patch(
                f"/api/v1/namespaces/{cluster.namespace}/pods/fa-nowhere", label
            )
        return any(
            c.get("reason") == "Unschedulable" and "CardInsufficientMemory" in c.get("message", "")
            for c in conditions
        )

    try:
        await poll(waits_with_reason, 60, "fa-nowhere Pending with hami's reason")
    except TimeoutError:
        # what to look at when it happens: hami's own readiness now, and kube-scheduler's log
        ready = cluster.role.not_ready() if cluster.role is not None else "no role"
        tail = cluster.kube_scheduler.log_tail() if cluster.kube_scheduler is not None else ""
        raise AssertionError(
            f"fa-nowhere has no hami reason: {seen}; hami's readiness now: "
            f"{ready or 'ready'}; kube-scheduler log tail:\n{tail}"
        ) from None

    # Every allocation finished, so no node is left locked; a lock still there would
    # have to be younger than the allocation bound.
    locks = await _node_locks(cluster)
    now = datetime.now(UTC)
    for node, value in locks.items():
        lock = parse_lock(value)
        assert lock is not None, (node, value)
        assert (now - lock.time).total_seconds() < RECOVERY_SECONDS, (node, value)
    assert not locks, locks
