"""The bind writes the pod's decision before it waits for the node's turn and lock, so
that write and the watch catching up with it are not part of each pod's serial lock
cycle (docs/scheduler.md, "Bind and the node lock", step 2). On the real control plane."""

from __future__ import annotations

import asyncio
from typing import Any

from _sched_helpers import (
    FakeClock,
    binding,
    create_pod,
    delete_nodes,
    gpu_pod,
    post,
    running_scheduler,
    scheduler_config,
    unique,
)
from test_lock_stall_controlplane import bound_holder, nodes

from hami.kube.client import Kube
from hami.protocol import keys
from hami.testkit.cluster import poll


async def placed_behind_a_holder(
    kube: Kube, role: Any, namespace: str, name: str, fake: FakeClock, pod_name: str
) -> dict[str, Any]:
    """A live pod bound to ``name`` holding its lock, and a new pod filter placed there."""
    await poll(lambda: name in role.scheduler.cluster.nodes)
    await bound_holder(kube, namespace, name, fake)
    await poll(lambda: role.scheduler.locks.parsed.get(name) is not None)
    pod = await create_pod(kube, namespace, gpu_pod(pod_name, mem=100))
    answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
    assert answer["NodeNames"] == [name]
    return pod


async def test_the_decision_is_written_while_the_bind_waits_for_the_lock(
    kube: Kube, namespace: str
) -> None:
    """A live pod holds the node's lock: the next pod's bind writes its decision on the
    (unbound) pod at once, waits, and binds as soon as the holder's allocation ends."""
    fake = FakeClock()
    cfg = scheduler_config(bind_lock_wait="15s", allocation_timeout="60s")
    (name,) = await nodes(kube, unique("bo"), 1)
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            pod = await placed_behind_a_holder(kube, role, namespace, name, fake, "next")
            bind = asyncio.create_task(post(f"{role.url}/bind", binding(pod, name)))

            async def decided() -> bool:
                seen = await kube.get_pod(namespace, "next")
                notes = seen["metadata"].get("annotations") or {}
                return notes.get(keys.BIND_PHASE) == "allocating"

            await poll(decided, timeout=10)
            # written while the holder still has the lock, before any Binding
            seen = await kube.get_pod(namespace, "next")
            assert not seen["spec"].get("nodeName")
            assert seen["metadata"]["annotations"][keys.VGPU_NODE] == name
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},holder")
            assert not bind.done()
            # the holder's allocation ends and the node agent releases the lock
            await kube.patch_pod_annotations(namespace, "holder", {keys.BIND_PHASE: "success"})
            await kube.patch_node_annotations(name, {keys.NODE_LOCK: None})
            assert await asyncio.wait_for(bind, 15) == {"Error": ""}
            bound = await kube.get_pod(namespace, "next")
            assert bound["spec"]["nodeName"] == name
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},next")
    finally:
        await delete_nodes(kube, [name])


async def test_a_bind_that_never_gets_the_lock_marks_its_written_decision_failed(
    kube: Kube, namespace: str
) -> None:
    """The decision is on the pod before the lock is tried: a bind that gives up waiting
    for the lock marks it ``bind-phase: failed`` (no device stays held by an unbound
    pod's decision), and leaves the holder's lock alone."""
    fake = FakeClock()
    cfg = scheduler_config(bind_lock_wait="0.5s", allocation_timeout="60s")
    (name,) = await nodes(kube, unique("bf"), 1)
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            pod = await placed_behind_a_holder(kube, role, namespace, name, fake, "late")
            answer = await post(f"{role.url}/bind", binding(pod, name))
            assert f"locked by pod {namespace}/holder" in answer["Error"]
            seen = await kube.get_pod(namespace, "late")
            assert not seen["spec"].get("nodeName")
            assert seen["metadata"]["annotations"][keys.BIND_PHASE] == "failed"
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},holder")
    finally:
        await delete_nodes(kube, [name])
