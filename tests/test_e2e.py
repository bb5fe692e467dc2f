"""End to end on the real control plane (issue 6): kube-scheduler with the hami scheduler
role as its extender, three simulated GPU nodes (node agent with the fake backend + kubelet
emulator), pods created through the API server.

Every scenario checks where the pod landed, its annotations, what the node agent answered
kubelet's ``Allocate`` (as the emulator recorded it), and the final ``;`` / ``success``
state of protocol.md section 4. The cluster is shared by the module; each test starts from
an empty namespace with every node agent running.

The cluster (split count 10 everywhere, 100 slots in all):

    gpu-a100  4 x NVIDIA-A100-SXM4-40GB        40960 MiB
    gpu-v100  4 x NVIDIA-Tesla V100-PCIE-32GB  32768 MiB
    gpu-t4    2 x NVIDIA-Tesla T4              15360 MiB

Expected placements follow docs/scheduler.md "Scoring": a device's utilisation with a hold
``(s, m, c)`` is ``u = ((used+s)/10 + (used_mem+m)/total_mem + (used_cores+c)/100) / 3`` and
a node's score is the mean ``u`` of its devices after the pod. Node policy binpack (the
default) takes the highest score, spread the lowest; device policy spread (the default)
takes the least used device, binpack the most used; ties by name, then index.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from _cluster_checks import assert_not_overcommitted, container_names, holds

from hami import log
from hami.protocol import ContainerDevice, handshake, keys
from hami.testkit.cluster import (
    ALLOCATED,
    SCHEDULER_NAME,
    TO_ALLOCATE,
    LocalCluster,
    NodeSpec,
    Timing,
    annotations_of,
    gpu_pod,
    limits,
    phase_of,
    pod_devices,
    poll,
)
from hami.testkit.controlplane import ControlPlane

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

A100, V100, T4 = "gpu-a100", "gpu-v100", "gpu-t4"
NODES = (
    NodeSpec(A100, ({"count": 4, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},)),
    NodeSpec(V100, ({"count": 4, "model": "NVIDIA-Tesla V100-PCIE-32GB", "memory": 32768},)),
    NodeSpec(T4, ({"count": 2, "model": "NVIDIA-Tesla T4", "memory": 15360},)),
)
TIMING = Timing(register_period=1.0, handshake_period=1.0, handshake_timeout=3.0)
USE_TYPE = "nvidia.com/use-gputype"
NOUSE_TYPE = "nvidia.com/nouse-gputype"
USE_UUID = "nvidia.com/use-gpuuuid"
NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
KUBELET_SAYS_NO = "kubelet reports 0 allocatable nvidia.com/gpu"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    log.configure("warning", "console", stream=sys.__stderr__)
    async with LocalCluster(NODES, plane=controlplane, timing=TIMING, webhook=True) as c:
        yield c


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def clean(cluster: LocalCluster) -> AsyncIterator[None]:
    yield
    for node in cluster.nodes.values():
        if not node.agent_running:
            await node.start_agent()
    await cluster.delete_pods(wait=True)
    await cluster.wait_available(cluster.nodes, True)


# --------------------------------------------------------------------------- helpers


def uuid_of(cluster: LocalCluster, node: str, index: int) -> str:
    return cluster.nodes[node].uuids[index]


async def check_started(
    cluster: LocalCluster, pod: Mapping[str, Any]
) -> dict[str, list[ContainerDevice]]:
    """The whole protocol for a started pod; returns container name -> its devices."""
    name = pod["metadata"]["name"]
    ann = annotations_of(pod)
    assert phase_of(pod) == "Running", (name, pod.get("status"))
    node = pod["spec"]["nodeName"]
    assert ann[keys.VGPU_NODE] == node
    assert ann[keys.BIND_PHASE] == "success"
    names = container_names(pod)
    # protocol.md section 4: erased entries stay, one ';' per container
    assert ann[TO_ALLOCATE] == ";" * len(names), ann
    entries = pod_devices(pod, ALLOCATED)
    assert len(entries) == len(names)
    by_container = {cname: entries[i] for i, (cname, _) in enumerate(names)}
    uuids = set(cluster.nodes[node].uuids)
    admission = await cluster.admission(pod)
    assert admission.phase == "Running", name
    for cname, init in names:
        devices = by_container[cname]
        assert {d.uuid for d in devices} <= uuids, (node, devices)
        calls = admission.for_container(cname)
        if not devices:
            assert calls == []
            continue
        assert (
            len(calls) == 1 and calls[0].init is init and len(calls[0].device_ids) == len(devices)
        )
        env = dict(calls[0].response.envs)
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in devices)
        assert env["CUDA_DEVICE_SM_LIMIT"] == str(devices[0].cores)
        for i, device in enumerate(devices):
            assert env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{device.memory}m"
        assert f"CUDA_DEVICE_MEMORY_LIMIT_{len(devices)}" not in env
    return by_container


async def run_pod(cluster: LocalCluster, pod: dict[str, Any]) -> dict[str, Any]:
    await cluster.create_pod(pod)
    return await cluster.wait_pod(pod["metadata"]["name"], timeout=30)


def assert_accounting_matches(cluster: LocalCluster, pods: Mapping[str, Mapping[str, Any]]) -> None:
    """The role's in-memory usage equals what the pods' annotations say."""
    assert cluster.role is not None
    snapshot = {
        uuid: list(use)
        for devices in cluster.role.scheduler.cluster.usage_snapshot().values()
        for uuid, use in devices.items()
        if use != (0, 0, 0)
    }
    assert snapshot == holds(pods)


async def filtering_failed(cluster: LocalCluster, name: str) -> str:
    found: list[str] = []

    async def seen() -> bool:
        found[:] = [
            e.get("message", "")
            for e in await cluster.events(name)
            if e.get("reason") == "FilteringFailed"
        ]
        return bool(found)

    await poll(seen, 20, f"FilteringFailed event of {name}")
    return found[-1]


# --------------------------------------------------------------------------- request shapes


async def test_count_only_gets_a_whole_device(cluster: LocalCluster) -> None:
    # binpack: T4 (1.1/3/2 = 0.18) beats A100 and V100 (1.1/3/4 = 0.09)
    pod = await run_pod(cluster, gpu_pod("whole", [limits(1)]))
    assert pod["spec"]["nodeName"] == T4
    devices = (await check_started(cluster, pod))["c0"]
    assert [(d.uuid, d.vendor, d.memory, d.cores) for d in devices] == [
        (uuid_of(cluster, T4, 0), "NVIDIA", 15360, 0)
    ]


async def test_memory_request(cluster: LocalCluster) -> None:
    pod = await run_pod(cluster, gpu_pod("mem", [limits(1, mem=3000)]))
    assert pod["spec"]["nodeName"] == T4
    devices = (await check_started(cluster, pod))["c0"]
    assert [(d.memory, d.cores) for d in devices] == [(3000, 0)]
    assert annotations_of(pod)[ALLOCATED] == f"{uuid_of(cluster, T4, 0)},NVIDIA,3000,0:;"


async def test_percentage_request_is_a_share_of_the_chosen_device(cluster: LocalCluster) -> None:
    pod = await run_pod(
        cluster, gpu_pod("pct", [limits(1, pct=25)], annotations={USE_TYPE: "A100"})
    )
    assert pod["spec"]["nodeName"] == A100
    devices = (await check_started(cluster, pod))["c0"]
    assert [(d.memory, d.cores) for d in devices] == [(40960 * 25 // 100, 0)]


async def test_cores_request_sets_the_sm_limit(cluster: LocalCluster) -> None:
    pod = await run_pod(cluster, gpu_pod("cores", [limits(1, mem=2000, cores=30)]))
    assert pod["spec"]["nodeName"] == T4
    devices = (await check_started(cluster, pod))["c0"]
    assert [(d.memory, d.cores) for d in devices] == [(2000, 30)]
    env = (await cluster.admission(pod)).envs["c0"]
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"


async def test_two_devices_in_one_container(cluster: LocalCluster) -> None:
    pod = await run_pod(cluster, gpu_pod("two", [limits(2, mem=1000, cores=20)]))
    assert pod["spec"]["nodeName"] == T4
    devices = (await check_started(cluster, pod))["c0"]
    assert sorted(d.uuid for d in devices) == cluster.nodes[T4].uuids
    assert {(d.memory, d.cores) for d in devices} == {(1000, 20)}
    env = (await cluster.admission(pod)).envs["c0"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "1000m"


async def test_two_containers_spread_over_the_devices(cluster: LocalCluster) -> None:
    pod = await run_pod(
        cluster, gpu_pod("twoc", [limits(1, mem=2000), {}, limits(1, mem=5000, cores=40)])
    )
    assert pod["spec"]["nodeName"] == T4
    by = await check_started(cluster, pod)
    assert by["c1"] == []
    # device spread: the second container avoids the device the first one took
    assert [d.uuid for d in by["c0"]] == [uuid_of(cluster, T4, 0)]
    assert [d.uuid for d in by["c2"]] == [uuid_of(cluster, T4, 1)]
    assert [(d.memory, d.cores) for d in by["c2"]] == [(5000, 40)]
    assert annotations_of(pod)[TO_ALLOCATE] == ";;;"


async def test_init_container_is_allocated_first(cluster: LocalCluster) -> None:
    pod = await run_pod(
        cluster, gpu_pod("init", [limits(1, mem=2000)], init=[limits(1, mem=6000, cores=50)])
    )
    assert pod["spec"]["nodeName"] == T4
    by = await check_started(cluster, pod)
    assert [(d.memory, d.cores) for d in by["init0"]] == [(6000, 50)]
    assert [(d.memory, d.cores) for d in by["c0"]] == [(2000, 0)]
    admission = await cluster.admission(pod)
    assert [(c.container, c.init) for c in admission.containers] == [
        ("init0", True),
        ("c0", False),
    ]
    # the hold on the device is the init peak, not the sum
    assert_accounting_matches(cluster, {"init": pod})


# --------------------------------------------------------------------------- policies


async def test_binpack_and_spread_choose_differently_from_the_same_cluster(
    cluster: LocalCluster,
) -> None:
    # Starting cluster: one pod holding 10000 MiB of A100 device 0.
    anchor = await run_pod(
        cluster,
        gpu_pod(
            "anchor", [limits(1, mem=10000)], annotations={USE_UUID: uuid_of(cluster, A100, 0)}
        ),
    )
    await check_started(cluster, anchor)

    async def probe(name: str, annotations: dict[str, str]) -> tuple[str, str]:
        pod = await run_pod(cluster, gpu_pod(name, [limits(1, mem=3000)], annotations=annotations))
        devices = (await check_started(cluster, pod))["c0"]
        await cluster.delete_pod(name)  # back to the starting cluster
        await poll(lambda: not cluster.tracked(name), 20, f"{name} released")
        return pod["spec"]["nodeName"], devices[0].uuid

    # Node level, 3000 MiB: scores after the pod are
    #   T4   (0.1 + 3000/15360)/3 / 2                          = 0.049
    #   A100 ((0.1 + 10000/40960)/3 + (0.1 + 3000/40960)/3) / 4 = 0.043
    #   V100 (0.1 + 3000/32768)/3 / 4                          = 0.016
    node, _ = await probe("node-binpack", {keys.NODE_SCHEDULER_POLICY: "binpack"})
    assert node == T4
    node, _ = await probe("node-spread", {keys.NODE_SCHEDULER_POLICY: "spread"})
    assert node == V100  # not the A100 node, whose anchor makes it busier

    # Device level, on the A100 node: binpack joins the anchor, spread takes an idle device.
    node, uuid = await probe(
        "dev-binpack", {USE_TYPE: "A100", keys.DEVICE_SCHEDULER_POLICY: "binpack"}
    )
    assert (node, uuid) == (A100, uuid_of(cluster, A100, 0))
    node, uuid = await probe(
        "dev-spread", {USE_TYPE: "A100", keys.DEVICE_SCHEDULER_POLICY: "spread"}
    )
    assert (node, uuid) == (A100, uuid_of(cluster, A100, 1))


# --------------------------------------------------------------------------- selectors


async def test_type_and_uuid_selectors(cluster: LocalCluster) -> None:
    wanted = uuid_of(cluster, A100, 2)
    specs = {
        "use-v100": {USE_TYPE: "v100"},  # case-insensitive substring
        "nouse-t4": {NOUSE_TYPE: "T4"},  # binpack among A100/V100: V100 (0.016 > 0.014)
        "use-uuid": {USE_UUID: wanted},
        "nouse-uuid": {NOUSE_UUID: ",".join(cluster.nodes[T4].uuids)},
    }
    for name, selector in specs.items():
        await cluster.create_pod(gpu_pod(name, [limits(1, mem=3000)], annotations=selector))
    pods = await cluster.wait_running(specs)
    placed = {name: (await check_started(cluster, pod))["c0"][0].uuid for name, pod in pods.items()}
    assert pods["use-v100"]["spec"]["nodeName"] == V100
    assert pods["nouse-t4"]["spec"]["nodeName"] == V100
    assert placed["use-uuid"] == wanted
    assert pods["nouse-uuid"]["spec"]["nodeName"] != T4


# --------------------------------------------------------------------------- no fit


async def test_unfit_pod_waits_with_reasons_and_starts_when_capacity_frees(
    cluster: LocalCluster,
) -> None:
    hog = await run_pod(
        cluster, gpu_pod("hog", [limits(2, mem=10000)], annotations={USE_TYPE: "T4"})
    )
    await check_started(cluster, hog)
    await cluster.create_pod(gpu_pod("waiter", [limits(1, mem=8000)], annotations={USE_TYPE: "T4"}))
    message = await filtering_failed(cluster, "waiter")
    assert "0/3 nodes are available" in message, message
    assert "2/2 CardInsufficientMemory" in message, message
    assert "4/4 CardTypeMismatch" in message, message
    pod = await cluster.get_pod("waiter")
    assert phase_of(pod) == "Pending" and not pod["spec"].get("nodeName")
    assert keys.VGPU_NODE not in annotations_of(pod)

    await cluster.delete_pod("hog")
    # kube-scheduler retries the pod by itself (pod delete event or its 1 s back-off)
    pod = await cluster.wait_pod("waiter", timeout=20)
    assert pod["spec"]["nodeName"] == T4
    assert [(d.memory, d.cores) for d in (await check_started(cluster, pod))["c0"]] == [(8000, 0)]


# --------------------------------------------------------------------------- burst


async def test_burst_of_100_pods_fills_the_cluster_exactly(cluster: LocalCluster) -> None:
    # 100 pods x (1 slot, 1000 MiB, 10 % cores) = exactly 10 slots and 100 % cores of each
    # of the 10 devices: any double booking leaves a pod Pending or a device over 100 %.
    names = [f"burst-{i:03d}" for i in range(100)]
    for name in names:
        await cluster.create_pod(gpu_pod(name, [limits(1, mem=1000, cores=10)]))
    pods = await cluster.wait_running(names, timeout=120)
    for pod in pods.values():
        await check_started(cluster, pod)
    assert_not_overcommitted(cluster, pods)
    assert_accounting_matches(cluster, pods)
    per_device = holds(pods)
    assert len(per_device) == 10
    assert all(h == [10, 10000, 100] for h in per_device.values()), per_device


# --------------------------------------------------------------------------- node agent down


async def test_stopped_node_agent_makes_its_node_unavailable_then_it_comes_back(
    cluster: LocalCluster,
) -> None:
    t4 = cluster.nodes[T4]
    assert t4.kubelet is not None and cluster.role is not None
    await t4.stop_agent()
    # the handshake times out too (it alone would keep the node off if kubelet said yes)
    timed_out = asyncio.create_task(
        poll(lambda: handshake_reason(cluster, T4) is not None, 15, "T4 handshake timed out")
    )
    # protocol.md §2 "kubelet's word wins when it says no": the plugin's socket is gone, so
    # kubelet reports 0 allocatable at once, well before the handshake could time out
    took = await cluster.wait_available([T4], False, timeout=15)
    assert took < TIMING.handshake_timeout, took
    assert cluster.available(A100) and cluster.available(V100)
    reasons = cluster.role.scheduler.explain_pod(gpu_pod("probe", [limits(1, mem=3000)]))
    assert reasons["nodes"][T4].startswith(KUBELET_SAYS_NO), reasons

    pod = await run_pod(cluster, gpu_pod("avoid", [limits(1, mem=3000)]))
    assert pod["spec"]["nodeName"] == V100  # binpack's next best once T4 is gone
    await check_started(cluster, pod)

    # the last heartbeat is at most one register period old; the scheduler's stamp times out
    # on the first pass after the timeout (second-resolution stamps: +1 s)
    took = await timed_out
    limit = TIMING.handshake_timeout + TIMING.handshake_period + TIMING.register_period + 1
    assert took <= limit, (took, limit)
    assert handshake_reason(cluster, T4) == handshake.HANDSHAKE_TIMED_OUT
    assert not cluster.available(T4)

    # Back: T4 is available once kubelet has the *new* registration's devices in allocatable
    # and the role has seen both that and the agent's heartbeat. (start_agent waits for the
    # emulator's plugin state; the agent is "ready" when it serves, before it registers. That
    # state could once be the stopped plugin's: a Node status written before the new
    # stream's first answer then said 0 allocatable, turning T4 off again just as "back" was
    # placed, and it went to V100. A state whose socket was replaced no longer counts.)
    kubelet, registered = t4.kubelet, len(t4.kubelet.registrations)
    await t4.start_agent()
    assert len(kubelet.registrations) > registered
    assert kubelet.plugins["nvidia.com/gpu"].connected
    took = await cluster.wait_available([T4], True, timeout=15)
    assert took <= TIMING.register_period + TIMING.handshake_period + 2
    pod = await run_pod(cluster, gpu_pod("back", [limits(1, mem=3000)]))
    assert pod["spec"]["nodeName"] == T4
    await check_started(cluster, pod)


def handshake_reason(cluster: LocalCluster, node: str) -> str | None:
    """What the handshake alone says of the node's nvidia type now (None: available)."""
    assert cluster.role is not None
    state = cluster.role.scheduler.cluster.nodes[node].types["nvidia"]
    return handshake.decide(
        state.handshake_value,
        has_register=True,
        now=datetime.now(UTC),
        timeout=timedelta(seconds=TIMING.handshake_timeout),
    ).reason


# --------------------------------------------------------------------------- scheduler restart


async def test_scheduler_role_restart_mid_burst_loses_no_pod(cluster: LocalCluster) -> None:
    # 20 pods x 50 % cores fill the 10 devices exactly.
    names = [f"rs-{i:02d}" for i in range(20)]
    for name in names:
        await cluster.create_pod(gpu_pod(name, [limits(1, mem=2000, cores=50)]))

    running: list[int] = [0]

    async def some_running() -> bool:
        running[0] = sum(phase_of(p) == "Running" for p in await cluster.list_pods())
        return running[0] >= 4

    await poll(some_running, 60, "first pods running", interval=0.05)
    await cluster.restart_role()
    assert running[0] < len(names), "the restart came after the burst, not in the middle"
    pods = await cluster.wait_running(names, timeout=90)
    for pod in pods.values():
        await check_started(cluster, pod)
    assert_not_overcommitted(cluster, pods)
    assert_accounting_matches(cluster, pods)
    assert all(h[2] == 100 for h in holds(pods).values())


# --------------------------------------------------------------------------- webhook


async def test_webhook_in_the_admission_chain_routes_the_pod_to_hami(
    cluster: LocalCluster,
) -> None:
    pod = gpu_pod("hooked", [limits(1)], scheduler_name=None)
    pod["metadata"]["labels"] = dict(cluster.node_selector)  # the test webhook's objectSelector
    created = await cluster.create_pod(pod)
    assert created["spec"]["schedulerName"] == SCHEDULER_NAME
    # count-only means the whole device: the webhook adds gpucores 100
    assert created["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "100"
    pod = await cluster.wait_pod("hooked")
    devices = (await check_started(cluster, pod))["c0"]
    assert [(d.memory, d.cores) for d in devices] == [(15360, 100)]
    assert (await cluster.admission(pod)).envs["c0"]["CUDA_DEVICE_SM_LIMIT"] == "100"
