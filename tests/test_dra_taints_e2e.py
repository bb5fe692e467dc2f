"""Device health as DRA device taints on the real control plane (issue 22 item 3): a
critical Xid on a fake device (judged as the NVIDIA backend judges one) taints it in the
agent's ResourceSlice; kube-scheduler 1.36 (no flags: DRADeviceTaints is beta and on)
gives it no new claim, uses the other device while that has room, leaves a claim that
only the tainted device could hold Pending, and ``hami explain`` says the device is
tainted and why. When the device is healthy again the taint goes and the pending claim is
allocated on it. A claim already running on the device keeps its allocation throughout.

    tx-a100  2 x NVIDIA-A100-SXM4-40GB  40960 MiB
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import pytest_asyncio

from hami.backends.fake import FakeBackend
from hami.dra.names import slice_name
from hami.scheduler import draexplain
from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, phase_of, poll
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import claim_template, dra_pod, templates_path
from hami.testkit.kubelet_dra import claim_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

NODE = "tx-a100"
NODES = (NodeSpec(NODE, ({"count": 2, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},)),)
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(
        NODES, plane=controlplane, timing=Timing(handshake_timeout=3.0), mode="dra"
    ) as c:
        yield c


async def device_taints(cluster: LocalCluster) -> dict[str, list[tuple[str, str, str]]]:
    """device name -> its taints (key, value, effect) in the agent's slice."""
    item = await cluster.kube.request("GET", f"{SLICES}/{slice_name(NODE, 'nvidia')}")
    return {
        d["name"]: [(t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints") or []]
        for d in item["spec"]["devices"]
    }


async def allocated_device(cluster: LocalCluster, pod: Mapping[str, Any]) -> str:
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = await cluster.kube.request(
        "GET", claim_path(cluster.namespace, status["resourceClaimName"])
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


async def failed_scheduling(cluster: LocalCluster, name: str) -> str:
    found: dict[str, str] = {}

    async def seen() -> bool:
        for event in await cluster.events(name):
            if event.get("reason") == "FailedScheduling":
                found["message"] = str(event.get("message") or "")
        return bool(found)

    await poll(seen, 60, f"FailedScheduling for {name}")
    return found["message"]


async def running(cluster: LocalCluster, name: str) -> dict[str, Any]:
    pod = await cluster.wait_pod(name, timeout=60)
    assert phase_of(pod) == "Running", pod.get("status")
    return pod


def on_device(name: str, uuid: str, mem: int) -> dict[str, Any]:
    """A template whose claim can only take the device ``uuid`` (CEL on its attribute)."""
    body = claim_template(name, mem=mem)
    exact = body["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    cel = f'device.attributes["nvidia.hami.io"].uuid == "{uuid}"'
    exact["selectors"] = [*exact.get("selectors", []), {"cel": {"expression": cel}}]
    return body


async def test_a_tainted_device_takes_no_new_claim_until_it_recovers(
    cluster: LocalCluster,
) -> None:
    node = cluster.nodes[NODE]
    backend = node.backend
    assert isinstance(backend, FakeBackend)
    sick_uuid, well_uuid = node.uuids
    for body in (on_device("early", sick_uuid, 5000), claim_template("big", mem=30000)):
        await cluster.kube.create(templates_path(cluster.namespace), body)

    # a claim running on nvidia-0 before it falls ill
    await cluster.create_pod(dra_pod("early", ["early"]))
    early = await running(cluster, "early")
    assert await allocated_device(cluster, early) == "nvidia-0"

    # an application Xid (43: GPU stopped processing) leaves it healthy, as in the
    # extender mode; a critical one (79: fell off the bus) taints it
    assert not backend.inject_xid(sick_uuid, 43)
    assert backend.inject_xid(sick_uuid, 79)

    async def tainted() -> bool:
        return bool((await device_taints(cluster))["nvidia-0"])

    await poll(tainted, 30, "the Xid 79 taint in the slice")
    assert await device_taints(cluster) == {
        "nvidia-0": [("hami.io/unhealthy", "xid-79", "NoSchedule")],
        "nvidia-1": [],
    }

    # another device is used while it has room, though the tainted one has more free
    # (35960 MiB against 40960)
    await cluster.create_pod(dra_pod("elsewhere", ["big"]))
    assert await allocated_device(cluster, await running(cluster, "elsewhere")) == "nvidia-1"

    # only the tainted device has 30000 MiB left now: the claim waits
    await cluster.create_pod(dra_pod("waits", ["big"]))
    message = await failed_scheduling(cluster, "waits")
    assert "cannot allocate all claims" in message
    pod = await cluster.get_pod("waits")
    assert phase_of(pod) == "Pending" and not pod["spec"].get("nodeName")

    async def claim_made() -> bool:
        p = await cluster.get_pod("waits")
        return bool((p.get("status") or {}).get("resourceClaimStatuses"))

    await poll(claim_made, 30, "the waiting pod's claim")
    answer = await draexplain.explain(cluster.kube, await cluster.get_pod("waits"))
    assert answer is not None and answer["error"] == "", answer
    label = answer["requests"][0]
    details = answer["details"][NODE]
    assert (
        f"{sick_uuid} has the taint hami.io/unhealthy=xid-79:NoSchedule (hami found it "
        f"unhealthy: critical Xid 79), which {label} does not tolerate"
    ) in details, details
    assert f"{well_uuid} has 10960 MiB free, {label} asks 30000 MiB" in details, details

    # NoSchedule: the claim that already ran there keeps its device
    assert phase_of(await cluster.get_pod("early")) == "Running"
    assert await allocated_device(cluster, await cluster.get_pod("early")) == "nvidia-0"

    # recovery: healthy again, the taint goes and the waiting claim lands on the device
    backend.set_health(sick_uuid, True)

    async def untainted() -> bool:
        return not any((await device_taints(cluster)).values())

    await poll(untainted, 30, "the taint removed")
    waited = await running(cluster, "waits")
    assert await allocated_device(cluster, waited) == "nvidia-0"
