"""Two scheduler replicas that both believe they lead (a split brain), on the real control
plane with a simulated node (kubelet emulator + node agent): their binds wait on a held
node lock, then race for one device. The bind fence (hami.scheduler.bind) lets through only
what fits: counted from the pods' annotations and from the Allocate answers kubelet got.

Without the fence each replica completes every bind its own picture allows, and the device
holds 4 x 4000 MiB of 10000 MiB."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _cluster_checks import (
    assert_answers_within_devices,
    assert_not_overcommitted,
    holds,
    running,
)

from hami.kube.client import Kube
from hami.protocol import NodeLock, keys
from hami.scheduler.role import SchedulerRole
from hami.scheduler.service import utcnow
from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, gpu_pod, limits, phase_of, poll
from hami.testkit.controlplane import ControlPlane, free_port

pytestmark = pytest.mark.controlplane

MEMORY = 10000
NODE = "fence-0"
NODES = (NodeSpec(NODE, ({"count": 1, "model": "NVIDIA-Tesla T4", "memory": MEMORY},), 10),)
POD_MEMORY = 4000  # two fit, four are asked for
NOBODY = "no-such-scheduler"  # kube-scheduler leaves the pods to the test's extender calls


@pytest.fixture(params=[True, False], ids=["decision-in-binding", "decision-written-first"])
async def cluster(
    controlplane: ControlPlane, request: pytest.FixtureRequest
) -> AsyncIterator[LocalCluster]:
    """Both ways a bind fences (``scheduler.decision_in_binding``): the list of the node's
    bound pods read after the lock, or its own decision write seen by its pod watch."""
    c = LocalCluster(NODES, plane=controlplane, timing=Timing(bind_lock_wait=15.0))
    c.cfg = dataclasses.replace(
        c.cfg, scheduler=dataclasses.replace(c.cfg.scheduler, decision_in_binding=request.param)
    )
    async with c:
        yield c


async def _second_role(cluster: LocalCluster) -> SchedulerRole:
    """Another replica on the same API server, with ports of its own and no election."""
    sched = cluster.cfg.scheduler
    cfg = dataclasses.replace(
        cluster.cfg,
        scheduler=dataclasses.replace(
            sched,
            http=dataclasses.replace(sched.http, port=free_port()),
            extender=dataclasses.replace(sched.extender, port=free_port()),
            webhook=dataclasses.replace(sched.webhook, enabled=False),
        ),
    )
    role = SchedulerRole(cfg, cluster.kube)
    await role.start()
    await role.wait_ready()
    return role


async def _hold_lock(kube: Kube, holder: dict[str, Any]) -> None:
    """A live lock: a pod that exists, unbound, locked a moment ago."""
    meta = holder["metadata"]
    value = NodeLock(utcnow(), meta["namespace"], meta["name"]).encode()
    await kube.patch_node_annotations(NODE, {keys.NODE_LOCK: value})


def _bind_args(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": NODE,
    }


async def test_two_leading_replicas_never_bind_past_a_device(
    cluster: LocalCluster, kube: Kube
) -> None:
    a = cluster.role
    assert a is not None
    b = await _second_role(cluster)
    try:
        holder = await cluster.create_pod(gpu_pod("holder", [{}], scheduler_name=NOBODY))
        await _hold_lock(kube, holder)
        pods = [
            await cluster.create_pod(
                gpu_pod(f"p{i}", [limits(1, mem=POD_MEMORY)], scheduler_name=NOBODY)
            )
            for i in range(4)
        ]
        # each replica places two pods on the device: its own picture has room for them
        for replica, mine in ((a, pods[:2]), (b, pods[2:])):
            for pod in mine:
                answer = await replica.scheduler.filter({"Pod": pod, "NodeNames": [NODE]})
                assert answer["NodeNames"] == [NODE], answer
        binds = [
            asyncio.create_task(replica.scheduler.bind(_bind_args(pod)))
            for replica, pod in ((a, pods[0]), (b, pods[2]), (a, pods[1]), (b, pods[3]))
        ]
        await asyncio.sleep(1.0)
        assert not any(t.done() for t in binds), "binds must wait for the held lock"
        await kube.patch_node_annotations(NODE, {keys.NODE_LOCK: None})  # the holder is done
        answers = await asyncio.wait_for(asyncio.gather(*binds), 60)
        bound = [
            pod["metadata"]["name"]
            for pod, ans in zip(pods, _order(answers), strict=True)
            if not ans["Error"]
        ]
        refused = [ans["Error"] for ans in answers if ans["Error"]]
        assert len(bound) == 2, answers
        assert all("not bound to node" in e or "rewritten" in e for e in refused), refused

        async def bound_running() -> bool:
            listed = {p["metadata"]["name"]: p for p in await cluster.list_pods()}
            return all(phase_of(listed[name]) == "Running" for name in bound)

        await poll(bound_running, 60, "the bound pods running")
        listed = {p["metadata"]["name"]: p for p in await cluster.list_pods()}
        placed = {n: p for n, p in listed.items() if p["spec"].get("nodeName")}
        assert sorted(placed) == sorted(bound)
        assert_not_overcommitted(cluster, placed)
        assert_answers_within_devices(cluster)
        assert sum(h[1] for h in holds(running(listed)).values()) == 2 * POD_MEMORY
        # the refused pods hold nothing: marked failed, lock released, nothing reserved
        for name in set(listed) - set(placed) - {"holder"}:
            annotations = listed[name]["metadata"].get("annotations") or {}
            assert annotations.get(keys.BIND_PHASE) in (None, "failed"), annotations
        for replica in (a, b):
            assert not replica.scheduler.cluster.reservations
    finally:
        await b.stop()


def _order(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bind answers (made in the order p0, p2, p1, p3) in pod order."""
    return [answers[0], answers[2], answers[1], answers[3]]
