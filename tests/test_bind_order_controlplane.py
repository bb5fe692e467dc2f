"""When the bind writes the pod's decision, on the real control plane (docs/scheduler.md,
"Bind and the node lock").

By default (``scheduler.decision_in_binding``) the decision rides on the Binding: the
pod carries nothing of it until it is bound, a failed bind leaves it untouched, and the
check after the lock counts the pods the API server has bound to the node even where this
replica's pod watch has not shown them. With the setting off, or where the decision must
delete a stale key, it is written before the bind waits for the node's turn and lock, so
that write and the watch catching up with it are not part of each pod's serial lock
cycle."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
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

from hami.core.cluster import Cluster
from hami.kube.client import Kube, pods_path
from hami.protocol import ContainerDevice, encode_pod_devices, keys
from hami.testkit.cluster import poll

WRITTEN_FIRST = {"decision_in_binding": False}


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
    """With ``decision_in_binding: false``, a live pod holds the node's lock: the next
    pod's bind writes its decision on the (unbound) pod at once, waits, and binds as soon
    as the holder's allocation ends."""
    fake = FakeClock()
    cfg = scheduler_config(bind_lock_wait="15s", allocation_timeout="60s", **WRITTEN_FIRST)
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
            await _allocated(kube, namespace, "holder", name)
            assert await asyncio.wait_for(bind, 15) == {"Error": ""}
            bound = await kube.get_pod(namespace, "next")
            assert bound["spec"]["nodeName"] == name
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},next")
    finally:
        await delete_nodes(kube, [name])


@pytest.mark.parametrize("in_binding", [True, False], ids=["in-binding", "written-first"])
async def test_a_bind_that_never_gets_the_lock_leaves_nothing_held(
    kube: Kube, namespace: str, in_binding: bool
) -> None:
    """A bind that gives up waiting for the lock leaves the holder's lock alone and no
    device held by the pod. With the decision on the Binding nothing was written on the
    pod; with it written first (``decision_in_binding: false``) the bind marks it
    ``bind-phase: failed``."""
    fake = FakeClock()
    cfg = scheduler_config(
        bind_lock_wait="0.5s", allocation_timeout="60s", decision_in_binding=in_binding
    )
    (name,) = await nodes(kube, unique("bf"), 1)
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            pod = await placed_behind_a_holder(kube, role, namespace, name, fake, "late")
            answer = await post(f"{role.url}/bind", binding(pod, name))
            assert f"locked by pod {namespace}/holder" in answer["Error"]
            seen = await kube.get_pod(namespace, "late")
            assert not seen["spec"].get("nodeName")
            if in_binding:
                assert seen["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
                assert f"{namespace}/late" not in role.scheduler.cluster.pods
            else:
                assert seen["metadata"]["annotations"][keys.BIND_PHASE] == "failed"
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},holder")
    finally:
        await delete_nodes(kube, [name])


async def _pod_events(kube: Kube, namespace: str, name: str, seen: list[dict[str, Any]]) -> None:
    """Every version of pod ``name`` the API server's watch sends, in order."""
    query = [("watch", "1"), ("fieldSelector", f"metadata.name={name}")]
    async with kube.stream(pods_path(namespace), query=query) as events:
        async for event in events:
            seen.append(event.get("object") or {})


async def test_the_binding_carries_the_decision_in_one_write(kube: Kube, namespace: str) -> None:
    """By default the bind waits for the lock without touching the pod, and the pod gets
    its decision, ``bind-time`` and ``bind-phase: allocating`` in the same version as its
    ``spec.nodeName``: no version of the pod shows one without the other."""
    fake = FakeClock()
    cfg = scheduler_config(bind_lock_wait="15s", allocation_timeout="60s")
    (name,) = await nodes(kube, unique("bc"), 1)
    versions: list[dict[str, Any]] = []
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            pod = await placed_behind_a_holder(kube, role, namespace, name, fake, "next")
            watcher = asyncio.create_task(_pod_events(kube, namespace, "next", versions))
            bind = asyncio.create_task(post(f"{role.url}/bind", binding(pod, name)))
            await asyncio.sleep(1.0)
            assert not bind.done()
            waiting = await kube.get_pod(namespace, "next")
            assert waiting["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
            await _allocated(kube, namespace, "holder", name)
            assert await asyncio.wait_for(bind, 15) == {"Error": ""}
            bound = await kube.get_pod(namespace, "next")
            await poll(lambda: any(v["spec"].get("nodeName") for v in versions))
            watcher.cancel()
            notes = bound["metadata"]["annotations"]
            assert bound["spec"]["nodeName"] == name
            assert notes[keys.VGPU_NODE] == name
            assert notes[keys.BIND_PHASE] == "allocating"
            assert notes[keys.BIND_TIME].isdigit()
            assert (
                notes["hami.io/vgpu-devices-to-allocate"] == notes["hami.io/vgpu-devices-allocated"]
            )
            decided = [
                v for v in versions if keys.VGPU_NODE in (v["metadata"].get("annotations") or {})
            ]
            assert decided and all(v["spec"].get("nodeName") == name for v in decided), versions
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},next")
    finally:
        await delete_nodes(kube, [name])


async def test_the_check_counts_pods_bound_before_the_lock_that_the_watch_has_not_shown(
    kube: Kube, namespace: str
) -> None:
    """Another scheduler bound a pod filling both devices (its Binding carried the
    decision) and this replica's pod watch has not shown it yet: the list read after the
    lock finds it and the bind is refused. (Without that read the pod would be bound past
    the devices' memory.)"""
    fake = FakeClock()
    cfg = scheduler_config(bind_lock_wait="15s", allocation_timeout="60s")
    (name,) = await nodes(kube, unique("bl"), 1)
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            cluster = role.scheduler.cluster
            hidden = f"{namespace}/other"
            _hide_from_watch(cluster, hidden)
            pod = await create_pod(kube, namespace, gpu_pod("mine", mem=6000))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == [name]
            other = await create_pod(kube, namespace, gpu_pod("other", count=2, mem=9000))
            await kube.bind_pod(
                namespace, "other", other["metadata"]["uid"], name, annotations=_filling(name, fake)
            )
            await asyncio.sleep(0.5)  # the watch had time to show it: it did not (hidden)
            assert hidden not in cluster.pods
            answer = await post(f"{role.url}/bind", binding(pod, name))
            assert "not bound to node" in answer["Error"], answer
            assert "would hold" in answer["Error"], answer
            seen = await kube.get_pod(namespace, "mine")
            assert not seen["spec"].get("nodeName")
    finally:
        await delete_nodes(kube, [name])


async def test_a_decision_that_deletes_a_stale_key_is_written_before_the_binding(
    kube: Kube, namespace: str
) -> None:
    """A pod still carrying a key of an earlier decision that this one does not use (a
    MIG reservation here): a Binding cannot delete it, so the decision is written first
    (deleting it) and the pod is bound without it."""
    fake = FakeClock()
    cfg = scheduler_config(bind_lock_wait="15s", allocation_timeout="60s")
    (name,) = await nodes(kube, unique("bs"), 1)
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            stale = {keys.MIG_ALLOCATIONS: "GPU-gone-0,1g.10gb,0:;", keys.BIND_PHASE: "failed"}
            pod = await create_pod(kube, namespace, gpu_pod("again", mem=100, annotations=stale))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == [name]
            assert await post(f"{role.url}/bind", binding(pod, name)) == {"Error": ""}
            bound = await kube.get_pod(namespace, "again")
            notes = bound["metadata"]["annotations"]
            assert bound["spec"]["nodeName"] == name
            assert keys.MIG_ALLOCATIONS not in notes
            assert notes[keys.BIND_PHASE] == "allocating"
    finally:
        await delete_nodes(kube, [name])


async def test_a_lock_taken_by_another_scheduler_since_the_last_check_brings_the_list_back(
    kube: Kube, namespace: str
) -> None:
    """After a check of its own on a node, a bind skips the list while every later lock
    holder is in its picture. Another scheduler then locks the node, binds a pod filling
    both devices and releases the lock, and this replica's pod watch has not shown that
    pod: the Node watch showed its lock, so the next bind lists the node's pods again and
    is refused. (Were the holders not followed, it would be bound past the memory.)"""
    fake = FakeClock()
    async with _checked_once(kube, namespace, fake, "bh") as (role, name):
        cluster = role.scheduler.cluster
        locks = role.scheduler.locks
        hidden = f"{namespace}/other"
        _hide_from_watch(cluster, hidden)
        mine = await create_pod(kube, namespace, gpu_pod("mine", mem=6000))
        answer = await post(f"{role.url}/filter", {"Pod": mine, "NodeNames": [name]})
        assert answer["NodeNames"] == [name]
        # the other scheduler: its lock, its Binding with the decision, its release
        other = await create_pod(kube, namespace, gpu_pod("other", count=2, mem=9000))
        await _bound_by_another_scheduler(kube, other, name, fake)
        await poll(lambda: hidden in locks.holders.get(name, []))
        await poll(lambda: locks.parsed.get(name) is None)
        answer = await post(f"{role.url}/bind", binding(mine, name))
        assert "would hold" in answer["Error"], answer
        assert not (await kube.get_pod(namespace, "mine"))["spec"].get("nodeName")


async def test_a_holder_known_only_by_a_written_decision_brings_the_list_back(
    kube: Kube, namespace: str
) -> None:
    """The picture holds the lock holder, but only by the decision another scheduler wrote
    on it before its bind (Go HAMi writes it in filter); that scheduler then bound it with
    another decision, which this replica's pod watch has not shown. A written decision
    may change until the Binding, so the bind lists the node's pods instead of trusting
    the picture, and is refused. (Trusting it would count 100 MiB where 18,000 are held.)"""
    fake = FakeClock()
    async with _checked_once(kube, namespace, fake, "bw") as (role, name):
        cluster = role.scheduler.cluster
        locks = role.scheduler.locks
        # another scheduler's filter wrote a small decision on its pod: seen here
        small = encode_pod_devices([[ContainerDevice(f"GPU-{name}-0", "NVIDIA", 100, 0)]])
        written = {
            keys.VGPU_NODE: name,
            keys.VGPU_TIME: str(int(fake.now().timestamp())),
            "hami.io/vgpu-devices-allocated": small,
            "hami.io/vgpu-devices-to-allocate": small,
        }
        other = await create_pod(
            kube, namespace, gpu_pod("other", count=2, mem=9000, annotations=written)
        )
        hidden = f"{namespace}/other"
        await poll(lambda: hidden in cluster.pods)
        _hide_from_watch(cluster, hidden)
        mine = await create_pod(kube, namespace, gpu_pod("mine", mem=6000))
        answer = await post(f"{role.url}/filter", {"Pod": mine, "NodeNames": [name]})
        assert answer["NodeNames"] == [name]
        # ...then locked the node and bound the pod with a bigger decision
        await _bound_by_another_scheduler(kube, other, name, fake)
        await poll(lambda: hidden in locks.holders.get(name, []))
        await poll(lambda: locks.parsed.get(name) is None)
        assert not cluster.pods[hidden].bound  # the picture still has the written one
        answer = await post(f"{role.url}/bind", binding(mine, name))
        assert "would hold" in answer["Error"], answer


@contextlib.asynccontextmanager
async def _checked_once(
    kube: Kube, namespace: str, fake: FakeClock, prefix: str
) -> AsyncIterator[tuple[Any, str]]:
    """A scheduler and a node on which it bound one pod ("first", its check there, so the
    holders' history is known) whose node agent then released the lock."""
    cfg = scheduler_config(bind_lock_wait="15s", allocation_timeout="60s")
    (name,) = await nodes(kube, unique(prefix), 1)
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            locks = role.scheduler.locks
            await _placed_and_bound(kube, role, namespace, "first", name)
            assert locks.holders[name][0] == f"{namespace}/first"
            await _allocated(kube, namespace, "first", name)
            await poll(lambda: locks.parsed.get(name) is None)
            yield role, name
    finally:
        await delete_nodes(kube, [name])


async def _allocated(kube: Kube, namespace: str, pod: str, node: str) -> None:
    """What the pod's node agent does after its last Allocate: success, lock released."""
    await kube.patch_pod_annotations(namespace, pod, {keys.BIND_PHASE: "success"})
    await kube.patch_node_annotations(node, {keys.NODE_LOCK: None})


async def _placed_and_bound(kube: Kube, role: Any, namespace: str, pod: str, node: str) -> None:
    """A 100 MiB pod filtered onto ``node`` and bound there by this replica."""
    body = await create_pod(kube, namespace, gpu_pod(pod, mem=100))
    answer = await post(f"{role.url}/filter", {"Pod": body, "NodeNames": [node]})
    assert answer["NodeNames"] == [node]
    assert await post(f"{role.url}/bind", binding(body, node)) == {"Error": ""}


async def _bound_by_another_scheduler(
    kube: Kube, pod: dict[str, Any], node: str, fake: FakeClock
) -> None:
    """Another scheduler's bind of ``pod``: its lock, its Binding filling both devices
    (carrying the decision), the release."""
    meta = pod["metadata"]
    lock = f"{fake.now():%Y-%m-%dT%H:%M:%SZ},{meta['namespace']},{meta['name']}"
    await kube.patch_node_annotations(node, {keys.NODE_LOCK: lock})
    await kube.bind_pod(
        meta["namespace"], meta["name"], meta["uid"], node, annotations=_filling(node, fake)
    )
    await kube.patch_node_annotations(node, {keys.NODE_LOCK: None})


def _hide_from_watch(cluster: Cluster, hidden: str) -> None:
    """This replica's pod watch has not come to pod ``hidden`` yet (another scheduler's):
    its events do not reach the cluster's picture."""
    upsert = cluster.upsert_pod

    def lagging_watch(obj: Any, now: Any = None) -> list[str]:
        if f"{obj['metadata']['namespace']}/{obj['metadata']['name']}" == hidden:
            return []
        return upsert(obj, now)

    cluster.upsert_pod = lagging_watch  # type: ignore[method-assign]


def _filling(name: str, fake: FakeClock) -> dict[str, str]:
    """A decision taking 9000 MiB of each of the node's two devices, as a Binding's."""
    full = encode_pod_devices(
        [
            [
                ContainerDevice(f"GPU-{name}-0", "NVIDIA", 9000, 0),
                ContainerDevice(f"GPU-{name}-1", "NVIDIA", 9000, 0),
            ]
        ]
    )
    return {
        keys.VGPU_NODE: name,
        keys.VGPU_TIME: str(int(fake.now().timestamp())),
        "hami.io/vgpu-devices-allocated": full,
        "hami.io/vgpu-devices-to-allocate": full,
        keys.BIND_PHASE: "allocating",
    }
