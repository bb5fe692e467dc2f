"""Filter without API I/O and the bind's one pod write, on the real API server (issue 11
items 1 and 2). Requests are counted by a ``Kube`` that records what it sends."""

from __future__ import annotations

import asyncio

import pytest
from _counting_kube import CountingKube
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

pytestmark = pytest.mark.controlplane

REPORTED = "Reported_2024-05-20 09:59:50"
ALLOCATED = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"


async def one_node(kube: Kube, prefix: str) -> str:
    name = unique(prefix)
    await create_node(
        kube,
        name,
        {
            "hami.io/node-nvidia-register": register([f"GPU-{name}-0"], memory=10000, count=5),
            "hami.io/node-handshake-nvidia": REPORTED,
        },
    )
    return name


@pytest.mark.parametrize("in_binding", [True, False], ids=["in-binding", "written-first"])
async def test_filter_sends_nothing_and_bind_writes_the_pod_once(
    kube: Kube, namespace: str, in_binding: bool
) -> None:
    counting = CountingKube(kube)
    name = await one_node(kube, "io")
    cfg = scheduler_config(decision_in_binding=in_binding)
    try:
        async with running_scheduler(counting, FakeClock(), cfg) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=3000))
            mark = len(counting.requests)
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == [name], answer
            assert counting.since(mark) == []  # no API request at all
            stored = await kube.get_pod(namespace, "p")
            assert keys.VGPU_NODE not in (stored["metadata"].get("annotations") or {})

            mark = len(counting.requests)
            assert await post(f"{role.url}/bind", binding(pod, name)) == {"Error": ""}
            pod_path = f"/api/v1/namespaces/{namespace}/pods/p"
            sent = counting.since(mark)
            if in_binding:
                # the lock (at the watch's resourceVersion: no read of the Node), the list
                # of the pods bound to the node, the Binding carrying the decision
                assert sent == [
                    ("PATCH", f"/api/v1/nodes/{name}"),
                    ("GET", "/api/v1/pods"),
                    ("POST", f"{pod_path}/binding"),
                ]
            else:
                # one pod write (the decision, before the node's turn), the lock, the Binding
                assert sent == [
                    ("PATCH", pod_path),
                    ("PATCH", f"/api/v1/nodes/{name}"),
                    ("POST", f"{pod_path}/binding"),
                ]
            ann = (await kube.get_pod(namespace, "p"))["metadata"]["annotations"]
            device = f"GPU-{name}-0,NVIDIA,3000,0:;"
            assert ann[keys.VGPU_NODE] == name
            assert ann[ALLOCATED] == ann[TO_ALLOCATE] == device
            assert ann[keys.BIND_PHASE] == "allocating"
            assert ann[keys.BIND_TIME] == ann[keys.VGPU_TIME]
            if not in_binding:
                return
            # the next pod on the node, after the node agent released the lock: every
            # holder since the last check is in the picture, so no list is read
            await kube.patch_node_annotations(name, {keys.NODE_LOCK: None})
            await poll(lambda: name not in role.scheduler.locks.parsed)
            second = await create_pod(kube, namespace, gpu_pod("q", mem=3000))
            await post(f"{role.url}/filter", {"Pod": second, "NodeNames": [name]})
            mark = len(counting.requests)
            assert await post(f"{role.url}/bind", binding(second, name)) == {"Error": ""}
            assert counting.since(mark) == [
                ("PATCH", f"/api/v1/nodes/{name}"),
                ("POST", f"/api/v1/namespaces/{namespace}/pods/q/binding"),
            ]
    finally:
        await delete_nodes(kube, [name])


async def test_a_watch_event_between_filter_and_bind_keeps_the_reservation(
    kube: Kube, namespace: str
) -> None:
    name = await one_node(kube, "ev")
    key = f"{namespace}/p"
    try:
        async with running_scheduler(kube, FakeClock()) as role:
            cluster = role.scheduler.cluster
            await poll(lambda: name in cluster.nodes)
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=8000))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == [name], answer
            # the pod changes before its bind (a label, a status update, ...)
            await kube.merge_patch(
                f"/api/v1/namespaces/{namespace}/pods/p", {"metadata": {"labels": {"x": "1"}}}
            )
            # a later pod with a decision: once the scheduler has it, it has seen the
            # patch above (one watch stream, in order)
            marker = gpu_pod("marker", mem=100)
            marker["metadata"]["annotations"] = {
                keys.VGPU_NODE: "elsewhere",
                ALLOCATED: "GPU-elsewhere,NVIDIA,100,0:;",
            }
            await create_pod(kube, namespace, marker)
            await poll(lambda: f"{namespace}/marker" in cluster.pods)
            assert cluster.pods[key].reserved
            assert cluster.usage_snapshot()[name] == {f"GPU-{name}-0": (1, 8000, 0)}
            # so a second pod cannot take the device meanwhile
            other = await create_pod(kube, namespace, gpu_pod("other", mem=8000))
            answer = await post(f"{role.url}/filter", {"Pod": other, "NodeNames": [name]})
            assert answer["NodeNames"] == []
            assert await post(f"{role.url}/bind", binding(pod, name)) == {"Error": ""}
            # bind's own write shows up: the hold is the written decision now
            await poll(lambda: key in cluster.pods and not cluster.pods[key].reserved)
            assert cluster.usage_snapshot()[name] == {f"GPU-{name}-0": (1, 8000, 0)}
    finally:
        await delete_nodes(kube, [name])


async def test_a_restart_between_filter_and_bind_loses_the_reservation_only(
    kube: Kube, namespace: str
) -> None:
    name = await one_node(kube, "rs")
    try:
        async with running_scheduler(kube, FakeClock()) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=3000))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == [name], answer
        async with running_scheduler(kube, FakeClock()) as again:
            answer = await post(f"{again.url}/bind", binding(pod, name))
            assert f"no reservation for pod {namespace}/p" in answer["Error"]
            assert "kube-scheduler will schedule it again" in answer["Error"]
            stored = await kube.get_pod(namespace, "p")
            assert "nodeName" not in stored["spec"]  # not bound blindly
            assert keys.VGPU_NODE not in (stored["metadata"].get("annotations") or {})
            # kube-scheduler's next try: filter again, then bind
            answer = await post(f"{again.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == [name], answer
            assert await post(f"{again.url}/bind", binding(pod, name)) == {"Error": ""}
            await kube.patch_node_annotations(name, {keys.NODE_LOCK: None})  # the agent's part
            # a decision written before the restart (by us, or Go HAMi's filter) is kept
            q = gpu_pod("q", mem=3000)
            q["metadata"]["annotations"] = {
                keys.VGPU_NODE: name,
                ALLOCATED: f"GPU-{name}-0,NVIDIA,3000,0:;",
                TO_ALLOCATE: f"GPU-{name}-0,NVIDIA,3000,0:;",
            }
            q = await create_pod(kube, namespace, q)
            key = f"{namespace}/q"
            await poll(lambda: key in again.scheduler.cluster.pods)
            assert await post(f"{again.url}/bind", binding(q, name)) == {"Error": ""}
            stored = await kube.get_pod(namespace, "q")
            assert stored["spec"]["nodeName"] == name
            assert stored["metadata"]["annotations"][keys.BIND_PHASE] == "allocating"
        # a pod asking for no device hami manages is bound without the lock, but only if it
        # names this scheduler and this replica's filter passed it (issue 18 item 6)
        async with running_scheduler(kube, FakeClock()) as third:
            foreign = {
                "metadata": {"name": "foreign"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }
            foreign = await create_pod(kube, namespace, foreign)
            answer = await post(f"{third.url}/bind", binding(foreign, name))
            assert "names scheduler 'default-scheduler'" in answer["Error"], answer
            plain = {
                "metadata": {"name": "plain"},
                "spec": {
                    "schedulerName": third.scheduler.settings.scheduler_name,
                    "containers": [{"name": "c", "image": "busybox"}],
                },
            }
            plain = await create_pod(kube, namespace, plain)
            answer = await post(f"{third.url}/bind", binding(plain, name))
            assert "filter did not pass it" in answer["Error"], answer
            answer = await post(f"{third.url}/filter", {"Pod": plain, "NodeNames": [name]})
            assert answer["NodeNames"] == [name], answer
            assert await post(f"{third.url}/bind", binding(plain, name)) == {"Error": ""}
            for pod_name, node_name in (("foreign", None), ("plain", name)):
                stored = await kube.get_pod(namespace, pod_name)
                assert stored["spec"].get("nodeName") == node_name
    finally:
        await delete_nodes(kube, [name])


async def test_a_failed_binding_marks_the_pod_failed_unless_it_changed_since(
    kube: Kube, namespace: str
) -> None:
    """With the decision written first (``decision_in_binding: false``)."""
    name = await one_node(kube, "un")
    key = f"{namespace}/p"
    cfg = scheduler_config(decision_in_binding=False)
    try:
        async with running_scheduler(kube, FakeClock(), cfg) as role:
            cluster = role.scheduler.cluster
            await poll(lambda: name in cluster.nodes)
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=3000))
            await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            # a Binding the API server refuses (another pod's uid) after the pod write
            wrong = {**binding(pod, name), "PodUID": "not-this-pod"}
            answer = await post(f"{role.url}/bind", wrong)
            assert "creating the Binding" in answer["Error"], answer
            stored = await kube.get_pod(namespace, "p")
            ann = stored["metadata"]["annotations"]
            assert ann[keys.BIND_PHASE] == "failed" and ann[keys.VGPU_NODE] == name
            assert "nodeName" not in stored["spec"]
            node = await kube.get_node(name)
            assert keys.NODE_LOCK not in (node["metadata"].get("annotations") or {})
            assert key not in cluster.reservations
            await poll(lambda: name not in cluster.usage_snapshot())  # failed: holds nothing
            # an undo that comes late (its writes waited for the API server) while the pod
            # was bound meanwhile leaves the pod and its lock alone
            await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            record = cluster.pods[key]
            assert await post(f"{role.url}/bind", binding(pod, name)) == {"Error": ""}
            stale_version = "1"  # any version but the pod's current one
            await role.scheduler.binder.undo(namespace, "p", name, record, stale_version)
            stored = await kube.get_pod(namespace, "p")
            assert stored["metadata"]["annotations"][keys.BIND_PHASE] == "allocating"
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},p")
    finally:
        await delete_nodes(kube, [name])


async def test_a_failed_binding_carrying_the_decision_leaves_the_pod_untouched(
    kube: Kube, namespace: str
) -> None:
    """The Binding carries the decision: one the API server refuses wrote nothing, so the
    pod is left as it was and the lock released. After a Binding that got no answer the
    undo reads the pod: bound (the Binding went through), its lock stays for its Allocate;
    unbound, the lock is released."""
    name = await one_node(kube, "uc")
    key = f"{namespace}/p"
    try:
        async with running_scheduler(kube, FakeClock()) as role:
            cluster = role.scheduler.cluster
            await poll(lambda: name in cluster.nodes)
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=3000))
            await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            wrong = {**binding(pod, name), "PodUID": "not-this-pod"}
            answer = await post(f"{role.url}/bind", wrong)
            assert "creating the Binding" in answer["Error"], answer
            stored = await kube.get_pod(namespace, "p")
            assert stored["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
            node = await kube.get_node(name)
            assert keys.NODE_LOCK not in (node["metadata"].get("annotations") or {})
            assert key not in cluster.reservations

            async def lock_of(node_name: str) -> str | None:
                current = await kube.get_node(node_name)
                return (current["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)

            # a Binding without answer on a pod still unbound: the lock is given back
            await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            record = cluster.pods[key]
            lock = f"2024-05-20T10:00:00Z,{namespace},p"
            await kube.patch_node_annotations(name, {keys.NODE_LOCK: lock})
            await role.scheduler.binder.undo(namespace, "p", name, record, None, unsure=True)
            assert await lock_of(name) is None
            # one that went through: the pod is bound, its lock stays
            await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            record = cluster.pods[key]
            assert await post(f"{role.url}/bind", binding(pod, name)) == {"Error": ""}
            await role.scheduler.binder.undo(namespace, "p", name, record, None, unsure=True)
            assert (await lock_of(name) or "").endswith(f",{namespace},p")
            stored = await kube.get_pod(namespace, "p")
            assert stored["metadata"]["annotations"][keys.BIND_PHASE] == "allocating"
    finally:
        await delete_nodes(kube, [name])


async def test_a_pod_bound_meanwhile_keeps_the_decision_it_runs_with(
    kube: Kube, namespace: str
) -> None:
    """A retried bind must not rewrite the decision of a pod that is already bound: in an
    API outage a Binding whose answer was lost may have gone through, kubelet may already
    run the pod with that decision, and a new one would hand its devices out twice."""
    name = await one_node(kube, "bm")
    try:
        async with running_scheduler(kube, FakeClock()) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=3000))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == [name], answer
            # what an earlier bind of the same pod left: its decision, then the Binding
            earlier = f"GPU-{name}-0,NVIDIA,1000,0:;"
            await kube.patch_pod_annotations(
                namespace,
                "p",
                {
                    keys.VGPU_NODE: name,
                    ALLOCATED: earlier,
                    TO_ALLOCATE: earlier,
                    keys.BIND_PHASE: "allocating",
                },
            )
            meta = pod["metadata"]
            await kube.bind_pod(namespace, "p", meta["uid"], name)

            answer = await post(f"{role.url}/bind", binding(pod, name))
            assert "already bound" in answer["Error"], answer
            ann = (await kube.get_pod(namespace, "p"))["metadata"]["annotations"]
            assert ann[ALLOCATED] == ann[TO_ALLOCATE] == earlier
            assert ann[keys.BIND_PHASE] == "allocating"
            # the pod still counts with what it runs with (the failed bind dropped its
            # hold before: the devices looked free until the pod's next event), and the
            # node lock is not handed to another pod while it waits for its Allocate
            usage = role.scheduler.cluster.usage_snapshot()
            assert usage.get(name) == {f"GPU-{name}-0": (1, 1000, 0)}, usage
            node = await kube.get_node(name)
            lock = (node["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)
            assert lock is None or lock.endswith(f",{namespace},p"), lock
            # kube-scheduler's picture behind ours (it filters the bound pod again): the
            # filter says so and the hold stays
            await poll(lambda: role.scheduler.cluster.pods[f"{namespace}/p"].bound)
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert "already bound" in answer["Error"], answer
            assert role.scheduler.cluster.usage_snapshot() == usage
    finally:
        await delete_nodes(kube, [name])


@pytest.mark.parametrize("deleted", [False, True], ids=["alive", "deleted"])
async def test_our_own_fresh_lock_is_judged_without_reading_its_pod(
    kube: Kube, namespace: str, deleted: bool
) -> None:
    """The next pod's bind finds the lock this replica wrote for a pod it bound a moment
    ago: it waits for the release without reading that pod (a read per pod on a busy
    node). Once the pod watch shows that pod deleted, the lock is judged the usual way:
    the pod is read, found gone, and the lock taken over at once."""
    counting = CountingKube(kube)
    name = await one_node(kube, "ot")
    holder_path = f"/api/v1/namespaces/{namespace}/pods/p1"
    try:
        async with running_scheduler(counting, FakeClock()) as role:
            cluster = role.scheduler.cluster
            await poll(lambda: name in cluster.nodes)
            first = await create_pod(kube, namespace, gpu_pod("p1", mem=1000))
            await post(f"{role.url}/filter", {"Pod": first, "NodeNames": [name]})
            assert await post(f"{role.url}/bind", binding(first, name)) == {"Error": ""}
            second = await create_pod(kube, namespace, gpu_pod("p2", mem=1000))
            await post(f"{role.url}/filter", {"Pod": second, "NodeNames": [name]})
            if deleted:
                await kube.request("DELETE", holder_path, body={"gracePeriodSeconds": 0})
                await poll(lambda: f"{namespace}/p1" not in cluster.pods)
            mark = len(counting.requests)
            bind = asyncio.create_task(post(f"{role.url}/bind", binding(second, name)))
            if deleted:
                assert await asyncio.wait_for(bind, 10) == {"Error": ""}
                sent = counting.since(mark)
                assert ("GET", holder_path) in sent
                # judged at once: no wait for a change that never comes, then a Node read
                assert ("GET", f"/api/v1/nodes/{name}") not in sent
                return
            await asyncio.sleep(0.5)
            assert not bind.done()  # the lock is held: its pod is being allocated
            assert ("GET", holder_path) not in counting.since(mark)
            # the node agent: allocation done, lock released
            await kube.patch_pod_annotations(namespace, "p1", {keys.BIND_PHASE: "success"})
            await kube.patch_node_annotations(name, {keys.NODE_LOCK: None})
            assert await asyncio.wait_for(bind, 10) == {"Error": ""}
            assert ("GET", holder_path) not in counting.since(mark)
    finally:
        await delete_nodes(kube, [name])
