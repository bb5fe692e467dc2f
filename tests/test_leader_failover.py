"""Two scheduler "pods" (a ``hami run --role scheduler`` process with leader election and
the kube-scheduler that uses it as its extender, with kube-scheduler's own leader
election) on the real control plane; the leading pair is killed with SIGKILL in the middle
of a burst of pods. The standby takes over within 15 s (issue 12; both leases on the
default timing, the takeover times printed), exactly one replica writes at a time, no
device is booked beyond its capacity, and every pod that fits ends Running on the kubelet
emulators."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _replicas import Replica, _above, _holder, _is, _is_value, _truthy, hand_over_to_processes
from _sched_helpers import unique

from hami.kube.client import Kube
from hami.testkit.cluster import (
    ALLOCATED,
    LocalCluster,
    NodeSpec,
    Timing,
    gpu_pod,
    limits,
    phase_of,
    pod_devices,
    poll,
)
from hami.testkit.controlplane import ControlPlane

pytestmark = pytest.mark.controlplane

MEMORY, SPLIT = 8000, 4
NODES = (
    NodeSpec("ha-0", ({"count": 2, "model": "NVIDIA-Tesla T4", "memory": MEMORY},), SPLIT),
    NodeSpec("ha-1", ({"count": 2, "model": "NVIDIA-Tesla T4", "memory": MEMORY},), SPLIT),
)
POD_MEMORY = 3000  # two per device: 8 pods fit on the 4 devices
BURST = 10  # so 2 stay Pending
FIRST = 4  # created before the leader dies; 8 - 4 are left for the new leader at least
TIMING = Timing(handshake_timeout=3.0, bind_lock_wait=10.0)
# The goal is 15 s from the death to the new pair leading (worst case 12.65 s by the
# formulas in hami.scheduler.lease, as measured on an idle machine); the allowance is for
# the 2 shared cores of the test machine, where each Lease read and write can take a second.
TAKEOVER_GOAL, LOADED_ALLOWANCE = 15.0, 5.0


@pytest.fixture
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(NODES, plane=controlplane, timing=TIMING) as c:
        yield c


async def _record_holders(
    kube: Kube, namespace: str, name: str, seen: list[tuple[float, str]]
) -> None:
    """Every change of the Lease's holder, with the loop time it was first read."""
    loop = asyncio.get_running_loop()
    while True:
        holder = await _holder(kube, namespace, name)
        if not seen or seen[-1][1] != holder:
            seen.append((loop.time(), holder))
        await asyncio.sleep(0.1)


def _changed_after(seen: list[tuple[float, str]], since: float) -> bool:
    return any(t > since and holder for t, holder in seen)


def _taken_after(seen: list[tuple[float, str]], since: float) -> float:
    """Seconds from ``since`` to the first holder change read after it."""
    return next(t for t, holder in seen if t > since and holder) - since


def _bookings(pods: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """device uuid -> (containers, MiB) from the pods' allocation annotations."""
    booked: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for pod in pods:
        for container in pod_devices(pod, ALLOCATED):
            for device in container:
                booked[device.uuid][0] += 1
                booked[device.uuid][1] += device.memory
    return {uuid: (n, mib) for uuid, (n, mib) in booked.items()}


async def test_the_standby_takes_over_when_the_leading_pod_is_killed_mid_burst(
    cluster: LocalCluster, controlplane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    base = await hand_over_to_processes(cluster, controlplane)

    hami_lease, ks_lease = unique("hami-lease"), unique("ks-lease")
    a, b = Replica("pod-a", tmp_path), Replica("pod-b", tmp_path)
    holders: list[tuple[float, str]] = []
    ks_holders: list[tuple[float, str]] = []
    recorders = [
        asyncio.create_task(_record_holders(kube, cluster.namespace, hami_lease, holders)),
        asyncio.create_task(_record_holders(kube, cluster.namespace, ks_lease, ks_holders)),
    ]
    try:
        # pod a first, so that both of its containers lead; then pod b
        await a.start_hami(controlplane, cluster, hami_lease)
        await poll(lambda: _is(a.readyz(), "ok"), 60, "pod-a's hami leads")
        await a.start_kube_scheduler(controlplane, base, cluster.namespace, ks_lease)
        await poll(
            lambda: _truthy(_holder(kube, cluster.namespace, ks_lease)),
            30,
            "a kube-scheduler leads",
        )
        await b.start_hami(controlplane, cluster, hami_lease)
        await poll(lambda: _is(b.readyz(), "ok: standby"), 60, "pod-b's hami on standby, synced")
        await b.start_kube_scheduler(controlplane, base, cluster.namespace, ks_lease)

        # the burst: its first part before the kill, the rest while no replica leads
        names = [f"burst-{i}" for i in range(BURST)]
        for name in names[:FIRST]:
            await cluster.create_pod(gpu_pod(name, [limits(1, mem=POD_MEMORY)]))

        async def some_running() -> bool:
            return sum(phase_of(p) == "Running" for p in await cluster.list_pods()) >= 2

        await poll(some_running, 90, "the first pods of the burst running")
        # one writer so far: the standby stamped no handshake and bound nothing
        assert await b.metric('hami_handshake_patches_total{result="ok"}') == 0
        assert await b.metric('hami_bind_total{outcome="success",reason="bound"}') == 0
        assert await b.metric("hami_leader") == 0
        assert await a.metric("hami_leader") == 1
        assert (await a.metric('hami_handshake_patches_total{result="ok"}') or 0) > 0

        loop = asyncio.get_running_loop()
        killed = loop.time()
        await a.kill()
        for name in names[FIRST:]:
            await cluster.create_pod(gpu_pod(name, [limits(1, mem=POD_MEMORY)]))
        await poll(lambda: _is_value(b.metric("hami_leader"), 1), 60, "pod-b's hami leads")
        bound = 'hami_bind_total{outcome="success",reason="bound"}'
        await poll(lambda: _above(b.metric(bound), 0), 60, "pod-b binds", interval=0.05)
        first_bind = loop.time() - killed
        assert await b.readyz() == "ok"
        # both Leases moved to pod-b's pair: the pod leads once both have (the recorders
        # read each Lease every 0.1 s, so the last change may show just after the bind)
        await poll(
            lambda: _changed_after(holders, killed) and _changed_after(ks_holders, killed),
            10,
            "both Lease changes recorded",
        )
        hami_took = _taken_after(holders, killed)
        ks_took = _taken_after(ks_holders, killed)
        takeover = max(hami_took, ks_took)
        print(
            f"takeover after SIGKILL: hami Lease {hami_took:.1f}s, kube-scheduler Lease "
            f"{ks_took:.1f}s, pod-b's first bind {first_bind:.1f}s"
        )
        assert takeover <= TAKEOVER_GOAL + LOADED_ALLOWANCE, f"takeover took {takeover:.1f}s"

        async def placeable_running() -> bool:
            pods = await cluster.list_pods()
            return sum(phase_of(p) == "Running" for p in pods) == 8

        await poll(placeable_running, 120, "every pod that fits running")
        pods = await cluster.list_pods()
        assert sorted(phase_of(p) for p in pods) == ["Pending"] * 2 + ["Running"] * 8
        for uuid, (containers, mib) in _bookings(pods).items():
            assert containers <= SPLIT and mib <= MEMORY, f"{uuid} double-booked: {mib} MiB"
        assert len(_bookings(pods)) == 4
        # after the takeover the new leader writes: the binds of the rest, and handshakes
        assert (await b.metric('hami_bind_total{outcome="success",reason="bound"}') or 0) >= 4
        await poll(
            lambda: _above(b.metric('hami_handshake_patches_total{result="ok"}'), 0),
            30,
            "pod-b stamps handshakes",
        )
    finally:
        for recorder in recorders:
            recorder.cancel()
        await asyncio.gather(*recorders, return_exceptions=True)
        for replica in (a, b):
            await replica.stop(controlplane)
        await cluster.delete_pods(wait=False)
    # the Lease went from a to b once, never back and forth
    assert [h for _, h in holders if h] == ["pod-a", "pod-b"]
