"""Binds queued on a node whose agent dies meanwhile are refused, not sent to a kubelet that
has nothing to give (issue 18 item 2).

On the real control plane (kube-scheduler + the hami role + a simulated node whose agent is a
``hami run --role node`` process): ten pods are placed on the node while another pod holds
its lock, so their binds wait in the node's queue; the agent is killed with SIGKILL (kubelet
drops the allocatable count at once), the lock is released, and a new agent process starts a
few seconds later. Before the fence every queued bind went through and its
pod ended ``Failed`` (``UnexpectedAdmissionError``); now each is refused while the type is
unavailable, kube-scheduler places it again, and all ten run once the agent is back.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from _cluster_checks import assert_answers_within_devices, assert_not_overcommitted
from _node_helpers import spawn_node_agent

from hami.kube.client import Kube
from hami.protocol import NodeLock, keys
from hami.scheduler.service import utcnow
from hami.testkit.cluster import (
    LocalCluster,
    NodeSpec,
    SimNode,
    Timing,
    gpu_pod,
    limits,
    phase_of,
    poll,
)
from hami.testkit.controlplane import ControlPlane

pytestmark = pytest.mark.controlplane

NODE = "gone-0"
DEVICES = {"count": 2, "model": "NVIDIA-Tesla T4", "memory": 15360}
SPLIT = 10
NODES = (NodeSpec(NODE, (DEVICES,), SPLIT),)
PODS = 10
TIMING = Timing(handshake_timeout=600.0, bind_lock_wait=20.0)


@pytest.fixture
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(NODES, plane=controlplane, timing=TIMING) as c:
        yield c


def _agent_config(cluster: LocalCluster, node: SimNode) -> Path:
    """The node's agent as a process: the same fake devices and uuids as the in-process one."""
    assert node.kubelet is not None
    cfg = {
        "log": {"level": "warning", "format": "json"},
        "node": {
            "register_period": f"{cluster.timing.register_period}s",
            "device_plugin_dir": str(node.kubelet.plugin_dir),
            "http": {"address": "127.0.0.1", "port": 0},
        },
        "backends": {
            "nvidia": {"enabled": False},
            "fake": {
                "enabled": True,
                "split_count": SPLIT,
                "devices": [DEVICES],
                "uuid_prefix": node.uuid_prefix,
                "hamicore": {"containers_dir": str(node.dir / "vgpu")},
            },
        },
    }
    path = node.dir / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def test_binds_queued_on_a_node_whose_agent_died_are_refused_and_placed_again(
    cluster: LocalCluster, kube: Kube
) -> None:
    role = cluster.role
    assert role is not None
    node = cluster.nodes[NODE]
    assert node.kubelet is not None
    config = _agent_config(cluster, node)
    await node.stop_agent()  # the in-process agent gives way to a process
    agents = [await spawn_node_agent(config, cluster.kubeconfig, NODE, output=None)]
    try:
        await node.kubelet.wait_for_resource("nvidia.com/gpu", healthy=2 * SPLIT)
        await cluster.wait_available([NODE], True, timeout=15)
        await _kill_and_restart(cluster, kube, agents, config)
    finally:
        for process in agents:
            if process.returncode is None:
                process.send_signal(signal.SIGKILL)
                await process.wait()


async def _kill_and_restart(
    cluster: LocalCluster, kube: Kube, agents: list[asyncio.subprocess.Process], config: Path
) -> None:
    role = cluster.role
    assert role is not None
    agent = agents[0]
    holder = await cluster.create_pod(gpu_pod("holder", [{}], scheduler_name="nobody"))
    lock = NodeLock(utcnow(), holder["metadata"]["namespace"], "holder").encode()
    await kube.patch_node_annotations(NODE, {keys.NODE_LOCK: lock})
    names = [f"q{i}" for i in range(PODS)]
    for name in names:
        await cluster.create_pod(gpu_pod(name, [limits(1, mem=1000)]))

    async def queued() -> bool:
        return role.scheduler.binder.queue.waiting(NODE) >= 2

    await poll(queued, 30, "binds waiting on the held lock")
    agent.send_signal(signal.SIGKILL)
    await agent.wait()
    await cluster.wait_available([NODE], False, timeout=15)
    await kube.patch_node_annotations(NODE, {keys.NODE_LOCK: None})  # the holder is done

    async def queue_drained() -> bool:
        return role.scheduler.binder.queue.waiting(NODE) == 0

    await poll(queue_drained, 30, "the queued binds answered")
    refused = role.scheduler.metrics.bind_total.labels("failed", "refused")._value.get()
    assert refused >= 2, refused
    await asyncio.sleep(1.0)
    agents.append(await spawn_node_agent(config, cluster.kubeconfig, NODE, output=None))
    await cluster.wait_available([NODE], True, timeout=30)

    async def all_running() -> bool:
        return all(phase_of(p) == "Running" for p in await _ours(cluster, names))

    await poll(all_running, 120, "every pod running after the agent is back")
    pods = {p["metadata"]["name"]: p for p in await _ours(cluster, names)}
    assert not [n for n, p in pods.items() if phase_of(p) == "Failed"]
    assert_not_overcommitted(cluster, pods)
    assert_answers_within_devices(cluster)


async def _ours(cluster: LocalCluster, names: list[str]) -> list[dict]:
    return [p for p in await cluster.list_pods() if p["metadata"]["name"] in names]
