"""The usage monitor in a node agent against the real control plane: pods named by UID,
Go HAMi's series on /metrics (host series from a fake NVML), priority feedback written into
the files, and gone pods' directories removed (and nothing else)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from _monitor_helpers import Proc, RegionSpec, read_int32, write_region
from _nvml_helpers import FakeGpu, FakeNvml, Handle
from prometheus_client.parser import text_string_to_metric_families

from hami import config
from hami.backends.base import BackendSettings
from hami.backends.nvidia import NvidiaBackend
from hami.kube.client import Kube
from hami.kube.raw import KubeError
from hami.node import NodeAgent
from hami.node.monitor.layout import V0, V1
from hami.node.monitor.pods import ListedPods
from hami.node.monitor.scan import Scanner
from hami.node.monitor.service import UsageMonitor
from hami.testkit import ControlPlane
from hami.testkit.cluster import poll

GPU0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
GIB = 2**30


class UtilNvml(FakeNvml):
    """The fake NVML with utilization rates (host series)."""

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        return SimpleNamespace(gpu=40 + handle.index, memory=10 + handle.index)


@pytest.fixture
def tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hmon-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def nvidia(tmp: Path) -> NvidiaBackend:
    gpus = [
        FakeGpu(0, GPU0, "Tesla V100-PCIE-32GB", 32 * GIB, "0000:3b:00.0"),
        FakeGpu(1, GPU1, "Tesla V100-PCIE-32GB", 32 * GIB, "0000:3c:00.0"),
    ]
    options = {
        "sysfs_root": str(tmp / "sys"),
        "health_checks": False,
        "topology_score": False,
        "hamicore": {"containers_dir": str(tmp / "containers")},
    }
    return NvidiaBackend(BackendSettings(options=options), nvml=UtilNvml(gpus))


async def create_pod(kube: Kube, namespace: str, node: str, containers: list[str]) -> str:
    body = {
        "metadata": {"name": f"p-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "spec": {
            "nodeName": node,
            "containers": [{"name": c, "image": "busybox"} for c in containers],
        },
    }
    pod = await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
    return str(pod["metadata"]["uid"])


async def delete_pod(kube: Kube, namespace: str, uid: str) -> None:
    for pod in await kube.list_pods(namespace=namespace):
        if pod["metadata"]["uid"] == uid:
            path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
            await kube.delete(path, {"gracePeriodSeconds": 0})


def aged(path: Path, seconds: float = 3600) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


async def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as answer,
    ):
        text = await answer.text()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


@pytest.fixture
async def agent(
    controlplane: ControlPlane, kubelet_factory: Any, tmp: Path
) -> AsyncIterator[NodeAgent]:
    node = f"mon-{uuid.uuid4().hex[:6]}"
    kubelet = await kubelet_factory(node)
    cfg = config.from_mapping(
        {"node": {"monitor": {"scan_period": "200ms", "cleanup_grace": "1s"}}}
    )
    (tmp / "containers").mkdir()
    agent = NodeAgent(
        cfg,
        node_name=node,
        kubeconfig=str(controlplane.kubeconfig),
        backends={"nvidia": nvidia(tmp)},
        register_period=1.0,
        device_plugin_dir=str(kubelet.plugin_dir),
        http_address="127.0.0.1",
        http_port=0,
        kubelet_poll=0.2,
        min_backoff=0.2,
    )
    task = asyncio.create_task(agent.run())
    await agent.wait_ready(30)
    yield agent
    await agent.stop()
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_agent_exports_go_hamis_node_series_and_applies_feedback(
    agent: NodeAgent, kube: Kube, namespace: str, tmp: Path
) -> None:
    containers = tmp / "containers"
    high = await create_pod(kube, namespace, agent.node, ["main", "side"])
    low = await create_pod(kube, namespace, agent.node, ["worker"])
    kernel_at = int(time.time()) - 30
    write_region(
        containers,
        high,
        "main",
        RegionSpec(
            layout=V1,
            uuids=(GPU0,),
            limits=(4 * GIB,),
            procs=(Proc(memory={0: (100, 200, 300, 0, 600)}, sm_util={0: 35}),),
            priority=0,
            recent_kernel=5,
            last_kernel_time=kernel_at,
        ),
    )
    write_region(
        containers,
        high,
        "side",
        RegionSpec(
            layout=V0, uuids=(GPU1,), limits=(2 * GIB,), procs=(Proc(memory={0: (1, 2, 3, 4, 10)}),)
        ),
    )
    low_file = write_region(
        containers, low, "worker", RegionSpec(uuids=(GPU0,), priority=1, recent_kernel=5)
    )
    corrupt = containers / f"{low}_broken" / "x.cache"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"not a region at all")

    async def vgpu_series() -> bool:
        return len((await scrape(agent.http_port)).get("hami_vgpu_memory_used_bytes", [])) == 3

    await poll(vgpu_series, 20, "the three containers' hami_vgpu_memory_used_bytes")
    series = await scrape(agent.http_port)
    ns_pod = {
        p["metadata"]["uid"]: p["metadata"]["name"]
        for p in await kube.list_pods(namespace=namespace)
    }

    def only(name: str, **match: str) -> tuple[dict[str, str], float]:
        rows = [(labels, v) for labels, v in series[name] if match.items() <= labels.items()]
        assert len(rows) == 1, (name, match, series.get(name))
        return rows[0]

    main = {"namespace": namespace, "pod": ns_pod[high], "container": "main"}
    labels, value = only("hami_vgpu_memory_used_bytes", **main)
    assert labels == {**main, "vdevice_index": "0", "device_uuid": GPU0, "zone": "vGPU"}
    assert value == 600
    assert only("hami_vgpu_memory_limit_bytes", **main)[1] == 4 * GIB
    assert only("hami_container_device_memory_bytes", **main)[1] == 600
    assert only("hami_vgpu_memory_context_bytes", **main)[1] == 100
    assert only("hami_vgpu_memory_module_bytes", **main)[1] == 200
    assert only("hami_vgpu_memory_buffer_bytes", **main)[1] == 300
    assert only("hami_container_device_utilization_ratio", **main)[1] == 35
    assert only("hami_container_last_kernel_elapsed_seconds", **main)[1] >= 30
    side = {**main, "container": "side"}
    assert only("hami_vgpu_memory_used_bytes", **side)[0]["device_uuid"] == GPU1
    # v0 has no last kernel time: no series, as in Go HAMi
    assert not [
        s
        for s in series["hami_container_last_kernel_elapsed_seconds"]
        if s[0]["container"] == "side"
    ]
    # the low-priority container has no memory in use yet, but is named too
    assert only("hami_vgpu_memory_limit_bytes", container="worker")[1] == 2 * GIB

    # host series from NVML, with Go HAMi's labels
    host, used = only("hami_host_gpu_memory_used_bytes", device_index="1")
    assert host == {
        "node": agent.node,
        "device_index": "1",
        "device_uuid": GPU1,
        "device_type": "NVIDIA-Tesla V100-PCIE-32GB",
        "zone": "vGPU",
    }
    assert used == GIB  # the fake's used memory
    assert only("hami_host_gpu_utilization_ratio", device_index="0")[1] == 40
    ctl, ratio = only("hami_host_gpu_memory_controller_utilization_ratio", device_index="1")
    assert "node" not in ctl and ratio == 11
    assert only("hami_node_monitor_unreadable_regions")[1] >= 1

    # feedback: the high-priority container is active on GPU0, so the low one is blocked
    # and throttled in its own file
    async def throttled() -> bool:
        return read_int32(low_file, V1.utilization_switch) == 1

    await poll(throttled, 10, "the low-priority container's utilization_switch set")
    assert read_int32(low_file, V1.recent_kernel) == -1
    high_file = containers / f"{high}_main" / "a1.cache"
    assert read_int32(high_file, V1.utilization_switch) == 0


async def test_gone_pods_directories_are_removed_after_the_grace(
    agent: NodeAgent, kube: Kube, namespace: str, tmp: Path
) -> None:
    containers = tmp / "containers"
    live = await create_pod(kube, namespace, agent.node, ["main"])
    write_region(containers, live, "main", RegionSpec())
    gone = str(uuid.uuid4())
    write_region(containers, gone, "main", RegionSpec())
    aged(containers / f"{gone}_main")
    # a name that is not a pod UID, and a symlink shaped like a pod's directory: never removed
    odd = containers / "not-a-uid_main"
    odd.mkdir()
    outside = tmp / "outside"
    (outside / "keep").mkdir(parents=True)
    (containers / f"{uuid.uuid4()}_evil").symlink_to(outside, target_is_directory=True)

    await poll(lambda: not (containers / f"{gone}_main").exists(), 20, "the gone pod's dir removed")
    assert (containers / f"{live}_main" / "a1.cache").exists()
    assert odd.is_dir() and (outside / "keep").is_dir()

    await delete_pod(kube, namespace, live)
    await poll(
        lambda: not (containers / f"{live}_main").exists(), 20, "the deleted pod's dir removed"
    )
    assert odd.is_dir() and (outside / "keep").is_dir()


async def test_listed_pods_name_series_and_gate_removal(
    controlplane: ControlPlane, kube: Kube, namespace: str, tmp: Path
) -> None:
    """Without the agent's pod watch (an in-memory client), a periodic list of the node's
    pods: the same mapping and removal rule."""
    node = f"mon-list-{uuid.uuid4().hex[:6]}"
    containers = tmp / "containers"
    live = await create_pod(kube, namespace, node, ["main"])
    write_region(containers, live, "main", RegionSpec())
    gone = str(uuid.uuid4())
    write_region(containers, gone, "c", RegionSpec())
    aged(containers / f"{gone}_c")
    clock = [0.0]
    pods = ListedPods(kube, node, resync=60, min_interval=0, clock=lambda: clock[0])
    monitor = UsageMonitor(node, Scanner([str(containers)], grace=10, clock=lambda: clock[0]), pods)

    snap = await monitor.scan_once()
    assert [(c.pod.namespace, c.pod_uid, c.container) for c in snap.containers] == [
        (namespace, live, "main")
    ]
    assert (containers / f"{gone}_c").exists()  # gone, but not for the grace yet
    clock[0] = 11
    snap = await monitor.scan_once()
    assert not (containers / f"{gone}_c").exists()
    assert snap.removed_total == 1

    # the API server unreachable: no current view, nothing removed
    await delete_pod(kube, namespace, live)
    broken = ListedPods(FailingLister(), node, min_interval=0, clock=lambda: clock[0])
    monitor.pods = broken
    for step in (20, 40):
        clock[0] = step
        await monitor.scan_once()
    assert (containers / f"{live}_main").exists()


class FailingLister:
    async def list_pods(self, **_: Any) -> list[Any]:
        raise KubeError(0, "Unreachable", "connection refused", "/api/v1/pods")
