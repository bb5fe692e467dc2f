"""Unchanged HAMi pods next to a MIG GPU in the DRA mode, on the real control plane: the
webhook's claims ask a HAMi-core share, so they keep off MIG partitions (kube-scheduler
would otherwise give a 20000 MiB request a whole 7g instance, with no HAMi-core limit in
it). A pod that fits a T4 lands there with its limits; one that fits only a partition
stays Pending and no instance is made.

    gpu-t4   1 x NVIDIA-Tesla T4  15360 MiB (fake backend, HAMi-core)
    gpu-mig  1 x A100 40GB in MIG mode (NVIDIA backend over the fake NVML)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from _nvml_helpers import FakeGpu, FakeNvml
from test_dra_mig_e2e import GPU, mig_backend

from hami.testkit.cluster import (
    LocalCluster,
    NodeSpec,
    Timing,
    gpu_pod,
    limits,
    phase_of,
    poll,
)
from hami.testkit.controlplane import ControlPlane

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

MIG_NODE, T4 = "gpu-mig", "gpu-t4"
NODES = (
    NodeSpec(MIG_NODE, ({"count": 1, "model": "unused", "memory": 1},)),
    NodeSpec(T4, ({"count": 1, "model": "NVIDIA-Tesla T4", "memory": 15360},)),
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def both(controlplane: ControlPlane) -> AsyncIterator[tuple[LocalCluster, FakeNvml]]:
    cluster = LocalCluster(
        NODES, plane=controlplane, timing=Timing(handshake_timeout=3.0), mode="dra", webhook=True
    )
    nvml = FakeNvml(
        [FakeGpu(0, GPU, "NVIDIA A100-SXM4-40GB", 40 << 30, "00000000:07:00.0", mig_mode=1)]
    )
    node = cluster.nodes[MIG_NODE]
    node.backend = mig_backend(nvml, node.dir)
    async with cluster:
        yield cluster, nvml


def hami_pod(cluster: LocalCluster, name: str, mem: int) -> dict[str, Any]:
    pod = gpu_pod(name, [limits(1, mem=mem)], annotations={"nvidia.com/vgpu-mode": "hami-core"})
    pod["metadata"]["labels"] = dict(cluster.node_selector)  # the test webhook's selector
    return pod


async def test_webhook_claims_keep_off_mig_partitions(
    both: tuple[LocalCluster, FakeNvml],
) -> None:
    cluster, nvml = both
    await cluster.create_pod(hami_pod(cluster, "fits-t4", 3000))
    pod = await cluster.wait_pod("fits-t4", timeout=60)
    assert phase_of(pod) == "Running" and pod["spec"]["nodeName"] == T4
    env = (await cluster.admission(pod)).envs["c0"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"

    # 20000 MiB: more than the T4 has; only MIG partitions (3g.20gb, 4g, 7g) are that big
    await cluster.create_pod(hami_pod(cluster, "too-big-for-t4", 20000))

    async def unschedulable() -> bool:
        for event in await cluster.events("too-big-for-t4"):
            if event.get("reason") == "FailedScheduling":
                return "cannot allocate all claims" in str(event.get("message"))
        return False

    await poll(unschedulable, 60, "kube-scheduler says the claim cannot be allocated")
    waiting = await cluster.get_pod("too-big-for-t4")
    assert phase_of(waiting) == "Pending" and not waiting["spec"].get("nodeName")
    assert nvml.live(0) == {}  # no MIG instance was made for a HAMi-core pod
    await cluster.delete_pods()
