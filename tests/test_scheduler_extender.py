"""The scheduler role on the real control plane: /filter and /bind over HTTP, handshake,
node lock, restart rebuild, metrics and explain."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from typing import Any

import aiohttp
import pytest
from _sched_helpers import (
    T0,
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
from hami.kube.raw import Conflict, KubeError
from hami.protocol import decode_pod_devices, keys
from hami.testkit.cluster import poll

REPORTED = "Reported_2024-05-20 09:59:50"


async def make_nodes(kube: Kube, prefix: str, n: int, devices: int = 2, **kwargs: Any) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(n)]
    for name in names:
        uuids = [f"GPU-{name}-{d}" for d in range(devices)]
        await create_node(
            kube,
            name,
            {
                "hami.io/node-nvidia-register": register(uuids, **kwargs),
                "hami.io/node-handshake-nvidia": REPORTED,
            },
        )
    return names


@pytest.mark.parametrize("success_events", [False, True])
async def test_filter_and_bind_write_the_protocol_annotations(
    kube: Kube, namespace: str, success_events: bool
) -> None:
    fake = FakeClock()
    nodes = await make_nodes(kube, unique("fb"), 2)
    cfg = scheduler_config(success_events=success_events)
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            await poll(lambda: all(n in role.scheduler.cluster.nodes for n in nodes))
            pod = await create_pod(kube, namespace, gpu_pod("p1", mem=3000, cores=30))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": nodes})
            assert answer["Error"] == ""
            (chosen,) = answer["NodeNames"]
            assert chosen == nodes[0]  # equal nodes: ties go to the name
            # filter holds the devices in memory only; bind writes the decision
            stored = await kube.get_pod(namespace, "p1")
            assert not stored["metadata"].get("annotations")
            assert role.scheduler.cluster.usage_snapshot()[chosen] == {
                f"GPU-{chosen}-0": (1, 3000, 30)
            }
            # bind (lower-case field names are accepted too)
            fake.advance(5)
            answer = await post(
                f"{role.url}/bind",
                {
                    "podName": "p1",
                    "podNamespace": namespace,
                    "podUID": pod["metadata"]["uid"],
                    "node": chosen,
                },
            )
            assert answer == {"Error": ""}
            stored = await kube.get_pod(namespace, "p1")
            assert stored["spec"]["nodeName"] == chosen
            device = f"GPU-{chosen}-0,NVIDIA,3000,30:;"
            assert stored["metadata"]["annotations"] == {
                "hami.io/vgpu-node": chosen,
                "hami.io/vgpu-time": str(int(T0.timestamp()) + 5),  # written at bind
                "hami.io/vgpu-devices-allocated": device,
                "hami.io/vgpu-devices-to-allocate": device,
                "hami.io/bind-phase": "allocating",
                "hami.io/bind-time": str(int(T0.timestamp()) + 5),
            }
            node = await kube.get_node(chosen)
            assert node["metadata"]["annotations"][keys.NODE_LOCK] == (
                f"2024-05-20T10:00:05Z,{namespace},p1"
            )
            usage = role.scheduler.cluster.usage_snapshot()
            assert usage[chosen] == {f"GPU-{chosen}-0": (1, 3000, 30)}
            # a pod without managed resources passes through untouched
            plain = {
                "metadata": {"name": "x", "namespace": namespace},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            }
            answer = await post(f"{role.url}/filter", {"pod": plain, "nodenames": nodes})
            assert answer == {"NodeNames": nodes, "FailedNodes": {}, "Error": ""}
            # an invalid request is an error saying what to fix
            bad = gpu_pod("bad", mem=None)
            bad["metadata"]["namespace"] = namespace
            bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = (
                "150"
            )
            answer = await post(f"{role.url}/filter", {"Pod": bad, "NodeNames": nodes})
            assert "between 1 and 100" in answer["Error"]
            # explain, metrics, probes
            async with aiohttp.ClientSession() as s:
                async with s.get(
                    f"{role.url}/explain", params={"namespace": namespace, "name": "p1"}
                ) as r:
                    explained = await r.json()
                async with s.get(f"{role.probe_url}/metrics") as r:
                    metrics = await r.text()
                async with s.get(f"{role.probe_url}/readyz") as r:
                    assert r.status == 200
                async with s.get(f"{role.probe_url}/healthz") as r:
                    assert r.status == 200
            assert explained["assigned"] == chosen
            assert explained["nodes"][nodes[1]] == "fits"
            assert (
                f'hami_device_memory_allocated_mib{{model="NVIDIA-A100-SXM4-40GB",'
                f'node="{chosen}",type="nvidia",uuid="GPU-{chosen}-0"}} 3000.0'
            ) in metrics
            assert 'hami_filter_total{outcome="scheduled"} 1.0' in metrics
            assert 'hami_bind_total{outcome="success",reason="bound"} 1.0' in metrics
            assert f'hami_node_available{{node="{chosen}",type="nvidia"}} 1.0' in metrics
            await role.scheduler.drain()
        events = await kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
        reasons = {e["reason"] for e in events["items"] if e["involvedObject"]["name"] == "p1"}
        # Go HAMi's success Events only when asked for (two API writes per pod)
        assert ({"FilteringSucceed", "BindingSucceed"} <= reasons) == success_events
        assert not reasons & {"FilteringSucceed", "BindingSucceed"} or success_events
    finally:
        await delete_nodes(kube, nodes)


async def release_locks(kube: Kube, nodes: list[str], namespace: str, stop: asyncio.Event) -> None:
    """What the node agent does after a pod's last Allocate: phase success, lock removed."""
    while not stop.is_set():
        for name in nodes:
            node = await kube.get_node(name)
            meta = node["metadata"]
            value = (meta.get("annotations") or {}).get(keys.NODE_LOCK)
            if not value:
                continue
            pod_name = value.split(",")[2]
            try:
                holder = await kube.get_pod(namespace, pod_name)
            except KubeError:
                holder = {}
            if not (holder.get("spec") or {}).get("nodeName"):
                continue  # an agent allocates only a bound pod: its Binding comes first
            with contextlib.suppress(KubeError):
                await kube.patch_pod_annotations(namespace, pod_name, {keys.BIND_PHASE: "success"})
            with contextlib.suppress(Conflict):
                await kube.patch_node_annotations(
                    name, {keys.NODE_LOCK: None}, resource_version=meta["resourceVersion"]
                )
        await asyncio.sleep(0.02)


async def test_concurrent_filter_and_bind_never_overcommit(kube: Kube, namespace: str) -> None:
    fake = FakeClock()
    # 5 nodes x 2 devices x 5 slots x 10000 MiB; 50 pods of 2000 MiB fill it exactly
    nodes = await make_nodes(kube, unique("cc"), 5, devices=2, memory=10000, count=5)
    stop = asyncio.Event()
    try:
        async with running_scheduler(kube, fake) as role:
            await poll(lambda: all(n in role.scheduler.cluster.nodes for n in nodes))
            pods = await asyncio.gather(
                *(create_pod(kube, namespace, gpu_pod(f"p{i}", mem=2000)) for i in range(50))
            )
            releaser = asyncio.create_task(release_locks(kube, nodes, namespace, stop))

            async def schedule(pod: dict[str, Any]) -> str:
                answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": nodes})
                assert answer["Error"] == "", answer
                (node,) = answer["NodeNames"]
                bound = await post(f"{role.url}/bind", binding(pod, node))
                assert bound == {"Error": ""}
                return str(node)

            placed = await asyncio.wait_for(asyncio.gather(*(schedule(p) for p in pods)), 120)
            assert sorted(placed) == sorted(n for n in nodes for _ in range(10))
            stop.set()
            await releaser
            # the invariant, from the annotations alone
            listing = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")
            per_device: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for item in listing["items"]:
                ann = item["metadata"]["annotations"]
                assert item["spec"]["nodeName"] == ann["hami.io/vgpu-node"]
                for container in decode_pod_devices(ann["hami.io/vgpu-devices-allocated"]):
                    for device in container:
                        per_device[device.uuid][0] += 1
                        per_device[device.uuid][1] += device.memory
            assert len(per_device) == 10
            assert all(v == [5, 10000] for v in per_device.values()), per_device
            # one more does not fit, and every node says why
            extra = await create_pod(kube, namespace, gpu_pod("extra", mem=2000))
            answer = await post(f"{role.url}/filter", {"Pod": extra, "NodeNames": nodes})
            assert answer["NodeNames"] == []
            assert answer["FailedNodes"] == {n: "2/2 CardTimeSlicingExhausted" for n in nodes}
            expected = role.scheduler.cluster.usage_snapshot()
        # a restarted scheduler rebuilds the same usage from the API server alone
        async with running_scheduler(kube, FakeClock()) as again:
            await poll(
                lambda: all(
                    again.scheduler.cluster.usage_snapshot().get(n) == expected.get(n)
                    for n in nodes
                )
            )
            mine = {n: again.scheduler.cluster.usage_snapshot()[n] for n in nodes}
            assert mine == {n: expected[n] for n in nodes}
    finally:
        stop.set()
        await delete_nodes(kube, nodes)


async def test_handshake_timeout_and_recovery(kube: Kube, namespace: str) -> None:
    fake = FakeClock()
    nodes = await make_nodes(kube, unique("hs"), 1)
    (name,) = nodes
    key = "hami.io/node-handshake-nvidia"
    try:
        async with running_scheduler(kube, fake) as role:
            cluster = role.scheduler.cluster
            await poll(lambda: name in cluster.nodes)
            await role.scheduler.handshake_pass()
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][key] == "Requesting_2024-05-20 10:00:00"
            await poll(
                lambda: (cluster.nodes[name].types["nvidia"].handshake_value or "").startswith(
                    "Requesting"
                )
            )
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=100))
            fake.advance(60)
            await role.scheduler.handshake_pass()  # exactly 60 s: still available
            assert cluster.nodes[name].types["nvidia"].available
            fake.advance(1)
            await role.scheduler.handshake_pass()
            node = await kube.get_node(name)
            # a stale stamp is never refreshed
            assert node["metadata"]["annotations"][key] == "Requesting_2024-05-20 10:00:00"
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": nodes})
            assert answer["FailedNodes"] == {name: "handshake timed out"}
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"{role.probe_url}/metrics") as r,
            ):
                text = await r.text()
            assert f'hami_node_available{{node="{name}",type="nvidia"}} 0.0' in text
            # the node agent answers: available again
            await kube.patch_node_annotations(name, {key: "Reported_2024-05-20 10:01:02"})
            await poll(
                lambda: (cluster.nodes[name].types["nvidia"].handshake_value or "").startswith(
                    "Reported"
                )
            )
            await role.scheduler.handshake_pass()
            assert cluster.nodes[name].types["nvidia"].available
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": nodes})
            assert answer["NodeNames"] == [name]
    finally:
        await delete_nodes(kube, nodes)


async def test_malformed_register_is_a_reason_not_a_crash(kube: Kube, namespace: str) -> None:
    fake = FakeClock()
    name = unique("bad")
    await create_node(
        kube,
        name,
        {
            "hami.io/node-nvidia-register": "GPU-x,10,lots,100,M,0,true:",
            "hami.io/node-handshake-nvidia": REPORTED,
        },
    )
    try:
        async with running_scheduler(kube, fake) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=100))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name, "nope"]})
            assert answer["NodeNames"] == []
            assert answer["FailedNodes"]["nope"] == "node unregistered"
            assert "invalid node register value" in answer["FailedNodes"][name]
            assert "memory" in answer["FailedNodes"][name]
    finally:
        await delete_nodes(kube, [name])


async def test_bind_waits_for_a_live_lock_then_fails_and_rolls_back(
    kube: Kube, namespace: str
) -> None:
    fake = FakeClock()
    cfg = scheduler_config(bind_lock_wait="0.5s", node_lock_timeout="5m")
    nodes = await make_nodes(kube, unique("lk"), 1)
    (name,) = nodes
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            # a holder bound to the node and being allocated (an unbound one this old would
            # be past its binder's window, and taken over)
            held = gpu_pod("holder", mem=100)
            held["spec"]["nodeName"] = name
            holder = await create_pod(kube, namespace, held)
            await kube.patch_node_annotations(
                name, {keys.NODE_LOCK: f"2024-05-20T09:59:00Z,{namespace},holder"}
            )
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=100))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": nodes})
            assert answer["NodeNames"] == [name]
            began = asyncio.get_running_loop().time()
            answer = await post(f"{role.url}/bind", binding(pod, name))
            waited = asyncio.get_running_loop().time() - began
            assert f"locked by pod {namespace}/holder" in answer["Error"]
            assert 0.5 <= waited < 5
            stored = await kube.get_pod(namespace, "p")
            # the decision rides on the Binding, which never came: nothing was written on
            # the pod, so it holds nothing here or in any other reader
            assert keys.VGPU_NODE not in (stored["metadata"].get("annotations") or {})
            assert "nodeName" not in stored["spec"]
            await poll(lambda: name not in role.scheduler.cluster.usage_snapshot())
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(",holder")
            # the lock goes stale (5 min, injected clock): taken over
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": nodes})
            assert answer["NodeNames"] == [name]
            fake.advance(6 * 60)
            answer = await post(f"{role.url}/bind", binding(pod, name))
            assert answer == {"Error": ""}
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},p")
            del holder
            # the lock of a deleted pod is taken over at once, even when fresh
            await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/holder")
            q = await create_pod(kube, namespace, gpu_pod("q", mem=100))
            await kube.patch_node_annotations(
                name,
                {keys.NODE_LOCK: f"{fake.now():%Y-%m-%dT%H:%M:%SZ},{namespace},holder"},
            )
            answer = await post(f"{role.url}/filter", {"Pod": q, "NodeNames": nodes})
            answer = await post(f"{role.url}/bind", binding(q, name))
            assert answer == {"Error": ""}
            # a lock held by a live pod is waited for, and taken once released
            r = await create_pod(kube, namespace, gpu_pod("r", mem=100))
            answer = await post(f"{role.url}/filter", {"Pod": r, "NodeNames": nodes})
            cfg_wait = asyncio.create_task(post(f"{role.url}/bind", binding(r, name)))
            await asyncio.sleep(0.2)
            assert not cfg_wait.done()
            await kube.patch_node_annotations(name, {keys.NODE_LOCK: None})
            assert await asyncio.wait_for(cfg_wait, 5) == {"Error": ""}
    finally:
        await delete_nodes(kube, nodes)


async def test_lock_of_a_pod_that_moved_on_is_taken_over_at_once(
    kube: Kube, namespace: str
) -> None:
    # A scheduler that crashed between locking a node and binding leaves a fresh lock whose
    # pod later went elsewhere (or finished allocating); nobody would release it.
    fake = FakeClock()
    cfg = scheduler_config(bind_lock_wait="30s", node_lock_timeout="5m")
    nodes = await make_nodes(kube, unique("mv"), 1)
    (name,) = nodes
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            for holder, annotations in (
                ("elsewhere", {keys.VGPU_NODE: "some-other-node"}),
                ("done", {keys.VGPU_NODE: name, keys.BIND_PHASE: "success"}),
            ):
                await create_pod(kube, namespace, gpu_pod(holder, mem=100))
                await kube.patch_pod_annotations(namespace, holder, annotations)
                await kube.patch_node_annotations(
                    name,
                    {keys.NODE_LOCK: f"{fake.now():%Y-%m-%dT%H:%M:%SZ},{namespace},{holder}"},
                )
                pod = await create_pod(kube, namespace, gpu_pod(f"after-{holder}", mem=100))
                answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": nodes})
                assert answer["NodeNames"] == [name]
                began = asyncio.get_running_loop().time()
                answer = await post(f"{role.url}/bind", binding(pod, name))
                assert answer == {"Error": ""}
                assert asyncio.get_running_loop().time() - began < 5  # not the 30 s wait
                node = await kube.get_node(name)
                lock = node["metadata"]["annotations"][keys.NODE_LOCK]
                assert lock.endswith(f",{namespace},after-{holder}")
                # the agent would release it after allocation; do it here
                await kube.patch_node_annotations(name, {keys.NODE_LOCK: None})
    finally:
        await delete_nodes(kube, [name])


async def test_a_pod_filtered_again_does_not_compete_with_its_own_hold(
    kube: Kube, namespace: str
) -> None:
    # kube-scheduler filters a pod again when its bind failed (or the scheduler restarted in
    # between); on a full node the pod's own earlier hold must not keep it out.
    fake = FakeClock()
    nodes = await make_nodes(kube, unique("rf"), 1, devices=1, memory=8000)
    (name,) = nodes
    try:
        async with running_scheduler(kube, fake) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            pod = await create_pod(kube, namespace, gpu_pod("whole", mem=8000))
            for _ in range(2):
                answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": nodes})
                assert answer["NodeNames"] == [name], answer
            usage = role.scheduler.cluster.usage_snapshot()[name]
            assert usage == {f"GPU-{name}-0": (1, 8000, 0)}  # held once, not twice
            # Someone else cannot have it while the pod holds it.
            other = await create_pod(kube, namespace, gpu_pod("other", mem=8000))
            answer = await post(f"{role.url}/filter", {"Pod": other, "NodeNames": nodes})
            assert answer["NodeNames"] == []
            assert "CardInsufficientMemory" in answer["FailedNodes"][name]
    finally:
        await delete_nodes(kube, [name])
