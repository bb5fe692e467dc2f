"""A MIG GPU that falls ill in the DRA mode, on the real control plane: the NVIDIA backend
over the fake NVML (an A100 40GB in MIG mode, Xid events watched) sees a critical Xid, every
partition of the GPU is published with the ``hami.io/unhealthy`` taint (the pool stays),
kube-scheduler gives no new claim a partition, and the claim already on an instance keeps
it and its pod keeps running (docs/dra.md "Device health")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import pytest_asyncio
from _nvml_helpers import FakeNvml
from test_dra_mig_e2e import mig_cluster, profile_template

from hami.testkit.cluster import LocalCluster, phase_of, poll
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import dra_pod
from hami.testkit.kubelet_dra import claim_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

NODE = "gpu-mig-sick"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sick(controlplane: ControlPlane) -> AsyncIterator[tuple[LocalCluster, FakeNvml]]:
    # the backend with its Xid watch on (health_checks)
    async with mig_cluster(controlplane, NODE, health_checks=True) as found:
        yield found


async def allocated_device(cluster: LocalCluster, pod: Mapping[str, Any]) -> str:
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = await cluster.kube.request(
        "GET", claim_path(cluster.namespace, status["resourceClaimName"])
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == NODE
    return str(result["device"])


async def partition_taints(cluster: LocalCluster) -> dict[str, list[tuple[str, str, str]]]:
    """Partition name -> its taints, from every slice of the node's pool."""
    items, _ = await cluster.kube.list_all(
        SLICES, query=[("fieldSelector", f"spec.nodeName={NODE}")]
    )
    return {
        d["name"]: [(t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints") or []]
        for s in items
        for d in s["spec"].get("devices") or []
    }


async def test_a_sick_mig_gpu_is_tainted_and_takes_no_new_claim(
    sick: tuple[LocalCluster, FakeNvml],
) -> None:
    cluster, nvml = sick
    template = await profile_template(cluster, "1g.5gb")
    await cluster.create_pod(dra_pod("before", [template]))
    before = await cluster.wait_pod("before", timeout=60)
    assert phase_of(before) == "Running", before.get("status")
    device = await allocated_device(cluster, before)
    assert not any((await partition_taints(cluster)).values())

    nvml.push_xid(79, 0)  # fell off the bus: critical

    async def tainted() -> bool:
        found = await partition_taints(cluster)
        return bool(found) and all(found.values())

    await poll(tainted, 30, "every partition of the sick GPU tainted")
    now = await partition_taints(cluster)
    assert len(now) == 7 + 3 + 2 + 1 + 1  # the pool stayed whole
    assert {tuple(t) for t in now.values()} == {(("hami.io/unhealthy", "xid-79", "NoSchedule"),)}

    # a new claim finds no partition it may take
    await cluster.create_pod(dra_pod("after", [template]))

    async def unschedulable() -> bool:
        for event in await cluster.events("after"):
            if event.get("reason") == "FailedScheduling":
                return "cannot allocate all claims" in str(event.get("message"))
        return False

    await poll(unschedulable, 60, "kube-scheduler says the claim cannot be allocated")
    pod = await cluster.get_pod("after")
    assert phase_of(pod) == "Pending" and not pod["spec"].get("nodeName")
    # NoSchedule: the claim already on an instance keeps it, and its pod runs on
    running = await cluster.get_pod("before")
    assert phase_of(running) == "Running"
    assert await allocated_device(cluster, running) == device
    assert len(nvml.live(0)) == 1
    await cluster.delete_pods()
