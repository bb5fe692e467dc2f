"""Task priority (issue 10 item 8): the container limit ``nvidia.com/priority`` (0 high,
1 low) is a managed, scheduler-ignored resource and becomes HAMi-core's
``CUDA_TASK_PRIORITY`` in the Allocate answer (protocol.md §8)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from hami import log
from hami.backends import AllocationRequest, BackendSettings
from hami.backends.fake import FakeBackend
from hami.backends.hamicore import HamiCorePaths, hamicore_allocation
from hami.backends.nvidia import NvidiaBackend
from hami.core.requests import DeviceKind, RequestError, asks_for, parse_pod
from hami.protocol import ContainerDevice
from hami.scheduler.webhook import mutations
from hami.testkit.cluster import CLUSTER_LABEL, LocalCluster, NodeSpec, Timing, gpu_pod, limits
from hami.testkit.controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[1]
PRIORITY = "nvidia.com/priority"
GPU = ContainerDevice("GPU-a", "NVIDIA", 3000, 0)


def request(limits_: dict[str, Any]) -> AllocationRequest:
    return AllocationRequest(
        pod_namespace="ns",
        pod_name="p",
        pod_uid="uid-1",
        container_name="c",
        container_index=0,
        devices=[GPU],
        node_devices=[],
        container_limits=limits_,
    )


def nvidia_kind() -> DeviceKind:
    return DeviceKind.from_backend(NvidiaBackend(nvml=object()))


def test_the_priority_limit_becomes_cuda_task_priority() -> None:
    paths = HamiCorePaths()
    for value, env in (("0", "0"), ("1", "1"), (1, "1")):
        answer = hamicore_allocation(request({PRIORITY: value}), paths, priority_resource=PRIORITY)
        assert answer.envs["CUDA_TASK_PRIORITY"] == env
    plain = hamicore_allocation(request({}), paths, priority_resource=PRIORITY)
    assert "CUDA_TASK_PRIORITY" not in plain.envs
    # a value no scheduler checked is left out, never a failed start
    odd = hamicore_allocation(request({PRIORITY: "0.5"}), paths, priority_resource=PRIORITY)
    assert "CUDA_TASK_PRIORITY" not in odd.envs


def test_nvidia_and_fake_backends_answer_with_the_priority() -> None:
    nvidia = NvidiaBackend(nvml=object())
    fake = FakeBackend(BackendSettings(options={"devices": []}))
    for backend in (nvidia, fake):
        assert backend.priority_resource == PRIORITY
        envs = backend.allocate(request({PRIORITY: "1", "nvidia.com/gpu": "1"})).envs
        assert envs["CUDA_TASK_PRIORITY"] == "1"
    other = FakeBackend(BackendSettings(options={"devices": [], "type": "npu"}))
    assert other.priority_resource is None


def test_priority_is_a_managed_resource_not_a_device_count() -> None:
    kind = nvidia_kind()
    assert PRIORITY in kind.managed_resources()
    assert PRIORITY not in kind.resources.all()
    container = {"name": "c", "resources": {"limits": {PRIORITY: "0"}}}
    assert asks_for(container, [kind])
    # priority alone asks for no device
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [container]}}
    assert parse_pod(pod, [kind]) is None
    with_gpu = {**container, "resources": {"limits": {PRIORITY: "1", "nvidia.com/gpu": "1"}}}
    parsed = parse_pod({**pod, "spec": {"containers": [with_gpu]}}, [kind])
    assert parsed is not None and parsed.containers[0][0].count == 1


def test_an_unreadable_priority_is_refused_with_the_fix() -> None:
    kind = nvidia_kind()
    for value in ("-1", "0.5", "high"):
        container = {"name": "c", "resources": {"limits": {PRIORITY: value, "nvidia.com/gpu": 1}}}
        pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [container]}}
        with pytest.raises(RequestError, match=r"nvidia.com/priority.*0 \(high\) or 1 \(low\)"):
            parse_pod(pod, [kind])


def test_the_webhook_sends_a_priority_only_pod_to_hami() -> None:
    # Without hami's scheduler (and its managedResources), default-scheduler would keep it
    # Pending with "Insufficient nvidia.com/priority".
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {PRIORITY: "1"}}}]},
    }
    ops = mutations(pod, [nvidia_kind()], "hami-scheduler")
    assert {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in ops


def test_shipped_kube_scheduler_configs_ignore_the_priority() -> None:
    def managed(config: dict[str, Any]) -> set[str]:
        (extender,) = config["extenders"]
        return {r["name"] for r in extender["managedResources"] if r["ignoredByScheduler"]}

    shipped = yaml.safe_load((ROOT / "config/kube-scheduler.yaml").read_text())
    assert PRIORITY in managed(shipped)
    for doc in yaml.safe_load_all((ROOT / "docker/manifests/20-config.yaml").read_text()):
        if doc and doc.get("kind") == "ConfigMap" and "kube-scheduler.yaml" in doc["data"]:
            assert PRIORITY in managed(yaml.safe_load(doc["data"]["kube-scheduler.yaml"]))
            break
    else:
        pytest.fail("no kube-scheduler ConfigMap in docker/manifests/20-config.yaml")


# --------------------------------------------------------------------------- end to end

NODE = "prio-node"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    log.configure("warning", "console", stream=sys.__stderr__)
    nodes = (NodeSpec(NODE, ({"count": 1, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},)),)
    timing = Timing(register_period=1.0, handshake_period=1.0, handshake_timeout=3.0)
    async with LocalCluster(nodes, plane=controlplane, timing=timing, webhook=True) as c:
        yield c


@pytest.mark.controlplane
@pytest.mark.asyncio(loop_scope="module")
async def test_a_priority_pod_is_scheduled_and_gets_cuda_task_priority(
    cluster: LocalCluster,
) -> None:
    # through the webhook (the cluster's label opts a pod in), which sets the scheduler
    pod = gpu_pod("prio", [{**limits(1, mem=2000), PRIORITY: "1"}], scheduler_name=None)
    pod["metadata"]["labels"] = {CLUSTER_LABEL: cluster.id}
    await cluster.create_pod(pod)
    created = await cluster.wait_pod("prio", timeout=20)
    # before: Pending, "0/1 nodes are available: 1 Insufficient nvidia.com/priority"
    assert created["status"]["phase"] == "Running", created.get("status")
    (extender,) = cluster.kube_scheduler_config()["extenders"]
    assert {"name": PRIORITY, "ignoredByScheduler": True} in extender["managedResources"]
    assert created["spec"]["nodeName"] == NODE
    # in the container spec too (the webhook, as Go HAMi's), for Go HAMi's device plugin
    assert {"name": "CUDA_TASK_PRIORITY", "value": "1"} in created["spec"]["containers"][0]["env"]
    env = (await cluster.admission(created)).envs["c0"]
    assert env["CUDA_TASK_PRIORITY"] == "1"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"


@pytest.mark.controlplane
@pytest.mark.asyncio(loop_scope="module")
async def test_a_memory_only_pod_gets_a_count_and_its_limit(cluster: LocalCluster) -> None:
    """``nvidia.com/gpumem`` alone: the webhook adds ``nvidia.com/gpu: 1`` (Go HAMi's
    defaultGPUNum), so kubelet calls Allocate and HAMi-core caps the memory. Before, the pod
    ran with no limit at all and its node stayed locked until the allocation timeout."""
    pod = gpu_pod("share", [limits(None, mem=1500)], scheduler_name=None)
    pod["metadata"]["labels"] = {CLUSTER_LABEL: cluster.id}
    await cluster.create_pod(pod)
    created = await cluster.wait_pod("share", timeout=20)
    assert created["status"]["phase"] == "Running", created.get("status")
    assert created["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = (await cluster.admission(created)).envs["c0"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1500m"
    assert created["metadata"]["annotations"]["hami.io/bind-phase"] == "success"
