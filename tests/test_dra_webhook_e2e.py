"""Unchanged HAMi pods in the DRA mode, on the real control plane (issue 22 item 1).

A pod written for the extender mode (``nvidia.com/gpu``, ``gpumem``, ``gpumem-percentage``,
``gpucores``, ``nvidia.com/priority``, the type/uuid/numa annotations) is created as it is;
hami's webhook (the scheduler role's, with the test CA's certificate) turns it into a
claim, kube-scheduler allocates it alone against the agents' ResourceSlices, and the
kubelet emulator's DRA side prepares it: HAMi-core's limits in the CDI environment are the
pod's. Then both modes on one API server: one kube-scheduler, an extender-mode node and a
DRA-mode node, and the namespace label ``hami.io/device-mode`` choosing per pod.

    gpu-a100  4 x NVIDIA-A100-SXM4-40GB  40960 MiB
    gpu-t4    2 x NVIDIA-Tesla T4        15360 MiB
    gpu-l4    2 x NVIDIA-L4              23034 MiB, one on NUMA node 0, one on 1
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import pytest_asyncio

from hami.kube.raw import KubeError
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
from hami.testkit.dra_pods import templates_path
from hami.testkit.kubelet_dra import claim_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

A100, T4 = "gpu-a100", "gpu-t4"
A100_MODEL, T4_MODEL = "NVIDIA-A100-SXM4-40GB", "NVIDIA-Tesla T4"
NUMA, L4_MODEL = "gpu-l4", "NVIDIA-L4"
NODES = (
    NodeSpec(A100, ({"count": 4, "model": A100_MODEL, "memory": 40960},)),
    NodeSpec(T4, ({"count": 2, "model": T4_MODEL, "memory": 15360},)),
    # one L4 on each NUMA node: numa-bind can never have two of them
    NodeSpec(
        NUMA,
        (
            {"count": 1, "model": L4_MODEL, "memory": 23034, "numa": 0},
            {"count": 1, "model": L4_MODEL, "memory": 23034, "numa": 1},
        ),
    ),
)
TIMING = Timing(handshake_timeout=3.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(
        NODES, plane=controlplane, timing=TIMING, mode="dra", webhook=True
    ) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module")
async def dra(cluster: LocalCluster) -> AsyncIterator[LocalCluster]:
    yield cluster
    await cluster.delete_pods()


def hami_pod(
    cluster: LocalCluster,
    name: str,
    containers: list[dict[str, str]],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod exactly as the extender mode's tests write it (plus the test webhook's label)."""
    pod = gpu_pod(name, containers, annotations=annotations)
    pod["metadata"]["labels"] = dict(cluster.node_selector)
    return pod


async def run(
    cluster: LocalCluster, pod: dict[str, Any], namespace: str | None = None
) -> dict[str, Any]:
    await cluster.create_pod(pod, namespace)
    name = pod["metadata"]["name"]
    running = await cluster.wait_pod(name, timeout=60, namespace=namespace)
    assert phase_of(running) == "Running", running.get("status")
    return running


async def the_claim(
    cluster: LocalCluster, pod: Mapping[str, Any], namespace: str | None = None
) -> dict[str, Any]:
    (status,) = pod["status"]["resourceClaimStatuses"]
    assert status["name"] == "hami"
    path = claim_path(namespace or cluster.namespace, status["resourceClaimName"])
    claim: dict[str, Any] = await cluster.kube.request("GET", path)
    return claim


def results_of(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(claim["status"]["allocation"]["devices"]["results"])


def uuid_of(cluster: LocalCluster, node: str, device: str) -> str:
    return cluster.nodes[node].uuids[int(device.rsplit("-", 1)[1])]


async def test_unchanged_pod_gets_a_claim_and_hami_core_limits(dra: LocalCluster) -> None:
    assert dra.kube_scheduler is not None
    assert "extenders" not in dra.kube_scheduler.config  # kube-scheduler allocates alone
    pod = await run(dra, hami_pod(dra, "plain", [limits(1, mem=2000, cores=30)]))
    # what the webhook did to the pod
    container = pod["spec"]["containers"][0]
    assert not any(k.startswith("nvidia.com/") for k in container["resources"].get("limits", {}))
    assert container["resources"]["claims"] == [{"name": "hami", "request": "c0"}]
    (ref,) = pod["spec"]["resourceClaims"]
    template = await dra.kube.request(
        "GET", f"{templates_path(dra.namespace)}/{ref['resourceClaimTemplateName']}"
    )
    assert template["metadata"]["labels"]["hami.io/generated-by"] == "webhook"
    # kube-scheduler's allocation and the claim owned by the pod
    claim = await the_claim(dra, pod)
    assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    (result,) = results_of(claim)
    assert result["driver"] == "nvidia.hami.io"
    assert result["consumedCapacity"]["memory"] == "2000Mi"
    assert result["consumedCapacity"]["cores"] == "30"
    # the kubelet emulator's prepare: HAMi-core's limits from the CDI spec
    env = (await dra.admission(pod)).envs["c0"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    node = pod["spec"]["nodeName"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid_of(dra, node, result["device"])


async def test_selectors_percentage_priority_and_count(dra: LocalCluster) -> None:
    t4 = await run(
        dra,
        hami_pod(
            dra,
            "half-t4",
            [{**limits(1, pct=50, cores=20), "nvidia.com/priority": "1"}],
            annotations={"nvidia.com/use-gputype": "t4"},  # any case, as the extender reads it
        ),
    )
    assert t4["spec"]["nodeName"] == T4
    (result,) = results_of(await the_claim(dra, t4))
    assert result["consumedCapacity"]["memory"] == "7680Mi"  # 50 % of a T4
    env = (await dra.admission(t4)).envs["c0"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "7680m"
    assert {"name": "CUDA_TASK_PRIORITY", "value": "1"} in t4["spec"]["containers"][0]["env"]
    # the third A100 only, by uuid; T4s refused by type
    wanted = dra.nodes[A100].uuids[2]
    by_uuid = await run(
        dra,
        hami_pod(
            dra,
            "by-uuid",
            [limits(1, mem=1000)],
            annotations={"nvidia.com/use-gpuuuid": wanted, "nvidia.com/nouse-gputype": "T4"},
        ),
    )
    (result,) = results_of(await the_claim(dra, by_uuid))
    assert uuid_of(dra, by_uuid["spec"]["nodeName"], result["device"]) == wanted
    # two devices, distinct, on one NUMA node; the whole device when no memory is named
    two = await run(
        dra,
        hami_pod(
            dra,
            "two",
            [limits(2)],
            annotations={"nvidia.com/numa-bind": "true", "nvidia.com/nouse-gputype": "L4"},
        ),
    )
    results = results_of(await the_claim(dra, two))
    assert len({r["device"] for r in results}) == 2
    env = (await dra.admission(two)).envs["c0"]
    assert env["CUDA_DEVICE_SM_LIMIT"] == "100"
    assert len(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2


async def test_invalid_requests_are_refused_at_admission(dra: LocalCluster) -> None:
    cases = [
        ([limits(1, cores=101)], {}, "pod .*/bad-0 container 'c0': nvidia.com/gpucores"),
        (
            [limits(1)],
            {"nvidia.com/use-gputype": 'A100")||true||("'},
            "annotation nvidia.com/use-gputype",
        ),
        ([limits(1)], {"nvidia.com/vgpu-mode": "mig"}, "vgpu-mode 'mig'"),
    ]
    for i, (containers, written, message) in enumerate(cases):
        with pytest.raises(KubeError) as caught:
            await dra.create_pod(hami_pod(dra, f"bad-{i}", containers, written))
        assert caught.value.status in (400, 403)
        assert "bad-" in caught.value.message
        assert re.search(message, caught.value.message), caught.value
    assert not [p for p in await dra.list_pods() if p["metadata"]["name"].startswith("bad-")]


async def test_a_dry_run_creates_no_template(dra: LocalCluster) -> None:
    before, _ = await dra.kube.list_all(templates_path(dra.namespace))
    body = hami_pod(dra, "dry", [limits(1, mem=1234)])
    body["spec"]["nodeSelector"] = dict(dra.node_selector)
    answer = await dra.kube.request(
        "POST", f"/api/v1/namespaces/{dra.namespace}/pods", body=body, query=[("dryRun", "All")]
    )
    assert answer["spec"]["resourceClaims"][0]["name"] == "hami"
    after, _ = await dra.kube.list_all(templates_path(dra.namespace))
    assert len(after) == len(before)


async def test_numa_bind_keeps_a_containers_devices_on_one_numa_node(dra: LocalCluster) -> None:
    """Two L4s exist, one per NUMA node: with numa-bind the pod cannot have both and stays
    Pending (kube-scheduler's matchAttribute on the numa attribute), without it it runs."""
    only_l4 = {"nvidia.com/use-gputype": "L4"}
    bound = hami_pod(
        dra, "numa-bound", [limits(2, mem=1000)], {**only_l4, "nvidia.com/numa-bind": "true"}
    )
    await dra.create_pod(bound)
    free = await run(dra, hami_pod(dra, "numa-free", [limits(2, mem=1000)], only_l4))
    assert free["spec"]["nodeName"] == NUMA
    assert len({r["device"] for r in results_of(await the_claim(dra, free))}) == 2
    waiting = await dra.get_pod("numa-bound")
    assert phase_of(waiting) == "Pending"
    assert not waiting["spec"].get("nodeName")
    # the claim kube-scheduler could not allocate carries the constraint
    (status,) = waiting["status"].get("resourceClaimStatuses") or [None]
    assert status is not None
    claim = await dra.kube.request("GET", claim_path(dra.namespace, status["resourceClaimName"]))
    assert {"requests": ["c0"], "matchAttribute": "nvidia.hami.io/numa"} in claim["spec"][
        "devices"
    ]["constraints"]
    assert not (claim.get("status") or {}).get("allocation")

    async def refused() -> bool:
        messages = [e.get("message") or "" for e in await dra.events("numa-bound")]
        return any("cannot allocate all claims" in m for m in messages)

    await poll(refused, 30, "kube-scheduler's FailedScheduling for numa-bound")
