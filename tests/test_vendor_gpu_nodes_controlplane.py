"""Issue 24 item 4 on the real control plane for Hygon DCU, Iluvatar, Moore Threads,
Kunlunxin and MetaX: a real kube-scheduler, with this scheduler as its extender (filter and
bind), places pods written as each vendor's users write them on Nodes annotated, and with
the capacity, exactly as the vendor's device plug-in leaves them for Go HAMi 2.10, and the
decision carries what that plug-in reads.

The Node forms are those of the Go vectors' inputs (tools/gohami-vectors/vendors/cases.json,
read by Go's own ``GetNodeDevices`` in tests/test_go_vendor_vectors.py and
tests/test_go_gpu_vendor_vectors.py); the expected pod values are the forms Go's
``PatchAnnotations`` writes there (tests/data/go-vendor-vectors.json, ``pod_values``):

- Hygon DCU (HAMi's dcu-vgpu-device-plugin): ``hami.io/node-dcu-register`` (7-field),
  ``hami.io/node-handshake-dcu``, capacity ``hygon.com/dcunum``; pods ``hygon.com/dcunum``,
  ``dcumem``, ``dcucores``; values under ``hami.io/dcu-devices-{to-allocate,allocated}``.
- Iluvatar (``BI-V150``): ``hami.io/node-BI-V150-register`` (7-field, every index 0),
  ``hami.io/node-handshake-BI-V150`` in the dotted layout; pods ``iluvatar.ai/BI-V150-vgpu``,
  ``BI-V150.vMem`` (256 MiB units), ``BI-V150.vCore``.
- Moore Threads: no annotation, capacity ``mthreads.com/sgpu-core`` (16 per card) and
  ``sgpu-memory`` (512 MiB units); pods ``mthreads.com/vgpu``, ``sgpu-memory``,
  ``sgpu-core``; values ``hami.io/mthreads-vgpu-devices-allocated`` and
  ``mthreads.com/gpu-index``.
- Kunlunxin: ``kunlun`` from capacity ``kunlunxin.com/xpu`` (pods ``kunlunxin.com/xpu``,
  values ``hami.io/kunlun-allocated`` and ``BAIDU_COM_DEVICE_IDX``), ``XPU`` from the JSON
  ``hami.io/node-register-xpu`` with ``hami.io/node-handshake-xpu`` (pods
  ``kunlunxin.com/vxpu``, ``vxpu-memory``); both choose cards by Go's card sets.
- MetaX: ``Metax-GPU`` from capacity ``metax-tech.com/gpu`` (walked from the last GPU),
  ``Metax-SGPU`` from MetaX's JSON ``metax-tech.com/node-gpu-devices`` (pods
  ``metax-tech.com/sgpu``, ``vmemory`` in GiB, ``vcore``; value
  ``metax-tech.com/gpu-devices-allocated``).

One hami scheduler role (all these backends, a fixed clock, no handshake loop: the vendor
plug-ins' heartbeats are written once, fresh for that clock) and one kube-scheduler serve
the whole module; every pod selects the module's Nodes by label.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from _sched_helpers import FakeClock, delete_nodes, running_scheduler

from hami import config
from hami.kube.client import Kube, open_client
from hami.kube.raw import MERGE_PATCH, KubeError
from hami.protocol import keys
from hami.scheduler.role import SchedulerRole
from hami.testkit.cluster import poll
from hami.testkit.controlplane import ControlPlane, SchedulerProcess

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

LABEL = "hami.io/vendor-nodes-test"
SCHEDULER = "hami-scheduler"
BACKENDS = ("dcu", "BI-V150", "mthreads", "kunlun", "XPU", "Metax-GPU", "Metax-SGPU")


def dashed(fake: FakeClock) -> str:
    """A heartbeat one second old, in the layout of the Hygon vector's node."""
    return "Reported_" + (fake.now() - timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S")


def dotted(fake: FakeClock) -> str:
    """A heartbeat one second old, in the dotted layout of the Iluvatar and XPU vectors."""
    return "Reported_" + (fake.now() - timedelta(seconds=1)).strftime("%Y.%m.%d %H:%M:%S")


def xpu_register(uuids: list[str]) -> str:
    """The ``hami.io/node-register-xpu`` value of the vector ``xpu-register-eight``: Go's
    JSON of its device list, 4 vXPUs of 98304 MiB per card, the second half on NUMA 1."""
    entries = [
        {
            "id": uuid_,
            "index": i,
            "count": 4,
            "devmem": 98304,
            "devcore": 100,
            "type": "XPU-P800",
            "numa": int(i >= 4),
            "health": True,
        }
        for i, uuid_ in enumerate(uuids)
    ]
    return json.dumps(entries, separators=(",", ":"))


def metax_devices(uuids: list[str]) -> str:
    """The ``metax-tech.com/node-gpu-devices`` value of the vector ``metax-sgpu-four``
    (MetaX's JSON, its field order and spacing)."""
    entries = [
        {
            "uuid": uuid_,
            "bdf": f"0000:0{i}:00.0",
            "model": "MXC500",
            "totalDevCount": 16,
            "totalCompute": 100,
            "totalVRam": 65536,
            "availableDevCount": 16,
            "availableCompute": 100,
            "availableVRam": 65536,
            "numa": int(i >= 2),
            "healthy": True,
            "qosPolicy": "best-effort",
            "linkZone": 1,
        }
        for i, uuid_ in enumerate(uuids)
    ]
    return json.dumps(entries)


@dataclass
class Env:
    kube: Kube
    role: SchedulerRole
    namespace: str
    nodes: dict[str, str]  # vendor -> node name
    ids: dict[str, list[str]]  # vendor -> the uuids its register value names

    @property
    def cluster(self) -> Any:
        return self.role.scheduler.cluster


def node_specs(
    fake: FakeClock, nodes: dict[str, str], ids: dict[str, list[str]]
) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """vendor -> (annotations, capacity) of its Node, as its plug-in leaves it."""
    dcu = "".join(f"{u},30,32768,100,DCU-Z100L,{i},true:" for i, u in enumerate(ids["dcu"]))
    ilu = "".join(f"{u},16,32768,100,BI-V150,0,true:" for u in ids["BI-V150"])
    return {
        "dcu": (
            {"hami.io/node-dcu-register": dcu, "hami.io/node-handshake-dcu": dashed(fake)},
            {"hygon.com/dcunum": "60"},
        ),
        "BI-V150": (
            {
                "hami.io/node-BI-V150-register": ilu,
                "hami.io/node-handshake-BI-V150": dotted(fake),
            },
            {},
        ),
        "mthreads": ({}, {"mthreads.com/sgpu-core": "32", "mthreads.com/sgpu-memory": "192"}),
        "kunlun": ({}, {"kunlunxin.com/xpu": "8"}),
        "XPU": (
            {
                "hami.io/node-register-xpu": xpu_register(ids["XPU"]),
                "hami.io/node-handshake-xpu": dotted(fake),
            },
            {},
        ),
        "Metax-GPU": ({}, {"metax-tech.com/gpu": "4"}),
        "Metax-SGPU": ({"metax-tech.com/node-gpu-devices": metax_devices(ids["Metax-SGPU"])}, {}),
    }


async def create_node(
    kube: Kube, name: str, label: str, annotations: dict[str, str], capacity: dict[str, str]
) -> None:
    """A Node with these annotations, and capacity (also allocatable) set through the
    status subresource as kubelet sets it."""
    meta: dict[str, Any] = {"name": name, "labels": {LABEL: label}}
    if annotations:
        meta["annotations"] = annotations
    await kube.request(
        "POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": meta}
    )
    resources = {"cpu": "8", "memory": "64Gi", "pods": "110", **capacity}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    status = {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}}
    await kube.request(
        "PATCH", f"/api/v1/nodes/{name}/status", body=status, content_type=MERGE_PATCH
    )
    # the API server taints every new Node not-ready; without kube-controller-manager the
    # taint stays unless taken off, as kubelet's node lifecycle would
    await kube.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})


def kube_scheduler_config(role: SchedulerRole) -> dict[str, Any]:
    """config/kube-scheduler.yaml's shape, every resource of the role's backends managed."""
    resources = [name for kind in role.scheduler.kinds for name in kind.managed_resources()]
    return {
        "podInitialBackoffSeconds": 1,
        "podMaxBackoffSeconds": 1,
        "profiles": [{"schedulerName": SCHEDULER}],
        "extenders": [
            {
                "urlPrefix": role.url,
                "filterVerb": "filter",
                "bindVerb": "bind",
                "nodeCacheCapable": True,
                "httpTimeout": "30s",
                "weight": 1,
                "managedResources": [
                    {"name": name, "ignoredByScheduler": True} for name in resources
                ],
            }
        ],
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(controlplane: ControlPlane) -> AsyncIterator[Env]:
    fake = FakeClock()
    tag = uuid.uuid4().hex[:6]
    nodes = {vendor: f"{vendor.lower()}-{tag}" for vendor in BACKENDS}
    ids = {
        "dcu": [f"DCU-{tag}-{i}" for i in range(2)],
        "BI-V150": [f"BI-V150-uuid-{tag}-{i}" for i in range(2)],
        "XPU": [f"XPU-{tag}-{i}" for i in range(8)],
        "Metax-SGPU": [f"GPU-mx-{tag}-{i}" for i in range(4)],
    }
    cfg = config.from_mapping(
        {
            "scheduler": {
                "scheduler_name": SCHEDULER,
                "http": {"address": "127.0.0.1", "port": 0},
                "extender": {"address": "127.0.0.1", "port": 0},
                "webhook": {"enabled": False},
                "bind_lock_wait": "10s",
            },
            "backends": {
                "nvidia": {"enabled": False},
                **{vendor: {"enabled": True} for vendor in BACKENDS},
            },
        },
        env={},
    )
    namespace = f"vendors-{tag}"
    sched: SchedulerProcess | None = None
    async with open_client(controlplane.kubeconfig) as kube:
        await kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        try:
            for vendor, (annotations, capacity) in node_specs(fake, nodes, ids).items():
                await create_node(kube, nodes[vendor], tag, annotations, capacity)
            async with running_scheduler(kube, fake, cfg) as role:

                def loaded() -> bool:
                    seen = role.scheduler.cluster.nodes
                    return all(
                        node in seen
                        and vendor in seen[node].types
                        and seen[node].types[vendor].available
                        for vendor, node in nodes.items()
                    )

                await poll(loaded, 20, "every vendor node read")
                sched = controlplane.start_scheduler(
                    kube_scheduler_config(role), f"kube-scheduler-vendors-{tag}", wait=False
                )
                await asyncio.to_thread(sched.wait_ready, 60)
                yield Env(kube, role, namespace, nodes, ids)
        finally:
            if sched is not None:
                sched.stop()
                with contextlib.suppress(ValueError):
                    controlplane.schedulers.remove(sched)
            for pod in await kube.list_pods(namespace=namespace):
                with contextlib.suppress(KubeError):
                    await kube.delete(
                        f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                        {"gracePeriodSeconds": 0},
                    )
            await delete_nodes(kube, list(nodes.values()))
            with contextlib.suppress(KubeError):
                await kube.delete(f"/api/v1/namespaces/{namespace}")


def vendor_pod(
    env: Env, name: str, limits: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod as the vendor's users write it: the vendor's limits (and annotations), the
    hami scheduler, restricted to this module's Nodes."""
    tag = next(iter(env.nodes.values())).rsplit("-", 1)[1]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {LABEL: tag},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


async def scheduled(env: Env, pod: dict[str, Any]) -> dict[str, Any]:
    """Create the pod and wait until kube-scheduler bound it through hami."""
    name = pod["metadata"]["name"]
    await env.kube.create(f"/api/v1/namespaces/{env.namespace}/pods", pod)
    found: dict[str, Any] = {}

    async def bound() -> bool:
        found["pod"] = await env.kube.get_pod(env.namespace, name)
        return bool(found["pod"]["spec"].get("nodeName"))

    await poll(bound, 30, f"pod {name} bound")
    return found["pod"]


async def unschedulable(env: Env, pod: dict[str, Any]) -> str:
    """Create the pod and wait for kube-scheduler's Unschedulable message (hami's reasons)."""
    name = pod["metadata"]["name"]
    await env.kube.create(f"/api/v1/namespaces/{env.namespace}/pods", pod)
    found: dict[str, str] = {}

    async def refused() -> bool:
        stored = await env.kube.get_pod(env.namespace, name)
        for condition in (stored.get("status") or {}).get("conditions") or []:
            if condition.get("reason") == "Unschedulable":
                found["message"] = str(condition.get("message"))
                return True
        return False

    await poll(refused, 30, f"pod {name} unschedulable")
    stored = await env.kube.get_pod(env.namespace, name)
    assert "nodeName" not in stored["spec"]
    return found["message"]


def allocating_on(pod: dict[str, Any], node: str) -> dict[str, str]:
    """The pod is on ``node`` with the bind annotations Go's plug-ins look the pod up by
    (``hami.io/vgpu-node``, ``bind-phase: allocating``); its annotations."""
    assert pod["spec"]["nodeName"] == node
    annotations: dict[str, str] = pod["metadata"]["annotations"]
    assert annotations[keys.VGPU_NODE] == node
    assert annotations[keys.BIND_PHASE] == "allocating"
    return annotations


def held(env: Env, node: str) -> dict[str, tuple[int, int, int]]:
    """uuid -> (slots, MiB, cores) this scheduler holds on ``node``."""
    snapshot: dict[str, tuple[int, int, int]] = env.cluster.usage_snapshot().get(node, {})
    return snapshot


async def node_lock(env: Env, node: str) -> str | None:
    annotations = (await env.kube.get_node(node))["metadata"].get("annotations") or {}
    return annotations.get(keys.NODE_LOCK)


async def plugin_allocated(env: Env, pod: str, node: str) -> None:
    """What a plug-in built on HAMi's node lock does once kubelet's Allocate is answered:
    the pod's ``bind-phase`` becomes ``success`` and the node lock is released."""
    await env.kube.merge_patch(
        f"/api/v1/namespaces/{env.namespace}/pods/{pod}",
        {"metadata": {"annotations": {keys.BIND_PHASE: "success"}}},
    )
    await env.kube.merge_patch(
        f"/api/v1/nodes/{node}", {"metadata": {"annotations": {keys.NODE_LOCK: None}}}
    )


# ------------------------------------------------------------------ Hygon DCU


async def test_hygon_dcu(env: Env) -> None:
    node = env.nodes["dcu"]
    limits = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "4096", "hygon.com/dcucores": "30"}
    pod = await scheduled(env, vendor_pod(env, "dcu-small", limits))
    annotations = allocating_on(pod, node)
    (card,) = held(env, node)
    assert card in env.ids["dcu"]
    value = f"{card},DCU,4096,30:;"  # Go's form (pod value "hygon-one")
    assert annotations["hami.io/dcu-devices-to-allocate"] == value  # the plug-in reads it
    assert annotations["hami.io/dcu-devices-allocated"] == value
    lock = await node_lock(env, node)  # Go's DCU LockNode takes it too
    assert lock is not None and lock.endswith(f",{env.namespace},dcu-small")

    # more than a 32 GiB card
    limits = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "40000"}
    message = await unschedulable(env, vendor_pod(env, "dcu-huge", limits))
    assert "1 2/2 CardInsufficientMemory" in message, message


# ------------------------------------------------------------------ Iluvatar


async def test_iluvatar(env: Env) -> None:
    node = env.nodes["BI-V150"]
    limits = {
        "iluvatar.ai/BI-V150-vgpu": "1",
        "iluvatar.ai/BI-V150.vMem": "64",  # 64 x 256 MiB
        "iluvatar.ai/BI-V150.vCore": "50",
    }
    pod = await scheduled(env, vendor_pod(env, "ilu-half", limits))
    annotations = allocating_on(pod, node)
    (card,) = held(env, node)
    assert card in env.ids["BI-V150"]
    value = f"{card},BI-V150,16384,50:;"  # Go's form (pod value "iluvatar-BI-V150-one")
    assert annotations["hami.io/BI-V150-devices-to-allocate"] == value
    assert annotations["hami.io/BI-V150-devices-allocated"] == value
    lock = await node_lock(env, node)  # Go's Iluvatar LockNode takes it
    assert lock is not None and lock.endswith(f",{env.namespace},ilu-half")

    # 160 x 256 MiB = 40 GiB: more than a 32 GiB BI-V150
    limits = {"iluvatar.ai/BI-V150-vgpu": "1", "iluvatar.ai/BI-V150.vMem": "160"}
    message = await unschedulable(env, vendor_pod(env, "ilu-huge", limits))
    assert "1 2/2 CardInsufficientMemory" in message, message


# ------------------------------------------------------------------ Moore Threads


async def test_moore_threads(env: Env) -> None:
    node = env.nodes["mthreads"]
    # 4 units of 512 MiB, 4 of a card's 16 cores
    limits = {
        "mthreads.com/vgpu": "1",
        "mthreads.com/sgpu-memory": "4",
        "mthreads.com/sgpu-core": "4",
    }
    pod = await scheduled(env, vendor_pod(env, "mt-a", limits))
    annotations = allocating_on(pod, node)
    (card,) = held(env, node)
    index = int(card.rsplit("-", 1)[1])
    assert card == f"{node}-mthreads-{index}"  # Go's id for a card read from capacity
    # Go's form (pod value "mthreads-one"); the plug-in reads the card's index
    assert annotations["hami.io/mthreads-vgpu-devices-allocated"] == f"{card},Mthreads,2048,4:;"
    assert annotations["mthreads.com/gpu-index"] == str(index)

    # Go takes no node lock for Moore Threads (its LockNode does nothing, and the vendor's
    # plug-in releases none): a second pod on the node is bound without waiting for one
    assert await node_lock(env, node) is None
    limits["mthreads.com/sgpu-memory"] = "8"
    pod = await scheduled(env, vendor_pod(env, "mt-b", limits))
    annotations = allocating_on(pod, node)
    index = int(annotations["mthreads.com/gpu-index"])
    card = f"{node}-mthreads-{index}"
    assert annotations["hami.io/mthreads-vgpu-devices-allocated"] == f"{card},Mthreads,4096,4:;"
    assert sum(memory for _, memory, _ in held(env, node).values()) == 2048 + 4096

    # three cards on a node of two
    limits = {"mthreads.com/vgpu": "3"}
    message = await unschedulable(env, vendor_pod(env, "mt-three", limits))
    assert "NodeInsufficientDevice: 3 mthreads devices asked, node has 2" in message, message


# ------------------------------------------------------------------ Kunlunxin


async def test_kunlunxin_whole_cards_take_card_sets(env: Env) -> None:
    node = env.nodes["kunlun"]
    pod = await scheduled(env, vendor_pod(env, "xpu-two", {"kunlunxin.com/xpu": "2"}))
    annotations = allocating_on(pod, node)
    # eight free cards: two come from the first wing of four, its first two cards
    pair = [f"{node}-kunlun-{i}" for i in (0, 1)]
    assert (
        annotations["hami.io/kunlun-allocated"]
        == "".join(f"{card},kunlun,98304,100:" for card in pair) + ";"
    )
    assert annotations["BAIDU_COM_DEVICE_IDX"] == "0,1"
    assert await node_lock(env, node) is None  # Go's kunlun LockNode does nothing

    # four cards: the wing with four free (4-7), not the two left in the first one
    pod = await scheduled(env, vendor_pod(env, "xpu-four", {"kunlunxin.com/xpu": "4"}))
    annotations = allocating_on(pod, node)
    assert annotations["BAIDU_COM_DEVICE_IDX"] == "4,5,6,7"
    assert sorted(held(env, node)) == sorted(
        f"{node}-kunlun-{i}" for i in range(8) if i not in (2, 3)
    )

    # cards 2 and 3 are free, but four cards must be a card set, and three never are
    # (the six cards in use are whole: no memory left; the two free ones make no set)
    shortfall = "1 6/8 CardInsufficientMemory, 2/8 AllocatedCardsInsufficientRequest"
    message = await unschedulable(env, vendor_pod(env, "xpu-four-more", {"kunlunxin.com/xpu": "4"}))
    assert shortfall in message, message
    message = await unschedulable(env, vendor_pod(env, "xpu-three", {"kunlunxin.com/xpu": "3"}))
    assert shortfall in message, message


async def test_kunlunxin_vxpu_slices(env: Env) -> None:
    node = env.nodes["XPU"]
    cards = env.ids["XPU"]
    limits = {"kunlunxin.com/vxpu": "2", "kunlunxin.com/vxpu-memory": "20000"}
    pod = await scheduled(env, vendor_pod(env, "vxpu-quarters", limits))
    annotations = allocating_on(pod, node)
    # rounded up to a quarter card (24576 MiB, 25 %), on two cards of the first wing
    value = f"{cards[0]},XPU,24576,25:{cards[1]},XPU,24576,25:;"
    assert annotations["hami.io/xpu-devices-to-allocate"] == value
    assert annotations["hami.io/xpu-devices-allocated"] == value
    lock = await node_lock(env, node)  # Go's XPU LockNode takes it
    assert lock is not None and lock.endswith(f",{env.namespace},vxpu-quarters")
    await plugin_allocated(env, "vxpu-quarters", node)

    # a half card does not share a card holding quarters: card 2, the first wing's next
    limits = {"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "40000"}
    pod = await scheduled(env, vendor_pod(env, "vxpu-half", limits))
    annotations = allocating_on(pod, node)
    assert annotations["hami.io/xpu-devices-to-allocate"] == f"{cards[2]},XPU,49152,50:;"


# ------------------------------------------------------------------ MetaX


async def test_metax_whole_gpus(env: Env) -> None:
    node = env.nodes["Metax-GPU"]
    pod = await scheduled(env, vendor_pod(env, "mx-two", {"metax-tech.com/gpu": "2"}))
    annotations = allocating_on(pod, node)
    # Go walks the GPUs from the last (pod value "metax-gpu-two")
    value = f"{node}-metax-3,Metax-GPU,65536,100:{node}-metax-2,Metax-GPU,65536,100:;"
    assert annotations["hami.io/metax-gpu-devices-to-allocate"] == value
    assert annotations["hami.io/metax-gpu-devices-allocated"] == value
    assert await node_lock(env, node) is None  # Go's Metax-GPU LockNode does nothing

    pod = await scheduled(env, vendor_pod(env, "mx-two-more", {"metax-tech.com/gpu": "2"}))
    annotations = allocating_on(pod, node)
    value = f"{node}-metax-1,Metax-GPU,65536,100:{node}-metax-0,Metax-GPU,65536,100:;"
    assert annotations["hami.io/metax-gpu-devices-allocated"] == value

    message = await unschedulable(env, vendor_pod(env, "mx-one-more", {"metax-tech.com/gpu": "1"}))
    assert "1 4/4 CardTimeSlicingExhausted" in message, message  # one slot per GPU


async def test_metax_sgpu(env: Env) -> None:
    node = env.nodes["Metax-SGPU"]
    gpus = env.ids["Metax-SGPU"]
    limits = {
        "metax-tech.com/sgpu": "1",
        "metax-tech.com/vmemory": "4",  # GiB
        "metax-tech.com/vcore": "30",
    }
    qos = {"metax-tech.com/sgpu-qos-policy": "best-effort"}
    pod = await scheduled(env, vendor_pod(env, "sgpu-a", limits, qos))
    annotations = allocating_on(pod, node)
    value = f"{gpus[3]},Metax-SGPU,4096,30:;"  # from the last GPU
    assert annotations["hami.io/metax-sgpu-devices-to-allocate"] == value
    assert annotations["hami.io/metax-sgpu-devices-allocated"] == value
    # what MetaX's plug-in reads (pod value "metax-sgpu-two-containers")
    assert json.loads(annotations["metax-tech.com/gpu-devices-allocated"]) == [
        [{"uuid": gpus[3], "compute": 30, "vRam": 4096}]
    ]
    lock = await node_lock(env, node)  # Go's Metax-SGPU LockNode takes it
    assert lock is not None and lock.endswith(f",{env.namespace},sgpu-a")
    await plugin_allocated(env, "sgpu-a", node)

    # a fixed-share pod does not join the best-effort GPU in use: the next from the last
    pod = await scheduled(
        env, vendor_pod(env, "sgpu-b", limits, {"metax-tech.com/sgpu-qos-policy": "fixed-share"})
    )
    annotations = allocating_on(pod, node)
    assert annotations["hami.io/metax-sgpu-devices-allocated"] == f"{gpus[2]},Metax-SGPU,4096,30:;"
    await plugin_allocated(env, "sgpu-b", node)

    limits = {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "80"}
    message = await unschedulable(env, vendor_pod(env, "sgpu-huge", limits))
    assert "1 4/4 CardInsufficientMemory" in message, message
