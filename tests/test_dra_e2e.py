"""DRA mode end to end on the real control plane (issue 14): kube-scheduler alone (default
plugins, no extender) allocates ResourceClaims against the ResourceSlices that hami node
agents publish (fake backend, ``mode: dra``); kube-controller-manager's resourceclaim
controller makes claims from templates and deallocates them; the kubelet emulators prepare
claims through the agents' DRA plugins and record the CDI environment.

The cluster (split count 10 everywhere):

    gpu-a100  4 x NVIDIA-A100-SXM4-40GB  40960 MiB
    gpu-t4    2 x NVIDIA-Tesla T4        15360 MiB
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from hami.kube.raw import KubeError
from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, gpu_pod, limits, phase_of, poll
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import claim_template, claims_path, dra_pod, templates_path
from hami.testkit.kubelet_dra import claim_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

A100, T4 = "gpu-a100", "gpu-t4"
A100_MODEL, T4_MODEL = "NVIDIA-A100-SXM4-40GB", "NVIDIA-Tesla T4"
NODES = (
    NodeSpec(A100, ({"count": 4, "model": A100_MODEL, "memory": 40960},)),
    NodeSpec(T4, ({"count": 2, "model": T4_MODEL, "memory": 15360},)),
)
CAPACITY = {A100: (40960, 4), T4: (15360, 2)}  # MiB per device, devices
SPLIT = 10


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(
        NODES, plane=controlplane, timing=Timing(handshake_timeout=3.0), mode="dra"
    ) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module")
async def dra(cluster: LocalCluster) -> AsyncIterator[LocalCluster]:
    yield cluster
    await cluster.delete_pods()
    await wait_claims_freed(cluster)


async def wait_claims_freed(cluster: LocalCluster, timeout: float = 60.0) -> None:  # noqa: ASYNC109
    async def freed() -> bool:
        items, _ = await cluster.kube.list_all(claims_path(cluster.namespace))
        return not any((c.get("status") or {}).get("allocation") for c in items)

    await poll(freed, timeout, "claims deallocated")


async def template(
    cluster: LocalCluster, name: str, body: dict[str, Any] | None = None, **kwargs: Any
) -> None:
    try:
        await cluster.kube.create(
            templates_path(cluster.namespace), body or claim_template(name, **kwargs)
        )
    except KubeError as exc:
        if exc.status != 409:  # the same template from an earlier test
            raise


async def run_pod(cluster: LocalCluster, name: str, templates: list[str]) -> dict[str, Any]:
    await cluster.create_pod(dra_pod(name, templates))
    pod = await cluster.wait_pod(name, timeout=60)
    assert phase_of(pod) == "Running", pod.get("status")
    return pod


async def pod_claims(cluster: LocalCluster, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for s in pod["status"].get("resourceClaimStatuses") or []:
        out.append(
            await cluster.kube.request("GET", claim_path(cluster.namespace, s["resourceClaimName"]))
        )
    return out


def uuid_of(cluster: LocalCluster, node: str, device: str) -> str:
    index = int(device.rsplit("-", 1)[1])
    return cluster.nodes[node].uuids[index]


async def test_claim_placed_by_kube_scheduler_alone_with_hami_core_limits(
    dra: LocalCluster,
) -> None:
    assert dra.kube_scheduler is not None
    assert "extenders" not in dra.kube_scheduler.config  # no hami in the scheduling path
    assert dra.role is None
    await template(dra, "mem3000", mem=3000)
    pod = await run_pod(dra, "p3000", ["mem3000"])
    node = pod["spec"]["nodeName"]
    (claim,) = await pod_claims(dra, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == "nvidia.hami.io"
    assert result["pool"] == node
    assert result["consumedCapacity"]["memory"] == "3000Mi"
    adm = await dra.admission(pod)
    env = adm.envs["c0"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid_of(dra, node, result["device"])
    assert "CUDA_DEVICE_MEMORY_LIMIT_1" not in env


async def test_cores_and_model_selector(dra: LocalCluster) -> None:
    await template(dra, "t4-30", mem=2000, cores=30, model=T4_MODEL)
    pod = await run_pod(dra, "pt4", ["t4-30"])
    assert pod["spec"]["nodeName"] == T4  # only the T4 node has a matching device
    (claim,) = await pod_claims(dra, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"]["cores"] == "30"
    env = (await dra.admission(pod)).envs["c0"]
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"


async def selector_template(cluster: LocalCluster, name: str, expression: str) -> None:
    body = claim_template(name, mem=1000)
    (request,) = body["spec"]["spec"]["devices"]["requests"]
    request["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    await template(cluster, name, body=body)


async def test_cel_on_the_published_details(dra: LocalCluster) -> None:
    """The details attributes (issue 22 item 5) select devices in kube-scheduler's CEL: a
    compute capability of at least 8.0 (a version compared as SemVer) only the A100s have,
    an architecture only the T4s have, and the PCIe root as Kubernetes' standard name."""
    attrs = 'device.attributes["nvidia.hami.io"]'
    await selector_template(
        dra, "cc80", f'{attrs}.computeCapability.isGreaterThan(semver("7.9.0"))'
    )
    await selector_template(dra, "turing", f'{attrs}.architecture == "Turing"')
    await selector_template(
        dra,
        "cuda12-root0",
        f'{attrs}.cudaDriverVersion.major() == 12 && {attrs}.driverVersion == semver("550.54.15")'
        ' && device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"',
    )
    placed = {}
    for name in ("cc80", "turing", "cuda12-root0"):
        pod = await run_pod(dra, f"p-{name}", [name])
        (claim,) = await pod_claims(dra, pod)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        placed[name] = result["pool"]
    assert placed["cc80"] == A100
    assert placed["turing"] == T4
    assert placed["cuda12-root0"] in {A100, T4}
    # no device matches: the claim is not allocated and the pod stays Pending
    await selector_template(dra, "blackwell", f'{attrs}.architecture == "Blackwell"')
    await dra.create_pod(dra_pod("p-blackwell", ["blackwell"]))
    await asyncio.sleep(3)
    (pending,) = [p for p in await dra.list_pods() if p["metadata"]["name"] == "p-blackwell"]
    assert phase_of(pending) == "Pending"
    assert not pending["spec"].get("nodeName")


async def test_two_devices_of_8000(dra: LocalCluster) -> None:
    await template(dra, "two8000", count=2, mem=8000)
    pod = await run_pod(dra, "ptwo", ["two8000"])
    node = pod["spec"]["nodeName"]
    (claim,) = await pod_claims(dra, pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len({r["device"] for r in results}) == 2
    env = (await dra.admission(pod)).envs["c0"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "8000m"
    visible = set(env["NVIDIA_VISIBLE_DEVICES"].split(","))
    assert visible == {uuid_of(dra, node, r["device"]) for r in results}


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


async def consumed(cluster: LocalCluster) -> dict[tuple[str, str], list[int]]:
    """(pool, device) -> [allocations, MiB, cores] summed over the allocated claims."""
    items, _ = await cluster.kube.list_all(claims_path(cluster.namespace))
    total: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for c in items:
        allocation = (c.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or []:
            t = total[(r["pool"], r["device"])]
            cap = r.get("consumedCapacity") or {}
            t[0] += 1
            t[1] += _mib(cap.get("memory", "0Mi"))
            t[2] += int(cap.get("cores", "0"))
    return dict(total)


def assert_within(per_device: Mapping[tuple[str, str], list[int]], what: str) -> None:
    for (node, device), (slots, memory, cores) in per_device.items():
        total_memory, count = CAPACITY[node]
        assert int(device.rsplit("-", 1)[1]) < count, f"{what}: {node}/{device} unknown"
        assert slots <= SPLIT, f"{what}: {node}/{device} holds {slots} > {SPLIT} claims"
        assert memory <= total_memory, f"{what}: {node}/{device} {memory} > {total_memory} MiB"
        assert cores <= 100, f"{what}: {node}/{device} {cores} > 100 cores"


async def test_burst_of_200_pods_overcommits_nothing(dra: LocalCluster) -> None:
    # 200 pods of 7000 MiB: an A100 holds 5, a T4 2; 4*5 + 2*2 = 24 fit, the rest wait
    await template(dra, "mem7000", mem=7000)
    names = [f"burst-{i:03d}" for i in range(200)]
    await asyncio.gather(*(dra.create_pod(dra_pod(n, ["mem7000"])) for n in names))

    async def settled() -> bool:
        running = [p for p in await dra.list_pods() if phase_of(p) == "Running"]
        return len(running) >= 24

    await poll(settled, 120, "24 burst pods running")
    per_device = await consumed(dra)
    assert_within(per_device, "claims' allocations")
    assert sum(v[0] for v in per_device.values()) == 24
    # what prepare gave the containers, independently of the claims
    given: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for node in dra.nodes.values():
        assert node.kubelet is not None
        for adm in node.kubelet.admissions.values():
            if adm.phase != "Running" or adm.deleted or not adm.name.startswith("burst-"):
                continue
            env = adm.envs["c0"]
            g = given[env["NVIDIA_VISIBLE_DEVICES"]]
            g[0] += 1
            g[1] += int(env["CUDA_DEVICE_MEMORY_LIMIT_0"].rstrip("m"))
    assert sum(g[0] for g in given.values()) == 24
    for uuid_, (count, memory) in given.items():
        node = next(n for n in dra.nodes.values() if uuid_ in n.uuids)
        assert count <= SPLIT and memory <= CAPACITY[node.name][0], (uuid_, count, memory)
    # no pod beyond capacity started later on
    pending = [p for p in await dra.list_pods() if phase_of(p) == "Pending"]
    assert len(pending) == 176


async def test_deleting_pods_frees_capacity(dra: LocalCluster) -> None:
    # four 30000 MiB pods fill the A100s; a fifth waits until one is deleted
    await template(dra, "mem30000", mem=30000)
    for i in range(4):
        await run_pod(dra, f"big-{i}", ["mem30000"])
    await dra.create_pod(dra_pod("big-4", ["mem30000"]))

    async def unschedulable() -> bool:
        pod = await dra.get_pod("big-4")
        return any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for c in (pod.get("status") or {}).get("conditions") or []
        )

    await poll(unschedulable, 30, "big-4 unschedulable")
    await dra.delete_pod("big-0")
    pod = await dra.wait_pod("big-4", timeout=60)
    assert phase_of(pod) == "Running"
    assert pod["spec"]["nodeName"] == A100


async def test_agent_restart_keeps_prepared_claims(dra: LocalCluster) -> None:
    await template(dra, "mem3000", mem=3000)
    pod = await run_pod(dra, "keep", ["mem3000"])
    node = dra.nodes[pod["spec"]["nodeName"]]
    assert node.kubelet is not None
    before = (await dra.admission(pod)).envs["c0"]
    await node.stop_agent()
    # kubelet's plugin watcher must see the old registration go first: otherwise waiting
    # for the driver returns at once and a prepare races the new registration
    kubelet_dra = node.kubelet.dra
    assert kubelet_dra is not None
    await node.kubelet.wait_for(lambda: "nvidia.hami.io" not in kubelet_dra.plugins, 30)
    await node.start_agent()
    # kubelet calls prepare again after a restart (idempotent), and unprepare when the pod
    # goes; the restarted agent still knows the claim
    (claim,) = await pod_claims(dra, pod)
    uid = claim["metadata"]["uid"]
    assert node.agent is not None
    checkpoint = node.agent.dra["fake"][0].service.checkpoint
    assert uid in checkpoint.claims  # the new agent read the old one's checkpoint
    kubelet = node.kubelet
    client = kubelet.dra
    assert client is not None
    prepared = client.prepared.pop(uid)
    again = await client.prepare(dra.kube, await dra.get_pod("keep"))
    assert client.prepared[uid].devices == prepared.devices
    assert dict(e.split("=", 1) for e in again["c0"]) == before
    await dra.delete_pod("keep")
    await kubelet.wait_for(lambda: any(uid in uids for _, uids in client.unprepare_calls))
    cdi = dra.nodes[node.name].cfg.node.dra.cdi_dir
    await poll(
        lambda: (
            uid not in checkpoint.claims and not any(uid in p.name for p in Path(cdi).iterdir())
        ),
        30,
        "CDI spec and checkpoint entry removed",
    )


async def test_plain_gpu_count_pod_works_unchanged(dra: LocalCluster) -> None:
    # the DeviceClass maps nvidia.com/gpu (DRAExtendedResource): no claim in the pod spec
    await dra.map_extended_resource("nvidia.com/gpu")
    try:
        await _plain_gpu_pod(dra)
    finally:
        await dra.map_extended_resource(None)


async def _plain_gpu_pod(dra: LocalCluster) -> None:
    pod = gpu_pod("plain", [limits(1)])
    await dra.create_pod(pod)
    running = await dra.wait_pod("plain", timeout=60)
    assert phase_of(running) == "Running", running.get("status")
    status = running["status"]["extendedResourceClaimStatus"]
    (mapping,) = status["requestMappings"]
    assert mapping["containerName"] == "c0" and mapping["resourceName"] == "nvidia.com/gpu"
    claim = await dra.kube.request("GET", claim_path(dra.namespace, status["resourceClaimName"]))
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    node = running["spec"]["nodeName"]
    total, _ = CAPACITY[node]
    assert result["consumedCapacity"]["memory"] in (f"{total}Mi", f"{total // 1024}Gi")
    env = (await dra.admission(running)).envs["c0"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid_of(dra, node, result["device"])
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{total}m"  # a whole device, as HAMi gives
