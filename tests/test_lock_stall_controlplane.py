"""A pod bound but never allocated must not hold its node for the lock timeout (issue 9
item 4): on the real control plane, with the scheduler's clock injected."""

from __future__ import annotations

import asyncio
from typing import Any

from _sched_helpers import (
    FakeClock,
    binding,
    create_node,
    create_pod,
    delete_nodes,
    gpu_pod,
    post,
    register,
    running_scheduler,
    scheduler_config,
    unique,
)

from hami.kube.client import Kube
from hami.protocol import keys
from hami.testkit.cluster import poll

REPORTED = "Reported_2024-05-20 09:59:50"


async def nodes(kube: Kube, prefix: str, n: int) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(n)]
    for name in names:
        uuids = [f"GPU-{name}-{d}" for d in range(2)]
        await create_node(
            kube,
            name,
            {
                "hami.io/node-nvidia-register": register(uuids),
                "hami.io/node-handshake-nvidia": REPORTED,
            },
        )
    return names


async def bound_holder(kube: Kube, namespace: str, node: str, fake: FakeClock) -> dict[str, Any]:
    """A pod the scheduler bound to ``node`` whose Allocate never came (the lock is its)."""
    now = fake.now()
    body = gpu_pod("holder", mem=100)
    body["spec"]["nodeName"] = node
    body["metadata"]["annotations"] = {
        keys.VGPU_NODE: node,
        keys.BIND_PHASE: "allocating",
        keys.BIND_TIME: str(int(now.timestamp())),
    }
    pod = await create_pod(kube, namespace, body)
    lock = f"{now:%Y-%m-%dT%H:%M:%SZ},{namespace},holder"
    await kube.patch_node_annotations(node, {keys.NODE_LOCK: lock})
    return pod


async def test_a_holder_without_allocation_is_failed_and_its_lock_taken_over(
    kube: Kube, namespace: str
) -> None:
    fake = FakeClock()
    cfg = scheduler_config(bind_lock_wait="0.5s", node_lock_timeout="5m", allocation_timeout="60s")
    names = await nodes(kube, unique("st"), 1)
    (name,) = names
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            await bound_holder(kube, namespace, name, fake)
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=100))
            # 30 s in: the holder may still be allocating; the bind waits and fails
            fake.advance(30)
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": names})
            assert answer["NodeNames"] == [name]
            answer = await post(f"{role.url}/bind", binding(pod, name))
            assert f"locked by pod {namespace}/holder" in answer["Error"]
            # past the allocation timeout (not the 5 min lock timeout): taken over at once.
            # (Another pod: binding the same pod again at once would race the watch event
            # of its own failed bind.)
            fake.advance(31)
            pod = await create_pod(kube, namespace, gpu_pod("q", mem=100))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": names})
            assert answer["NodeNames"] == [name]
            began = asyncio.get_running_loop().time()
            answer = await post(f"{role.url}/bind", binding(pod, name))
            assert answer == {"Error": ""}
            assert asyncio.get_running_loop().time() - began < 5
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},q")
            holder = await kube.get_pod(namespace, "holder")
            assert holder["metadata"]["annotations"][keys.BIND_PHASE] == "failed"
            await role.scheduler.drain()
            events = await kube.request(
                "GET",
                f"/api/v1/namespaces/{namespace}/events",
                query=[("fieldSelector", "involvedObject.name=holder")],
            )
            reasons = {e["reason"]: e["message"] for e in events["items"]}
            assert "AllocationTimedOut" in reasons
            assert f"pod {namespace}/holder" in reasons["AllocationTimedOut"]
    finally:
        await delete_nodes(kube, names)


async def test_filter_tries_a_node_with_a_long_held_lock_last(kube: Kube, namespace: str) -> None:
    fake = FakeClock()
    cfg = scheduler_config(bind_lock_wait="20s", allocation_timeout="60s")
    names = await nodes(kube, unique("bz"), 2)
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            await poll(lambda: all(n in role.scheduler.cluster.nodes for n in names))
            await bound_holder(kube, namespace, names[0], fake)
            await poll(lambda: role.scheduler.locks.parsed.get(names[0]) is not None)
            # a fresh lock is normal (allocation takes seconds): the usual order, names[0]
            first = await create_pod(kube, namespace, gpu_pod("first", mem=100))
            answer = await post(f"{role.url}/filter", {"Pod": first, "NodeNames": names})
            assert answer["NodeNames"] == [names[0]]
            # held past half the bind wait: another node is preferred while one fits
            fake.advance(11)
            second = await create_pod(kube, namespace, gpu_pod("second", mem=100))
            answer = await post(f"{role.url}/filter", {"Pod": second, "NodeNames": names})
            assert answer["NodeNames"] == [names[1]]
            # when only the locked node is a candidate, it is still chosen (bind decides)
            third = await create_pod(kube, namespace, gpu_pod("third", mem=100))
            answer = await post(f"{role.url}/filter", {"Pod": third, "NodeNames": names[:1]})
            assert answer["NodeNames"] == [names[0]]
    finally:
        await delete_nodes(kube, names)


async def test_the_sweep_releases_locks_no_bind_would_free(kube: Kube, namespace: str) -> None:
    # After an outage the last pods of a burst may leave locks behind that no later bind
    # takes over: the scheduler's periodic sweep removes them (the same rule as bind).
    fake = FakeClock()
    cfg = scheduler_config(allocation_timeout="60s")
    names = await nodes(kube, unique("sw"), 2)
    stalled, finished = names
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            sched = role.scheduler
            await poll(lambda: all(n in sched.cluster.nodes for n in names))
            await bound_holder(kube, namespace, stalled, fake)
            done = gpu_pod("done", mem=100)
            done["spec"]["nodeName"] = finished
            await create_pod(kube, namespace, done)
            await kube.request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/pods/done/status",
                body={"status": {"phase": "Failed"}},
                content_type="application/merge-patch+json",
            )
            lock = f"{fake.now():%Y-%m-%dT%H:%M:%SZ},{namespace},done"
            await kube.patch_node_annotations(finished, {keys.NODE_LOCK: lock})
            await poll(lambda: all(n in sched.locks.parsed for n in names))

            async def locked() -> set[str]:
                found = set()
                for name in names:
                    node = await kube.get_node(name)
                    if keys.NODE_LOCK in (node["metadata"].get("annotations") or {}):
                        found.add(name)
                return found

            await sched.release_stale_locks()  # fresh locks are not even looked at
            assert await locked() == set(names)
            fake.advance(30)
            await sched.release_stale_locks()  # the finished pod's lock goes
            assert await locked() == {stalled}
            fake.advance(31)
            await sched.release_stale_locks()  # past the allocation timeout
            assert await locked() == set()
            holder = await kube.get_pod(namespace, "holder")
            assert holder["metadata"]["annotations"][keys.BIND_PHASE] == "failed"
    finally:
        await delete_nodes(kube, names)
