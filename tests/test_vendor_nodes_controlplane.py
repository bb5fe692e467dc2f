"""Issue 24 item 4 on the real control plane, no Go needed: this scheduler places pods on
Nodes annotated exactly as Go HAMi 2.10's vendor setups leave them, and writes what their
device plug-ins read.

- Cambricon (Go 2.10's model): no register annotation at all; Cambricon's dynamic-sMLU plug-in
  advertises ``cambricon.com/mlu.smlu.vcore`` (100 per card) and ``mlu.smlu.vmemory``
  (256 MiB units) and kubelet puts them in status.capacity, which is all Go's scheduler reads.
  A bind takes Go's ``cambricon.com/dsmlu.lock`` (an RFC 3339 time), which the plug-in
  removes after Allocate with a JSON patch; the test does that removal in its place.
- Huawei Ascend: HAMi's ascend-device-plugin writes ``hami.io/node-register-{type}`` (Go's
  JSON of its device list: one entry per chip, the vNPUs of the smallest template as count,
  a ``NetworkID`` for 910 chips), ``hami.io/node-handshake-{type}`` as ``Reported_`` with its
  dotted time layout, and ``hami-vnpu-core``.

The values are written as those plug-ins write them (the layouts are facts from their code;
the Ascend ones by hami.testkit.ascend_node, the annotations-only stand-in;
tests/test_go_ascend_vectors.py checks the reading against Go's own function).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from _sched_helpers import (
    FakeClock,
    binding,
    create_pod,
    delete_nodes,
    post,
    running_scheduler,
    unique,
)

from hami import config
from hami.kube.client import Kube
from hami.kube.raw import MERGE_PATCH
from hami.protocol import keys
from hami.protocol.nodelock import rfc3339
from hami.testkit.ascend_node import ascend_annotations, ascend_register
from hami.testkit.cluster import poll


def scheduler_config(backends: dict[str, Any]) -> config.Config:
    raw: dict[str, Any] = {
        "scheduler": {
            "http": {"address": "127.0.0.1", "port": 0},
            "extender": {"address": "127.0.0.1", "port": 0},
            "webhook": {"enabled": False},
            "bind_lock_wait": "20s",
        },
        "backends": {"nvidia": {"enabled": False}, **backends},
    }
    return config.from_mapping(raw, env={})


async def create_node(
    kube: Kube, name: str, annotations: dict[str, str], capacity: dict[str, str]
) -> None:
    """A Node with ``annotations``, and ``capacity`` (also allocatable) set through the
    status subresource as kubelet sets it."""
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    if annotations:
        body["metadata"] = {"name": name, "annotations": annotations}
    await kube.request("POST", "/api/v1/nodes", body=body)
    resources = {"cpu": "8", "pods": "110", **capacity}
    status = {"status": {"capacity": resources, "allocatable": resources}}
    await kube.request(
        "PATCH", f"/api/v1/nodes/{name}/status", body=status, content_type=MERGE_PATCH
    )


def device_pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


async def place(role: Any, kube: Kube, namespace: str, pod: dict[str, Any], node: str) -> Any:
    """Filter then bind as kube-scheduler does; the stored pod after the bind."""
    created = await create_pod(kube, namespace, pod)
    answer = await post(f"{role.url}/filter", {"Pod": created, "NodeNames": [node]})
    assert answer["NodeNames"] == [node], answer
    assert await post(f"{role.url}/bind", binding(created, node)) == {"Error": ""}
    stored = await kube.get_pod(namespace, pod["metadata"]["name"])
    assert stored["spec"]["nodeName"] == node
    return stored["metadata"]["annotations"]


# ------------------------------------------------------------------ Cambricon


async def test_a_pod_lands_on_a_node_of_cambricons_own_plugin(kube: Kube, namespace: str) -> None:
    fake = FakeClock()
    name = unique("mlu-go")
    await create_node(
        kube,
        name,
        {},  # Go 2.10 reads no annotation for Cambricon
        {
            "cambricon.com/vmlu": "20",
            "cambricon.com/mlu.smlu.vcore": "200",  # two cards
            "cambricon.com/mlu.smlu.vmemory": "184",  # 92 x 256 MiB each
        },
    )
    cfg = scheduler_config({"mlu": {"enabled": True}})
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            cluster = role.scheduler.cluster
            await poll(lambda: name in cluster.nodes and "mlu" in cluster.nodes[name].types)
            limits = {
                "cambricon.com/vmlu": "1",
                "cambricon.com/mlu.smlu.vmemory": "4",
                "cambricon.com/mlu.smlu.vcore": "10",
            }
            annotations = await place(role, kube, namespace, device_pod("p", limits), name)
            card = f"{name}-cambricon-mlu-0"  # Go's id for the first card it reads
            value = f"{card},MLU,1024,10:;"
            assert annotations["hami.io/cambricon-mlu-devices-allocated"] == value
            assert annotations["hami.io/cambricon-mlu-devices-to-allocate"] == value
            # what Cambricon's plug-in reads: card 0, 10 % of it, 4 memory units
            assert annotations["CAMBRICON_DSMLU_PROFILE"] == "0_10_4"
            assert annotations["CAMBRICON_DSMLU_ASSIGNED"] == "false"
            assert cluster.usage_snapshot()[name] == {card: (1, 1024, 10)}
            # the bind took Go's Cambricon lock, with Go's value, and not hami.io/mutex.lock
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][DSMLU_LOCK] == rfc3339(fake.now())
            assert keys.NODE_LOCK not in node["metadata"]["annotations"]

            # a second pod on the node waits while the first one has not been allocated
            second = asyncio.create_task(
                place(role, kube, namespace, device_pod("q", limits), name)
            )
            await asyncio.sleep(2.0)
            assert not second.done()
            fake.advance(30)
            await plugin_allocated(kube, namespace, "p", name)
            annotations = await asyncio.wait_for(second, 15)
            assert annotations["CAMBRICON_DSMLU_ASSIGNED"] == "false"
            node = await kube.get_node(name)
            assert node["metadata"]["annotations"][DSMLU_LOCK] == rfc3339(fake.now())
            await plugin_allocated(kube, namespace, "q", name)
            node = await kube.get_node(name)
            assert DSMLU_LOCK not in node["metadata"].get("annotations", {})
    finally:
        await delete_nodes(kube, [name])


DSMLU_LOCK = "cambricon.com/dsmlu.lock"


async def plugin_allocated(kube: Kube, namespace: str, pod: str, node: str) -> None:
    """What Cambricon's dynamic-sMLU plug-in does after creating a pod's sMLU: mark the pod
    assigned, then remove the node lock with a JSON patch (it never reads the value)."""
    await kube.patch_pod_annotations(namespace, pod, {"CAMBRICON_DSMLU_ASSIGNED": "true"})
    remove = [{"op": "remove", "path": "/metadata/annotations/cambricon.com~1dsmlu.lock"}]
    await kube.request(
        "PATCH", f"/api/v1/nodes/{node}", body=remove, content_type="application/json-patch+json"
    )


# ------------------------------------------------------------------ Ascend


async def test_pods_land_on_nodes_of_the_ascend_device_plugin(kube: Kube, namespace: str) -> None:
    fake = FakeClock()
    b3, c = unique("npu-b3"), unique("npu-c")
    b3_chips = [f"d1f0c8e2-0000-4000-8000-00000000000{i}" for i in range(8)]
    c_npus = [f"5a2b7c10-0000-4000-8000-00000000000{i}" for i in range(4)]
    await create_node(
        kube,
        b3,
        ascend_annotations(
            "Ascend910B3", ascend_register("Ascend910B3", b3_chips, 65536, 20, 4), fake.now()
        ),
        {"huawei.com/Ascend910B3": "32"},
    )
    await create_node(
        kube,
        c,
        ascend_annotations(
            "Ascend910C", ascend_register("Ascend910C", c_npus, 65536, 20, 4), fake.now()
        ),
        {"huawei.com/Ascend910C": "16"},
    )
    cfg = scheduler_config({"Ascend910B3": {"enabled": True}, "Ascend910C": {"enabled": True}})
    try:
        async with running_scheduler(kube, fake, cfg) as role:
            cluster = role.scheduler.cluster

            def loaded(node: str, word: str) -> bool:
                state = cluster.nodes.get(node)
                return state is not None and word in state.types and state.types[word].available

            await poll(lambda: loaded(b3, "Ascend910B3") and loaded(c, "Ascend910C"))

            # 3000 MiB is served by the smallest vNPU template, 16384 MiB (vir05_1c_16g)
            limits = {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "3000"}
            annotations = await place(role, kube, namespace, device_pod("b3", limits), b3)
            (chip,) = cluster.usage_snapshot()[b3]
            assert chip in b3_chips
            value = f"{chip},Ascend910B3,16384,0:;"
            assert annotations["hami.io/Ascend910B3-devices-allocated"] == value
            assert annotations["hami.io/Ascend910B3-devices-to-allocate"] == value
            assert json.loads(annotations["huawei.com/Ascend910B3"]) == [
                {"UUID": chip, "temp": "vir05_1c_16g", "memory": 16384}
            ]
            node = await kube.get_node(b3)
            assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},b3")

            # one 910C device is one 2-NPU module: both NPUs of one module
            limits = {"huawei.com/Ascend910C": "1"}
            annotations = await place(role, kube, namespace, device_pod("c", limits), c)
            held = sorted(cluster.usage_snapshot()[c])
            assert held in (sorted(c_npus[:2]), sorted(c_npus[2:]))
            runtime = json.loads(annotations["huawei.com/Ascend910C"])
            assert sorted(entry["UUID"] for entry in runtime) == held
            assert all(entry == {"UUID": entry["UUID"], "memory": 65536} for entry in runtime)
            assert annotations["hami.io/Ascend910C-devices-to-allocate"].count("Ascend910C") == 2
    finally:
        await delete_nodes(kube, [b3, c])
