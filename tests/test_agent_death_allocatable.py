"""A node agent that dies takes its node out of scheduling within seconds (issue 9 item 6).

On the real control plane (kube-scheduler + the hami role + two simulated nodes): kubelet
(the emulator, as the real one) marks a plugin's devices unhealthy as soon as its socket goes
away, so the Node's ``status.allocatable`` drops to 0 for ``nvidia.com/gpu`` while
``capacity`` keeps the count, and the scheduler takes that as "unavailable" (protocol.md §2
"kubelet's word wins when it says no"). The handshake timeout here is 10 minutes: whatever
happens within seconds is kubelet's rule, not the handshake's.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import pytest_asyncio

from hami import log
from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, gpu_pod, limits, phase_of, poll
from hami.testkit.controlplane import ControlPlane

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

NODE_A, NODE_B = "agent-death-a", "agent-death-b"
NODES = (
    NodeSpec(NODE_A, ({"count": 2, "model": "NVIDIA-Tesla T4", "memory": 15360},)),
    NodeSpec(NODE_B, ({"count": 1, "model": "NVIDIA-Tesla V100-PCIE-32GB", "memory": 32768},)),
)
HANDSHAKE_TIMEOUT = 600.0
TIMING = Timing(handshake_timeout=HANDSHAKE_TIMEOUT)
RESOURCE = "nvidia.com/gpu"
KUBELET_SAYS_NO = f"kubelet reports 0 allocatable {RESOURCE}"
ON_A = {"kubernetes.io/hostname": NODE_A}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    log.configure("warning", "console", stream=sys.__stderr__)
    async with LocalCluster(NODES, plane=controlplane, timing=TIMING) as c:
        yield c


async def started(cluster: LocalCluster, pod: dict[str, Any]) -> dict[str, Any]:
    """Create the pod and wait until it runs (a Failed pod fails the test here)."""
    await cluster.create_pod(pod)
    got = await cluster.wait_pod(pod["metadata"]["name"], timeout=30)
    assert phase_of(got) == "Running", got.get("status")
    return got


async def filtering_failed(cluster: LocalCluster, name: str) -> str:
    """The message of the role's FilteringFailed event for the pod (waits for one)."""
    found: list[str] = []

    async def seen() -> bool:
        found[:] = [
            str(e.get("message", ""))
            for e in await cluster.events(name)
            if e.get("reason") == "FilteringFailed"
        ]
        return bool(found)

    await poll(seen, 20, f"FilteringFailed event of {name}")
    return found[-1]


def node_of(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName")


async def test_stopped_agent_node_takes_no_pods_within_seconds_and_takes_them_once_back(
    cluster: LocalCluster,
) -> None:
    assert cluster.role is not None
    node_a = cluster.nodes[NODE_A]
    replicas = node_a.spec.device_count * node_a.spec.split_count
    pod = await started(cluster, gpu_pod("before", [limits(1, mem=1000)], node_selector=ON_A))
    assert node_of(pod) == NODE_A

    await node_a.stop_agent()
    took = await cluster.wait_available([NODE_A], False, timeout=15)
    assert took < 5, took  # seconds, where the handshake would take 10 minutes
    assert cluster.available(NODE_B)
    status = (await cluster.kube.get_node(NODE_A))["status"]
    assert (status["capacity"][RESOURCE], status["allocatable"][RESOURCE]) == (str(replicas), "0")
    reasons = cluster.role.scheduler.explain_pod(gpu_pod("probe", [limits(1)]))
    assert reasons["nodes"][NODE_A].startswith(KUBELET_SAYS_NO), reasons

    # A pod only A could take stays Pending (no UnexpectedAdmissionError on a dead node) and
    # the filter says why; a pod that may go anywhere goes to B.
    await cluster.create_pod(gpu_pod("pinned", [limits(1, mem=1000)], node_selector=ON_A))
    assert KUBELET_SAYS_NO in await filtering_failed(cluster, "pinned")
    pod = await started(cluster, gpu_pod("elsewhere", [limits(1, mem=1000)]))
    assert node_of(pod) == NODE_B
    pinned = await cluster.get_pod("pinned")
    assert phase_of(pinned) == "Pending" and node_of(pinned) is None, pinned.get("status")

    # Back: kubelet has the new registration's devices, the pending pod and new ones land on A.
    registered = len(node_a.kubelet.registrations) if node_a.kubelet else 0
    await node_a.start_agent()
    assert node_a.kubelet is not None and len(node_a.kubelet.registrations) > registered
    await cluster.wait_available([NODE_A], True, timeout=15)
    pinned = await cluster.wait_pod("pinned", timeout=30)
    assert node_of(pinned) == NODE_A and phase_of(pinned) == "Running", pinned.get("status")
    pod = await started(cluster, gpu_pod("after", [limits(1, mem=1000)], node_selector=ON_A))
    assert node_of(pod) == NODE_A
